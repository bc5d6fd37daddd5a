"""The work of one operator from its recorded inputs: FLOPs of matrix ops, bytes moved by memory-bound ops.

FLOPs are counted exactly as ``torch.utils.flop_counter`` (torch 2.13) counts them, restated here (analysis never
imports torch): a multiply-add is 2 FLOPs; mm/addmm ``2mkn``; bmm/baddbmm ``2bmkn`` (the bias add is not counted);
a convolution ``2 * batch * c_out * c_in/groups * prod(filter) * prod(out spatial)`` (the input's spatial size for
a transposed one), its backward the grad-input and grad-weight convolutions its output mask asks for; attention
(scaled-dot-product, flash, efficient, cuDNN) two bmm's forward (``QK^T`` and ``PV``) and five backward, causal masks
not discounted. Composite ops (``aten::linear``, ``aten::matmul``, ``aten::conv2d``) are not counted themselves: the
op they call is, as FlopCounterMode sees it. One addition to torch's table: the CPU flash-attention ops
(``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), which FlopCounterMode leaves at 0 (it has
no formula for them and cannot decompose them), are counted with the attention formulas.

Bytes of memory-bound ops (elementwise, norms, softmax, copies) are a floor: every tensor input read once and one
output the size of the largest input written once, in the first input's dtype.

Shapes are ``args["Input Dims"]`` (one list per input, ``[]`` for a non-tensor), dtypes ``args["Input type"]``,
and the values of non-tensor inputs ``args["Concrete Inputs"]`` (strides, padding, output masks: torch >= 2.1).
What cannot be told from them is ``None`` with the reason, never a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

#: bytes per element of the dtypes the profiler writes in "Input type"
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
#: the peak-table dtype of matrix work on inputs of each profiler dtype (fp32 inputs: see ``peak_dtype``)
MATRIX_DTYPE: dict[str, str] = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16",
                                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
                                "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}

_MM = frozenset({"aten::mm", "aten::_scaled_mm"})
_ADDMM = frozenset({"aten::addmm"})
_BMM = frozenset({"aten::bmm"})
_BADDBMM = frozenset({"aten::baddbmm"})
_CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::convolution_overrideable"})
_CONV_BWD = frozenset({"aten::convolution_backward"})
_SDPA = frozenset({"aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
                   "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"})
_SDPA_BWD = frozenset({"aten::_scaled_dot_product_efficient_attention_backward",
                       "aten::_scaled_dot_product_flash_attention_backward",
                       "aten::_scaled_dot_product_cudnn_attention_backward",
                       "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})
#: (q, k, v) positions, cumulative-sequence input position (a nested batch when it is a tensor)
_ATTN_FWD = {"aten::_flash_attention_forward": 3, "aten::_efficient_attention_forward": 4}
_ATTN_BWD = {"aten::_flash_attention_backward": 6, "aten::_efficient_attention_backward": 6}

#: every op whose FLOPs are counted
MATRIX_OPS: frozenset[str] = (_MM | _ADDMM | _BMM | _BADDBMM | _CONV | _CONV_BWD | _SDPA | _SDPA_BWD
                              | frozenset(_ATTN_FWD) | frozenset(_ATTN_BWD))

#: memory-bound ops whose bytes are counted (the aten name without "aten::", an in-place "_" and "_backward")
_MEMORY_STEMS = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "pow", "reciprocal", "sigmoid", "tanh",
    "relu", "gelu", "silu", "threshold", "hardtanh", "leaky_relu", "elu", "mish", "clamp", "where", "masked_fill",
    "fill", "zero", "copy", "_to_copy", "clone", "contiguous", "native_dropout", "dropout", "addcmul", "addcdiv",
    "lerp", "native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm", "native_group_norm", "group_norm",
    "_fused_rms_norm", "rms_norm", "cudnn_batch_norm", "miopen_batch_norm", "_softmax", "softmax", "_log_softmax",
    "log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "embedding_dense",
})
_STEM_RE = re.compile(r"^aten::(.+?)(_backward)?(_)?$")


def is_memory_op(name: str) -> bool:
    m = _STEM_RE.match(name)
    return bool(m) and m.group(1) in _MEMORY_STEMS  # type: ignore[union-attr]


def is_counted(name: str) -> bool:
    """Whether an op's work is counted (FLOPs or bytes)."""
    return name in MATRIX_OPS or is_memory_op(name)


