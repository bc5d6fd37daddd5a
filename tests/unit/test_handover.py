"""The capture's hand-over probe: what a batch shaped like the training loader's costs the loop to take from a
worker, and the batch skeleton it builds that batch from (shapes and dtypes, never a value of the user's)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kinetoscope.capture.handover import batch_bytes, probe_handover  # noqa: E402
from kinetoscope.capture.hooks import SKELETON_MAX_TENSORS, batch_skeleton  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_batch_skeleton_keeps_structure_shapes_and_dtypes_only():
    batch = ({"input_ids": torch.zeros(8, 128, dtype=torch.int64), "mask": torch.ones(8, 128, dtype=torch.bool)},
             [torch.zeros(8, 3, 32, 32), "a caption", 7], torch.zeros(8, dtype=torch.bfloat16))
    assert batch_skeleton(batch) == {"tuple": [
        {"dict": {"input_ids": {"shape": [8, 128], "dtype": "int64"}, "mask": {"shape": [8, 128], "dtype": "bool"}}},
        [{"shape": [8, 3, 32, 32], "dtype": "float32"}, None, None],
        {"shape": [8], "dtype": "bfloat16"}]}
    # 8*128*8 + 8*128*1 + 8*3*32*32*4 + 8*2
    assert batch_bytes(batch_skeleton(batch)) == 8192 + 1024 + 98304 + 16


def test_no_skeleton_for_a_tensor_off_the_cpu_or_too_many_tensors():
    assert batch_skeleton((torch.zeros(4), torch.empty(4, device="meta"))) is None
    assert batch_skeleton([torch.zeros(1)] * (SKELETON_MAX_TENSORS + 1)) is None
    assert batch_skeleton([torch.zeros(1)] * SKELETON_MAX_TENSORS) is not None
    assert batch_skeleton("text") is None


@pytest.mark.parametrize("skeleton, why", [
    (None, "the training loader's batch holds no CPU tensor the capture could describe"),
    ([None, {"dict": {}}], "the training loader's batch holds no CPU tensor the capture could describe"),
    ({"shape": [4], "dtype": "float8_e4m3fn"}, "the batch holds a tensor of a dtype the probe does not build"),
    ({"shape": [2**28], "dtype": "float32"}, "the batch is 1024 MiB, over the probe's 512 MiB"),
])
def test_what_the_probe_cannot_measure_is_null_with_why(skeleton, why):
    assert probe_handover(skeleton) == {"median_ns": None, "p10_ns": None, "p90_ns": None, "samples": 0,
                                        "batch_bytes": None, "workers": 1, "why": why}


def test_the_probe_times_each_batch_from_one_worker():
    skeleton = {"tuple": [{"shape": [16, 1, 28, 28], "dtype": "float32"}, {"shape": [16], "dtype": "int64"}]}
    got = probe_handover(skeleton, samples=8, deadline_s=20)
    assert got["samples"] == 8 and got["batch_bytes"] == 16 * 784 * 4 + 16 * 8
    assert got["workers"] == 1 and got["why"] is None
    assert 0 < got["p10_ns"] <= got["median_ns"] <= got["p90_ns"]


def test_a_probe_out_of_time_says_how_many_batches_it_got():
    skeleton = {"shape": [4], "dtype": "float32"}
    got = probe_handover(skeleton, samples=20, deadline_s=0.0)
    assert got["median_ns"] is None and got["why"] == "only 0 batches in the probe's 0 s"
