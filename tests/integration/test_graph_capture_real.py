"""Graph replays on the real vLLM and SGLang decode traces (TraceLens's, ROCm, ``hipGraphLaunch``; ../shared when
present), and the SGLang one with its replay's kernels taken out - as older roctracer/Kineto write it - and a
capture trace beside it.

What the raw files show (read before the tool): each holds one ``hipGraphLaunch`` whose kernels roctracer recorded
under the launch's correlation id - vLLM 421 kernels on device 2 stream 0, SGLang 544 on device 9 stream 3, from
463828.7 to 473759.3 us after the trace's first event (9930.6 us, 9656.4 us of kernel time) - and no stream capture.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.model.graphs import graph_replays
from kinetoscope.analyze.report.builder import build_report

ROOT = Path(__file__).resolve().parents[2]
#: ../shared beside the checkout (a worktree's is one level further up)
SHARED = next((p / "shared" / "traces" for p in (ROOT.parent, ROOT.parents[1]) if (p / "shared" / "traces").is_dir()),
              ROOT.parent / "shared" / "traces")
INFERENCE = SHARED / "TraceLens" / "tests" / "traces" / "inference"
VLLM = INFERENCE / "vllm_decode_full" / "graph_execution.json.gz"
SGLANG = INFERENCE / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz"

pytestmark = pytest.mark.skipif(not (VLLM.is_file() and SGLANG.is_file()), reason="../shared traces not present")


def _missing(path: Path) -> dict:
    return build_report(load_trace(path)).ranks[0]["gpu"]["missing_activity"]


def test_the_real_replays_are_recorded_and_need_no_capture():
    for path in (VLLM, SGLANG):
        missing = _missing(path)
        assert missing["graph_launches_unrecorded"] == 0 and missing["graph_launches_from_capture"] == 0
        assert missing["captured_graphs"] == [] and missing["graph_launches_not_judged"] == {}
    (replay,) = graph_replays(load_trace(SGLANG).ranks[0]).replays
    assert replay.recorded_work == 544 and (replay.device, replay.stream) == (9, 3)


def test_the_serving_iterations_batch_sizes_are_read_from_their_annotations():
    from kinetoscope.analyze.model.graphs import _iteration_batch_sizes

    # vLLM: "execute_32_context_0(sq0sk0...)_generation_32(sq32sk55086...)"; SGLang: an "execute_32_context_0(...)"
    # annotation and, inside it, "step[DECODE bs=32]": 32 tokens each
    assert list(_iteration_batch_sizes(load_trace(VLLM).ranks[0])[2]) == [32]
    assert list(_iteration_batch_sizes(load_trace(SGLANG).ranks[0])[2]) == [32, 32]


def _without_replay_kernels(folder: Path, capture: bool) -> tuple[Path, list[str]]:
    """The SGLang trace less its replay's 544 kernels; with ``capture``, a capture trace for batch size 32 in
    ``capture_traces/`` beside it: 544 launch calls whose args name those kernels in the order they ran, as
    roctracer writes a capture. Returns the trace and those kernels' names."""
    doc = json.loads(gzip.decompress(SGLANG.read_bytes()))
    launch = next(e for e in doc["traceEvents"] if e.get("name") == "hipGraphLaunch")
    corr = launch["args"]["correlation"]
    replayed = sorted((e for e in doc["traceEvents"]
                       if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") == corr),
                      key=lambda e: e["ts"])
    kept = [e for e in doc["traceEvents"] if not any(e is r for r in replayed)]
    assert len(doc["traceEvents"]) - len(kept) == 544
    path = folder / "sglang.json.gz"
    path.write_bytes(gzip.compress(json.dumps({**doc, "traceEvents": kept}).encode()))
    if capture:
        calls = [("hipStreamBeginCapture", 0, None)] + [("hipLaunchKernel", 10 + 10 * i, k["name"])
                                                        for i, k in enumerate(replayed)]
        calls.append(("hipStreamEndCapture", 5460, None))
        events = [{"ph": "X", "cat": "cuda_runtime", "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                   "args": {"correlation": 1 + i, **({"kernel": k} if k else {})}}
                  for i, (n, ts, k) in enumerate(calls)]
        (folder / "capture_traces").mkdir()
        (folder / "capture_traces" / "bs_32_rank0.json.gz").write_bytes(
            gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path, [k["name"] for k in replayed]


def test_an_unrecorded_real_replay_is_judged_from_a_capture_trace(tmp_path):
    as_recorded = _missing(SGLANG)
    for sub in ("blind", "captured"):
        (tmp_path / sub).mkdir()
    blind = _missing(_without_replay_kernels(tmp_path / "blind", capture=False)[0])
    path, names = _without_replay_kernels(tmp_path / "captured", capture=True)
    judged = _missing(path)
    assert blind["graph_launches_not_judged"] == {"no capture in the trace or beside it": 1}
    assert judged["graph_launches_from_capture"] == 1 and judged["graph_launches_not_judged"] == {}
    (graph,) = judged["captured_graphs"]
    # step[DECODE bs=32] -> the capture trace for batch size 32
    assert (graph["source"], graph["batch_size"], graph["launches"]) == ("bs_32_rank0.json.gz", 32, 544)
    assert graph["matched_by"] == ["batch_size"] and graph["replays_judged"] == 1
    # the replay's kernels, named by the capture, in the order they ran: the first 64 listed
    assert [x["kernel"] for x in graph["launch_list"]] == names[:64]
    assert names[0].startswith("void at::native::vectorized_gather_kernel")  # the embedding lookup
    # from the launch (463814.6 us) to the next recorded work on stream 3 (the argmax reduce at 473768.0; a kernel
    # on stream 2 at 465666.0 does not bound it): it holds the replay's real kernels, 463828.7 .. 473759.3
    assert judged["graph_replay_span_us"] == pytest.approx(9953.436)
    # the capture gives back exactly what the recorded trace leaves unknown (the 463 ms before the step's first
    # kernels, which wait on an event); without it the replay's 8.1 ms wait of the reduce kernel and 1.9 ms more
    # are unknown too
    assert judged["unknown_us"] == as_recorded["unknown_us"] == pytest.approx(463251.758)
    assert blind["unknown_us"] == pytest.approx(473199.506)