@dataclass(frozen=True)
class OpWork:
    """What one op call does: FLOPs (matrix ops) and bytes moved; None with ``why`` where shapes do not tell."""

    kind: str  # "matrix" | "memory"
    flops: int | None
    bytes: int | None
    #: the dtype of the first tensor input as the profiler writes it ("float", "c10::BFloat16"); None: not written
    input_type: str | None
    why: str | None = None


class _Unknown(Exception):
    pass


def _prod(xs: Any) -> int:
    return math.prod(int(x) for x in xs)


def _ints(text: str | None, n: int) -> list[int]:
    """A Concrete Inputs value such as "[1, 1]" (or "2", one value for every dimension) as ``n`` ints."""
    if not text:
        raise _Unknown("a non-tensor input's value was not recorded (Concrete Inputs: torch >= 2.1)")
    values = [int(v) for v in text.strip("[]() ").replace(" ", "").split(",") if v]
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise _Unknown(f"a size list {text!r} for {n} dimensions")
    return values


def _bools(text: str | None) -> list[bool]:
    if not text:
        raise _Unknown("the output mask was not recorded (Concrete Inputs: torch >= 2.1)")
    return [v.strip() == "True" for v in text.strip("[]() ").split(",") if v.strip()]


def _flag(text: str | None) -> bool:
    if text not in ("True", "False"):
        raise _Unknown("the transposed flag was not recorded (Concrete Inputs: torch >= 2.1)")
    return text == "True"


def _mm(a: list[int], b: list[int]) -> int:
    m, k = a
    k2, n = b
    if k != k2:
        raise _Unknown(f"mm inner sizes differ ({k} and {k2})")
    return m * n * 2 * k


def _bmm(a: list[int], b: list[int]) -> int:
    bt, m, k = a
    bt2, k2, n = b
    if bt != bt2 or k != k2:
        raise _Unknown("bmm sizes do not match")
    return bt * m * n * 2 * k


def conv_flops(x: list[int], w: list[int], out: list[int], transposed: bool) -> int:
    spatial = (x if transposed else out)[2:]
    c_out, c_in, *filt = w
    return _prod(spatial) * _prod(filt) * x[0] * c_out * c_in * 2


def _conv_out(x: list[int], w: list[int], stride: list[int], padding: list[int], dilation: list[int]) -> list[int]:
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x[2:], w[2:], stride, padding, dilation, strict=True)]
    return [x[0], w[0], *spatial]


def _attention(q: list[int], k: list[int], v: list[int]) -> int:
    b, h_q, s_q, d_q = q
    b2, h_kv, s_k, d_k = k
    b3, h_v, s_v, d_v = v
    if not (b == b2 == b3 and h_kv == h_v and d_q == d_k and s_k == s_v) or h_kv == 0 or h_q % h_kv:
        raise _Unknown("attention shapes do not match")
    return _bmm([b * h_q, s_q, d_q], [b * h_q, d_q, s_k]) + _bmm([b * h_q, s_q, s_k], [b * h_q, s_k, d_v])


