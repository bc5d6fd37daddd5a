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


# --- the loader's dataset, as the capture reads it -----------------------------------------------
def test_a_loaders_dataset_is_described_without_calling_its_code():
    """Where a dataset's items come from, read from the object (its class, its rows in memory, its collate), never by
    calling its ``__getitem__``: a TensorDataset of a 100 x 4 float32 and a 100 int64 tensor is 2 tensors, 2,400
    bytes, rows and nothing else; a Subset of a Subset of it has the outer Subset's 3 items, its rows the base's; a
    class of its own holding one 50 x 3 float32 array twice (an attribute and a list) counts it once, 600 bytes; an
    IterableDataset is named and nothing more, whatever it holds or says its length is; a dataset whose len() raises
    keeps what was read before it."""
    from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

    from kinetoscope.capture.hooks import _loader_config, dataset_facts

    rows = TensorDataset(torch.zeros(100, 4), torch.arange(100))
    assert dataset_facts(rows) == {"dataset_class": "TensorDataset", "dataset_via": None, "dataset_items": 100,
                                   "dataset_tensors": 2, "dataset_tensor_bytes": 2_400,
                                   "dataset_getitem": "tensor_rows"}
    nested = dataset_facts(Subset(Subset(rows, list(range(50))), [1, 2, 3]))
    assert (nested["dataset_via"], nested["dataset_items"], nested["dataset_tensors"]) == ("Subset", 3, 2)

    class Held(Dataset):
        def __init__(self):
            import numpy as np

            self.x = np.zeros((50, 3), dtype=np.float32)
            self.views = [self.x]

        def __len__(self):
            return 50

        def __getitem__(self, i):
            raise AssertionError("the capture called __getitem__")

    held = dataset_facts(Held())
    assert (held["dataset_tensors"], held["dataset_tensor_bytes"], held["dataset_getitem"]) == (1, 600, "custom")

    class Stream(IterableDataset):
        def __init__(self):
            self.t = torch.zeros(3)

        def __len__(self):
            return 3

        def __iter__(self):
            yield from range(3)

    assert dataset_facts(Stream()) == {"dataset_class": "Stream", "dataset_via": None, "dataset_items": None,
                                       "dataset_tensors": None, "dataset_tensor_bytes": None, "dataset_getitem": None}

    class NoLength(Dataset):
        def __len__(self):
            raise RuntimeError("no length")

    assert dataset_facts(NoLength())["dataset_items"] is None
    collates = [_loader_config(DataLoader(rows, **kw), "DataLoader")["collate"]
                for kw in ({"batch_size": 4}, {"batch_size": None}, {"batch_size": 4, "collate_fn": lambda b: b})]
    assert collates == ["default", "default", "custom"]
