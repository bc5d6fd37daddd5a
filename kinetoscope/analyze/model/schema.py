"""The one place where the columns of a loaded trace are declared.

Time unit: every timestamp and duration is an **int64 nanosecond** count
(`*_ns` columns). Kineto writes microseconds with up to three decimals; keeping
integer nanoseconds preserves that precision exactly and makes interval
arithmetic exact (no negative durations from rounding). Reports convert to
microseconds (`*_us`) at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    doc: str


#: Complete events (``ph: "X"``): CPU ops, annotations, runtime calls, GPU work.
EVENT_COLUMNS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "start time, ns (trace clock)"),
    Column("dur_ns", "int64", "duration, ns"),
    Column("end_ns", "int64", "ts_ns + dur_ns"),
    Column("name", "category", "event name, decoded"),
    Column("cat", "category", "normalised category (see CATEGORY_ALIASES)"),
    Column("kind", "category", "coarse kind: one of KINDS"),
    Column("pid", "category", "process id as written (int or label), as text"),
    Column("tid", "category", "thread id / GPU track as written, as text"),
    Column("device", "Int64", "GPU device index (GPU events), else <NA>"),
    Column("stream", "Int64", "CUDA/HIP stream (GPU events), else <NA>"),
    Column("correlation", "Int64", "runtime <-> GPU correlation id, else <NA>"),
    Column("external_id", "Int64", "CPU op <-> runtime external id, else <NA>"),
    Column("bytes", "Int64", "bytes moved (memcpy/memset), else <NA>"),
)

#: ``[memory]`` instant events from ``profile_memory=True`` (HTA drops these).
MEMORY_COLUMNS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "time of the allocation or free, ns"),
    Column("bytes", "int64", "signed size: + allocation, - free"),
    Column("total_allocated_bytes", "Int64", "allocator's allocated total after the event (<NA> in 2021 traces)"),
    Column("total_reserved_bytes", "Int64", "allocator's reserved total after the event (<NA> in 2021 traces)"),
    Column("device_type", "int64", "0 = CPU, 1 = CUDA/HIP (c10 DeviceType)"),
    Column("device_id", "int64", "device index, -1 for CPU"),
    Column("addr", "Int64", "address of the block, when recorded"),
    Column("tid", "category", "thread that allocated"),
)

#: Counter events (``ph: "C"``), long format: one row per (event, series).
COUNTER_COLUMNS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "sample time, ns"),
    Column("name", "category", "counter track name"),
    Column("series", "category", "the key inside args"),
    Column("value", "float64", "sample value"),
    Column("pid", "category", "process id as written, as text"),
)

#: Flow events (``ph: "s"/"f"/"t"``): runtime -> GPU links and fwd -> bwd links.
FLOW_COLUMNS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "time, ns"),
    Column("id", "Int64", "flow id (the correlation id for ac2g flows)"),
    Column("phase", "category", "s (start), f (finish), t (step)"),
    Column("cat", "category", "normalised flow category (ac2g, fwdbwd, ...)"),
    Column("pid", "category", "process id as text"),
    Column("tid", "category", "thread id as text"),
)

#: Collective metadata from args (PyTorch >= 2.3 writes it on ``record_param_comms`` ops and on the NCCL
#: kernels): one row per event that has any of it; ``row`` is that event's position in the events table.
COMM_ARG_COLUMNS: tuple[Column, ...] = (
    Column("row", "int64", "position of the event in the events table"),
    Column("coll_name", "category", "args['Collective name'] (allreduce, _allgather_base, ...)"),
    Column("pg_name", "category", "args['Process Group Name']"),
    Column("pg_ranks", "category", "args['Process Group Ranks'] as written (\"[0, 1, 2, 3]\")"),
    Column("in_nelems", "Int64", "args['In msg nelems']"),
    Column("out_nelems", "Int64", "args['Out msg nelems']"),
    Column("group_size", "Int64", "args['Group size']"),
    Column("seq", "Int64", "args['Seq']: the collective's sequence number in its process group"),
)

#: Loop marks (category ``kinetoscope``, kind "mark"): what the capture saw the training loop do, one row per
#: mark event with its args (``kinetoscope.capture.loop``; docs/report.md "Loop marks"). A mark is no host work:
#: analyzers that take "every host event but ..." must leave kind "mark" out.
MARK_COLUMNS: tuple[Column, ...] = (
    Column("row", "int64", "position of the mark in the events table"),
    Column("name", "category", "the mark: kinetoscope::data_wait, ::validation, ::backward, ::optimizer_step, "
                               "::compile, ::checkpoint, ::workers_start, ::workers_stop"),
    Column("loader", "Int64", "data_wait: the DataLoader's number in the process; validation: the loader iterated "
                              "inside (<NA>: none)"),
    Column("role", "category", "data_wait: the loader's role when the window was written (train/eval/unknown)"),
    Column("batch", "Int64", "data_wait: the batch's index within its iterator"),
    Column("exhausted", "boolean", "data_wait: the next() that ended the iterator (StopIteration)"),
    Column("evaluation", "boolean", "data_wait: the batch was taken for evaluation (grad disabled, or a root module "
                                    "in an eval stretch with no backward yet), whatever its loader's role; <NA>: "
                                    "marks before version 3"),
    Column("module", "category", "validation: the class of the root module in eval mode"),
    Column("batches", "Int64", "validation: the data waits inside the stretch"),
    Column("micro_step", "Int64", "backward: its 1-based index within the current optimizer step"),
    Column("thread", "category", "backward: main (the training thread) / other"),
    Column("backward_calls", "Int64", "optimizer_step: backward calls since the previous optimizer step"),
    Column("compile_id", "category", "compile: dynamo's compile id, frame/compilation (\"0/1\")"),
    Column("recompile", "boolean", "compile: a second or later compilation of its frame"),
    Column("trigger", "category", "compile: dynamo (a frame) / lazy_backward (AOT's backward, inside backward())"),
    Column("call", "category", "checkpoint: torch.save / torch.distributed.checkpoint.save / ...async_save"),
    Column("workers", "Int64", "workers_start/workers_stop: the iterator's worker processes"),
    Column("restart", "boolean", "workers_start: that loader's workers were started before (persistent workers "
                                 "would have kept them)"),
)

#: Recorded inputs of host ops (``record_shapes=True``): one row per op event (category cpu_op) whose args have
#: "Input Dims"; ``row`` is that event's position in the events table. The fields are kept as written (JSON text,
#: repeated values share a category): they are decoded only for the operators whose work is counted.
SHAPE_COLUMNS: tuple[Column, ...] = (
    Column("row", "int64", "position of the op in the events table"),
    Column("input_dims", "category", "args['Input Dims'] as JSON text: one list of sizes per input ([] not a tensor)"),
    Column("input_types", "category", "args['Input type'] as JSON text (\"float\", \"c10::BFloat16\", "
                                      "\"Scalar\", ...); <NA>: not written"),
    Column("concrete_inputs", "category", "args['Concrete Inputs'] as JSON text (values of non-tensor inputs as "
                                          "strings; torch >= 2.1); <NA>: not written"),
)

#: The kernel each launch call made inside a stream capture names in its args (roctracer writes ``kernel`` and
#: ``grid``; CUPTI's runtime calls do not): a captured kernel never runs, so no GPU event names it. Read only from
#: traces that hold a capture, for the calls whose correlation id has no GPU work.
LAUNCH_KERNEL_COLUMNS: tuple[Column, ...] = (
    Column("correlation", "int64", "the launch call's correlation id"),
    Column("kernel", "category", "args['kernel']"),
    Column("grid", "category", "args['grid'] as JSON text (\"[32,1,1]\"); <NA>: not written"),
)

#: Launches recorded inside a CUDA/HIP stream capture (Begin..EndCapture): the work a graph holds, one row per
#: launch in capture order. The host calls are what the trace records of them (the captured kernels never ran, so
#: no GPU event names them); ``op`` is the host op that made the call. Captures in the trace itself are derived
#: from its events; this table holds those of separate capture traces (``capture_traces/`` beside the trace).
GRAPH_CAPTURE_COLUMNS: tuple[Column, ...] = (
    Column("source", "category", "the capture trace's file name"),
    Column("capture", "int64", "the capture's position among its file's captures, in time order"),
    Column("batch_size", "Int64", "the batch size the graph was captured for (file name bs_N or a capture_N_* "
                                  "annotation); <NA>: not told"),
    Column("order", "int64", "the launch's position in its capture"),
    Column("call", "category", "the launch call (cudaLaunchKernel, hipMemcpyAsync, ...)"),
    Column("op", "category", "the innermost host op around the call; <NA>: none recorded"),
    Column("kernel", "category", "the kernel the call launches, where its args name it (``LAUNCH_KERNEL_COLUMNS``); "
                                 "<NA>: not written"),
    Column("grid", "category", "its launch grid as written (args 'grid', \"[32, 1, 1]\"); <NA>: not written"),
)

KINDS = (
    "kernel", "memcpy", "memset", "runtime", "driver", "cpu_op", "annotation",
    "gpu_annotation", "python", "sync", "trace", "other", "mark",
)

#: 2021 traces wrote capitalised categories; newer ones use these names.
CATEGORY_ALIASES: dict[str, str] = {
    "Kernel": "kernel",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Operator": "cpu_op",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Python": "python_function",
    "User Annotation": "user_annotation",
    "GPU User Annotation": "gpu_user_annotation",
    "Trace": "trace",
    "async": "ac2g",  # 2021 runtime->GPU flows
}

CATEGORY_KIND: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "driver",
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cuda_sync": "sync",
    "trace": "trace",
    "kinetoscope": "mark",
}

#: Kinds that occupy a GPU stream (busy time is their union).
GPU_BUSY_KINDS = ("kernel", "memcpy", "memset")


def normalise_category(raw: str | None) -> str:
    if not raw:
        return ""
    return CATEGORY_ALIASES.get(raw, raw.lower())


def empty_frame(columns: tuple[Column, ...]) -> pd.DataFrame:
    return pd.DataFrame({c.name: pd.Series([], dtype=c.dtype) for c in columns})


def check_frame(df: pd.DataFrame, columns: tuple[Column, ...], table: str) -> None:
    """Assert that ``df`` has exactly the declared columns and dtypes (cheap, at load)."""
    expected = [c.name for c in columns]
    if list(df.columns) != expected:
        raise AssertionError(f"{table}: columns {list(df.columns)} != schema {expected}")
    for c in columns:
        actual = str(df[c.name].dtype)
        if actual != c.dtype:
            raise AssertionError(f"{table}.{c.name}: dtype {actual} != schema {c.dtype}")


def us_to_ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (float, up to 3 decimals) to exact int64 nanoseconds.

    Splitting off the integer part first keeps epoch-scale timestamps
    (1.7e15 us) exact: multiplying them by 1000 as floats would not be.
    """
    values = np.asarray(values, dtype=np.float64)
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000.0).astype(np.int64)