def _attention_backward(g: list[int], q: list[int], k: list[int], v: list[int]) -> int:
    b, h_q, s_q, d_q = q
    _, h_kv, s_k, _ = k
    d_v = v[3]
    if len(g) != 4 or g[0] != b or g[1] != h_q or g[2] != s_q or g[3] != d_v or h_kv == 0 or h_q % h_kv:
        raise _Unknown("attention backward shapes do not match")
    bh = b * h_q
    return (_bmm([bh, s_q, d_q], [bh, d_q, s_k]) + _bmm([bh, s_q, d_v], [bh, d_v, s_k])
            + _bmm([bh, s_k, s_q], [bh, s_q, d_v]) + _bmm([bh, s_q, s_k], [bh, s_k, d_q])
            + _bmm([bh, d_q, s_q], [bh, s_q, s_k]))


def _tensor(dims: list[Any], i: int) -> list[int]:
    if i >= len(dims) or not isinstance(dims[i], list) or not dims[i] or \
            not all(isinstance(x, int) for x in dims[i]):
        raise _Unknown(f"input {i} has no recorded tensor shape")
    return [int(x) for x in dims[i]]


def _matrix_flops(name: str, dims: list[Any], concrete: list[Any] | None) -> int:
    def c(i: int) -> str | None:
        return concrete[i] if concrete is not None and i < len(concrete) and isinstance(concrete[i], str) else None

    if name in _MM:
        return _mm(_tensor(dims, 0), _tensor(dims, 1))
    if name in _ADDMM:
        return _mm(_tensor(dims, 1), _tensor(dims, 2))
    if name in _BMM:
        return _bmm(_tensor(dims, 0), _tensor(dims, 1))
    if name in _BADDBMM:
        return _bmm(_tensor(dims, 1), _tensor(dims, 2))
    if name in _CONV:
        x, w = _tensor(dims, 0), _tensor(dims, 1)
        n = len(x) - 2
        transposed = _flag(c(6))
        out = [] if transposed else _conv_out(x, w, _ints(c(3), n), _ints(c(4), n), _ints(c(5), n))
        return conv_flops(x, w, out, transposed)
    if name in _CONV_BWD:
        g, x, w = _tensor(dims, 0), _tensor(dims, 1), _tensor(dims, 2)
        transposed = _flag(c(7))
        mask = _bools(c(10))

        def t(s: list[int]) -> list[int]:
            return [s[1], s[0], *s[2:]]

        flops = 0
        if mask[:1] == [True]:
            flops += conv_flops(g, w, x, not transposed)
        if mask[1:2] == [True]:
            flops += conv_flops(t(g), t(x), t(w), False) if transposed else conv_flops(t(x), t(g), t(w), False)
        return flops
    if name in _SDPA:
        return _attention(_tensor(dims, 0), _tensor(dims, 1), _tensor(dims, 2))
    if name in _SDPA_BWD:
        return _attention_backward(_tensor(dims, 0), _tensor(dims, 1), _tensor(dims, 2), _tensor(dims, 3))
    if name in _ATTN_FWD:
        if _has_tensor(dims, _ATTN_FWD[name]):
            raise _Unknown("a nested (variable-length) batch: its sequence lengths are values, not shapes")
        return _attention(_tensor(dims, 0), _tensor(dims, 1), _tensor(dims, 2))
    if name in _ATTN_BWD:
        if _has_tensor(dims, _ATTN_BWD[name]):
            raise _Unknown("a nested (variable-length) batch: its sequence lengths are values, not shapes")
        return _attention_backward(_tensor(dims, 0), _tensor(dims, 1), _tensor(dims, 2), _tensor(dims, 3))
    raise _Unknown(f"{name} is not a counted matrix op")


def _has_tensor(dims: list[Any], i: int) -> bool:
    return i < len(dims) and isinstance(dims[i], list) and bool(dims[i])


def _tensor_bytes(dims: list[Any], types: list[Any]) -> tuple[int, int, int]:
    """(bytes of every tensor input, the largest input's element count, the first tensor's element size)."""
    total, largest, first = 0, 0, 0
    for i, d in enumerate(dims):
        if not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            continue
        kind = types[i] if i < len(types) else None
        size = DTYPE_BYTES.get(kind) if isinstance(kind, str) else None
        if size is None:
            if kind in ("Scalar", "ScalarList", "TensorList", "", None) and not d:
                continue
            raise _Unknown(f"input {i} of type {kind!r}: its element size is not known")
        n = _prod(d)
        total += n * size
        largest = max(largest, n)
        first = first or size
    return total, largest, first


