"""The batch's advice about a cluster's workers' allocator settings (Dask's nanny default costs 2x CPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")
from kinetoscope.batch.run import MALLOC_ENV, slow_allocator_note  # noqa: E402

DASK_DEFAULT = {"MALLOC_TRIM_THRESHOLD_": "65536", "MALLOC_MMAP_THRESHOLD_": None}
GLIBC_DEFAULT = {"MALLOC_TRIM_THRESHOLD_": None, "MALLOC_MMAP_THRESHOLD_": None}


class FakeClient:
    def __init__(self, settings):
        self.settings = settings

    def run(self, fn):
        if isinstance(self.settings, Exception):
            raise self.settings
        return self.settings


def test_workers_with_the_nannys_trim_threshold_get_one_line_naming_the_fix():
    note = slow_allocator_note(FakeClient({"tcp://a": DASK_DEFAULT, "tcp://b": dict(MALLOC_ENV),
                                           "tcp://c": {"MALLOC_TRIM_THRESHOLD_": "65536",
                                                       "MALLOC_MMAP_THRESHOLD_": "33554432"}}))
    assert note is not None and note.startswith("note: 2 of 3 workers run with a small fixed malloc threshold")
    assert "MALLOC_TRIM_THRESHOLD_=33554432 MALLOC_MMAP_THRESHOLD_=33554432" in note and "\n" not in note


def test_no_note_where_workers_are_set_or_keep_glibcs_adaptive_threshold_or_cannot_tell():
    assert slow_allocator_note(FakeClient({"tcp://a": dict(MALLOC_ENV), "tcp://b": GLIBC_DEFAULT})) is None
    assert slow_allocator_note(FakeClient(OSError("scheduler gone"))) is None
    assert MALLOC_ENV == {"MALLOC_TRIM_THRESHOLD_": "33554432", "MALLOC_MMAP_THRESHOLD_": "33554432"}
