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
    # Slurm on v2: the job's limit sits above the task's cgroup, whose own is "max"
    ("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
     {"system.slice/slurmstepd.scope/job_42/memory.max": "8589934592\n",
      "system.slice/slurmstepd.scope/job_42/step_0/user/task_0/memory.max": "max\n"}, 8 << 30),
    # Slurm on v1: the task unlimited, the job's limit in the task's hierarchical_memory_limit
    ("4:memory:/slurm/uid_1/job_42/step_0/task_0\n",
     {"memory/slurm/uid_1/job_42/step_0/task_0/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/slurm/uid_1/job_42/step_0/task_0/memory.stat": "cache 0\nhierarchical_memory_limit 8589934592\n"},
     8 << 30),
    # odd contents: no limit, and no error
    ("0::/odd\n", {"odd/memory.max": "\u00b2\n"}, None),
])
def test_the_lowest_cgroup_memory_limit_is_read(tmp_path, cgroup, files, limit):
    proc, root = _layout(tmp_path, cgroup, files)
    assert cgroup_memory_limit_bytes(proc, root) == limit


def test_an_unreadable_proc_file_is_no_limit(tmp_path):
    assert cgroup_memory_limit_bytes(tmp_path / "missing", tmp_path) is None
    bad = tmp_path / "cgroup"
    bad.write_bytes(b"0::/caf\xe9\n")  # not UTF-8: read, found nothing, never raised
    assert cgroup_memory_limit_bytes(bad, tmp_path) is None


def test_a_failure_reading_memory_loses_nothing_else(monkeypatch):
    """Anything raised while reading them leaves both null: the manifest is written without them (was: a
    UnicodeDecodeError lost the whole manifest, a fresh reviewer found)."""
    from kinetoscope.capture import hostmem

    def boom(*_a, **_k):
        raise UnicodeDecodeError("ascii", b"", 0, 1, "odd")

    monkeypatch.setattr(hostmem, "cgroup_memory_limit_bytes", boom)
    assert hostmem.memory_facts() == {"memory_bytes": None, "memory_limit_bytes": None}


def test_the_manifest_gets_the_hosts_memory_and_a_limit_only_where_lower():
    facts = memory_facts()
    assert set(facts) == {"memory_bytes", "memory_limit_bytes"}
    assert isinstance(facts["memory_bytes"], int) and facts["memory_bytes"] > 0  # Linux says
    assert facts["memory_limit_bytes"] is None or facts["memory_limit_bytes"] < facts["memory_bytes"]