def _matrix_bytes(name: str, dims: list[Any], types: list[Any], flops_ok: bool) -> int | None:
    """Inputs read once; the output (forward) or the gradients (backward) written once, in the first input's type."""
    try:
        read, _, size = _tensor_bytes(dims, types)
        if name in _MM | _ADDMM:
            a, b = (_tensor(dims, 0), _tensor(dims, 1)) if name in _MM else (_tensor(dims, 1), _tensor(dims, 2))
            return read + a[0] * b[1] * size
        if name in _BMM | _BADDBMM:
            a, b = (_tensor(dims, 0), _tensor(dims, 1)) if name in _BMM else (_tensor(dims, 1), _tensor(dims, 2))
            return read + a[0] * a[1] * b[2] * size
        if name in _SDPA or name in _ATTN_FWD:
            q, v = _tensor(dims, 0), _tensor(dims, 2)
            return read + _prod(q[:3]) * v[3] * size
        if name in _SDPA_BWD or name in _ATTN_BWD:
            return read + sum(_prod(_tensor(dims, i)) for i in (1, 2, 3)) * size
        if name in _CONV_BWD:
            return read + (_prod(_tensor(dims, 1)) + _prod(_tensor(dims, 2))) * size
        return read  # a forward convolution: the output is not among the inputs (counted in FLOPs only)
    except _Unknown:
        return None


def _decode(text: Any) -> Any:
    import msgspec

    if not isinstance(text, str):
        return None
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None


def op_work(name: str, input_dims: str, input_types: str | None, concrete_inputs: str | None) -> OpWork | None:
    """The work of one call of ``name`` from its recorded fields (JSON text as written); None for an op whose work
    is not counted."""
    matrix = name in MATRIX_OPS
    if not matrix and not is_memory_op(name):
        return None
    kind = "matrix" if matrix else "memory"
    dims = _decode(input_dims)
    types = _decode(input_types)
    concrete = _decode(concrete_inputs)
    types_list = types if isinstance(types, list) else []
    first = next((t for t, d in zip(types_list, dims or [], strict=False)
                  if isinstance(t, str) and t in DTYPE_BYTES and isinstance(d, list) and d), None)
    if not isinstance(dims, list):
        return OpWork(kind, None, None, first, "Input Dims is not a list")
    if matrix:
        try:
            flops: int | None = _matrix_flops(name, dims, concrete if isinstance(concrete, list) else None)
            why = None
        except (_Unknown, ValueError, TypeError) as exc:
            flops, why = None, str(exc) if isinstance(exc, _Unknown) else "shapes of an unexpected form"
        return OpWork(kind, flops, _matrix_bytes(name, dims, types_list, flops is not None), first, why)
    if not types_list:
        return OpWork(kind, None, None, None, "Input type was not recorded")
    try:
        read, largest, size = _tensor_bytes(dims, types_list)
    except (_Unknown, ValueError, TypeError) as exc:
        return OpWork(kind, None, None, first, str(exc) if isinstance(exc, _Unknown) else "unexpected shapes")
    return OpWork(kind, None, read + largest * size, first)


def peak_dtype(input_type: str | None, has_tf32: bool) -> str | None:
    """The peak-table dtype matrix work on ``input_type`` inputs is judged against: fp32 inputs against the TF32
    rate where the device has one (the fastest the hardware can take fp32 inputs: never below what a TF32 kernel
    achieves), else FP32; None for a dtype with no matrix peak (integers, double)."""
    dtype = MATRIX_DTYPE.get(input_type or "")
    if dtype == "fp32" and has_tf32:
        return "tf32"
    return dtype
