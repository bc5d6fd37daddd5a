"""``kinetoscope redact DIR``: a directory without traces is a one-line error, not an internal one."""

from __future__ import annotations

from kinetoscope import cli


def test_a_directory_without_traces_is_a_usage_error(tmp_path, capsys):
    src = tmp_path / "notes"
    src.mkdir()
    (src / "readme.txt").write_text("no trace here\n")
    assert cli.main(["redact", str(src), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"kinetoscope: error: {src}: directory holds no trace or sidecar (.json, .json.gz) files\n"
    assert not (tmp_path / "out").exists()
