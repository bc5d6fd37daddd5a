"""What the trace-source resolver makes of what a user types (no store is asked: kinetoscope/sources.py)."""

from __future__ import annotations

from pathlib import Path

from kinetoscope.app.launch import given_paths
from kinetoscope.sources import RemotePath, is_url, redact_url, scrub, trace_path


def test_local_paths_and_file_urls_are_paths():
    assert trace_path("runs/job-1") == Path("runs/job-1")
    assert trace_path("file:///data/my%20runs/job-1") == Path("/data/my runs/job-1")
    assert not is_url("file:///data/x") and not is_url("/data/x") and is_url("s3://b/x")


def test_urls_are_remote_paths_without_their_secrets():
    p = trace_path("s3://AKIAEXAMPLE:hunter2@bucket/team-a/job-42/?X-Amz-Signature=abc")
    assert isinstance(p, RemotePath) and p.protocol == "s3"
    assert str(p) == "s3://bucket/team-a/job-42" and "hunter2" not in repr(p)
    assert p.name == "job-42" and str(p.parent) == "s3://bucket/team-a"
    assert str(p / "rank-0.json.gz") == "s3://bucket/team-a/job-42/rank-0.json.gz"
    assert str((p / "rank-0.json.gz").with_name("rank-0.manifest.json")) == "s3://bucket/team-a/job-42/rank-0.manifest.json"
    assert trace_path("gs://b/x") == RemotePath("gs://b/x") and trace_path("az://c/x").protocol == "az"


def test_redaction_of_urls_alone_and_inside_text():
    assert redact_url("https://user:pw@host:9000/p/q?token=t#f") == "https://host:9000/p/q"
    assert redact_url("/plain/path?x") == "/plain/path?x"
    assert scrub("GET s3://k:s@b/key?X-Amz-Credential=AKIA1 failed (see https://u:p@h/x)") == (
        "GET s3://b/key failed (see https://h/x)")


def test_azure_urls_that_name_their_account_keep_the_container():
    """``abfss://container@account.dfs.core.windows.net/path``: the user part is the container, not a secret; the
    store is asked for ``container/path`` in that account."""
    p = trace_path("abfss://runs@myacct.dfs.core.windows.net/team-a/job-42/?sv=2024&sig=SECRET")
    assert isinstance(p, RemotePath) and str(p) == "abfss://runs@myacct.dfs.core.windows.net/team-a/job-42"
    assert p.name == "job-42" and str(p.parent) == "abfss://runs@myacct.dfs.core.windows.net/team-a"
    assert str(p.parent.parent) == "abfss://runs@myacct.dfs.core.windows.net"
    assert str(p / "r.json") == "abfss://runs@myacct.dfs.core.windows.net/team-a/job-42/r.json"
    assert p._at("runs/team-b") == trace_path("abfss://runs@myacct.dfs.core.windows.net/team-b")  # a listed key
    assert p._key == "runs/team-a/job-42"
    # a password, another scheme or another host: user info is a credential, dropped as ever
    assert str(trace_path("az://runs:KEY@myacct.blob.core.windows.net/x")) == "az://myacct.blob.core.windows.net/x"
    assert str(trace_path("s3://AKIA@bucket/x")) == "s3://bucket/x"
    assert str(trace_path("az://user@evil.example.com/x")) == "az://evil.example.com/x"
    assert redact_url("az://runs@myacct.blob.core.windows.net/x?sig=S") == "az://runs@myacct.blob.core.windows.net/x"
    assert scrub("az://runs@myacct.blob.core.windows.net/x and az://c:KEY@myacct.blob.core.windows.net/y?sig=S") == (
        "az://runs@myacct.blob.core.windows.net/x and az://myacct.blob.core.windows.net/y")


def test_given_paths_keep_a_url_whole():
    assert given_paths("s3://b/store:/tmp/x:file:///a/b") == ["s3://b/store", "/tmp/x", "file:///a/b"]
    assert given_paths("") == []
