"""The loader replay's queue model: each batch's loading time inverted from the training loop's waits."""

from __future__ import annotations

import numpy as np

from kinetoscope.analyze.whatif.loader_queue import infer_worker_loads

MS = 1_000_000


def _one_worker_with_a_stall_at(b: int) -> tuple[np.ndarray, np.ndarray]:
    """12 batches asked for every 10 ms; each taken 0.2 ms later (ready: the hand-over) but batch ``b``, 8.2 ms."""
    asked = np.arange(12, dtype=np.int64) * 10 * MS
    waits = np.full(12, 0.2 * MS)
    waits[b] = 8.2 * MS
    return asked, (asked + waits).astype(np.int64)


def test_a_stalled_batch_loaded_from_when_its_worker_was_free():
    """One worker, prefetch 2: batch 6 became ready at 68 ms (taken at 68.2, less the 0.2 ms hand-over), its worker
    free once batch 5 was ready, by 50 ms at the latest (asked then, not waited for): 18 ms of loading. The others
    were ready: 0."""
    asked, taken = _one_worker_with_a_stall_at(6)
    load = infer_worker_loads(asked, taken, 1, 2, handoff=0.2 * MS)
    assert load[6] == 18 * MS and not np.delete(load, 6).any()


def test_a_batch_whose_worker_was_started_again_is_not_timed_from_the_old_one():
    """Was: the batch after a restart timed from the old iterator's last batch (77 ms of loading on a 10 ms step, and
    more workers were worth it). Batch 6 is the new worker's first after the restart: its loading cannot be timed
    from batch 5, so it is taken like a stalled batch with no better evidence: one worker's pace, k steps of the
    loop, (110.2 - 0.2) / 11 = 10 ms."""
    asked, taken = _one_worker_with_a_stall_at(6)
    fresh = np.zeros(12, dtype=bool)
    fresh[6] = True
    load = infer_worker_loads(asked, taken, 1, 2, handoff=0.2 * MS, fresh=fresh)
    assert load[6] == 10 * MS and not np.delete(load, 6).any()


def test_a_batch_known_to_be_ready_loads_in_no_time_of_the_loops():
    """A wait the capture shows the batch was ready for (its workers burned no CPU through the step) is no stall."""
    asked, taken = _one_worker_with_a_stall_at(6)
    ready = np.zeros(12, dtype=bool)
    ready[6] = True
    assert not infer_worker_loads(asked, taken, 1, 2, handoff=0.2 * MS, ready=ready).any()


def test_without_a_hand_over_given_it_is_read_from_the_waits():
    """No hand-over given: the short waits' median (0.2 ms) is the hand-over, the same 18 ms as given."""
    asked, taken = _one_worker_with_a_stall_at(6)
    assert infer_worker_loads(asked, taken, 1, 2)[6] == 18 * MS
