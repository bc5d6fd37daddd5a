"""The capture's reading of the memory a process may use (kinetoscope/capture/hostmem.py)."""

from __future__ import annotations

import pytest

from kinetoscope.capture.hostmem import cgroup_memory_limit_bytes, memory_facts


def _layout(tmp_path, cgroup: str, files: dict[str, str]):
    (tmp_path / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        path = tmp_path / "fs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "cgroup", tmp_path / "fs"


@pytest.mark.parametrize(("cgroup", "files", "limit"), [
    # cgroup v1: the process's own memory cgroup, under an unlimited root
    ("4:memory:/job/abc\n0::/\n", {"memory/job/abc/memory.limit_in_bytes": "4294967296\n",
                                   "memory/memory.limit_in_bytes": "9223372036854771712\n"}, 4 << 30),
    # cgroup v1 unlimited everywhere (2**63 rounded to pages)
    ("4:memory:/job/abc\n", {"memory/job/abc/memory.limit_in_bytes": "9223372036854771712\n"}, None),
    # cgroup v2: a number, and "max" at the root
    ("0::/user.slice/job\n", {"user.slice/job/memory.max": "2147483648\n", "memory.max": "max\n"}, 2 << 30),
    ("0::/\n", {"memory.max": "max\n"}, None),
    # nothing readable
    ("0::/gone\n", {}, None),
])
def test_the_lowest_cgroup_memory_limit_is_read(tmp_path, cgroup, files, limit):
    proc, root = _layout(tmp_path, cgroup, files)
    assert cgroup_memory_limit_bytes(proc, root) == limit


def test_an_unreadable_proc_file_is_no_limit(tmp_path):
    assert cgroup_memory_limit_bytes(tmp_path / "missing", tmp_path) is None


def test_the_manifest_gets_the_hosts_memory_and_a_limit_only_where_lower():
    facts = memory_facts()
    assert set(facts) == {"memory_bytes", "memory_limit_bytes"}
    assert isinstance(facts["memory_bytes"], int) and facts["memory_bytes"] > 0  # Linux says
    assert facts["memory_limit_bytes"] is None or facts["memory_limit_bytes"] < facts["memory_bytes"]
