"""FLOP counts of operators from their input shapes, with torch.profiler's own formulas.

``torch.profiler.profile(with_flops=True)`` computes a FLOP count for the operators it has a
formula for, but the Chrome trace torch 2.x exports leaves the count out (checked on torch
2.13: no ``args.flops`` on any event); it does write each operator's ``Input Dims`` (and
``Concrete Inputs`` for scalar arguments such as a convolution's stride). For the operators
below the count follows from those alone, exactly as the profiler computes it
(``torch/csrc/profiler/util.cpp``, ``computeFlops``; checked against ``key_averages()`` on
torch 2.13 in ``tests/integrations/test_trace_flops_torch.py``):

- ``aten::mm`` ``[M, K] x [K, N]``: ``2 M K N``; ``aten::addmm`` (bias, mat1, mat2): the same
  on mat1 and mat2 (the bias add is not counted);
- ``aten::bmm`` ``[B, M, K] x [B, K, N]``: ``2 B M K N``; ``aten::baddbmm`` (self, batch1,
  batch2): the same on batch1 and batch2;
- ``aten::conv2d`` (input ``[N, C, H, W]``, weight ``[O, C/g, R, S]``, bias, stride, padding,
  dilation, groups): ``2 N O H' W' (C/g) R S`` with ``H' = (H + 2p - d (R - 1) - 1) // s + 1``;
- ``aten::mul`` and ``aten::add``: one FLOP per element of the first input (not of the
  broadcast output: the profiler's rule).

In-place variants (``mul_``, ``add_``) and composite operators (``matmul``, ``linear``,
``convolution``) carry no count, as in the profiler, so nothing is counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

__all__ = ["FORMULA_OPS", "op_flops"]

FORMULA_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                         "aten::conv2d", "aten::mul", "aten::add"})

_DIMS = msgspec.json.Decoder(list[list[int]])
_CONCRETE = msgspec.json.Decoder(list[str])
_PAIR = msgspec.json.Decoder(list[int])


def _shape(dims: Sequence[Sequence[int]], i: int, rank: int) -> Sequence[int] | None:
    if i >= len(dims) or len(dims[i]) != rank or any(d < 0 for d in dims[i]):
        return None
    return dims[i]


def _gemm(a: Sequence[int] | None, b: Sequence[int] | None) -> int | None:
    if a is None or b is None or a[-1] != b[-2] or a[:-2] != b[:-2]:
        return None
    return 2 * math.prod(a) * b[-1]


def _pair(concrete: Sequence[str], i: int) -> tuple[int, int] | None:
    """A convolution's stride, padding, dilation or groups from ``Concrete Inputs`` (None
    where the trace did not record it: a default would be a guess)."""
    text = concrete[i] if i < len(concrete) else ""
    if not text:
        return None
    try:
        v = _PAIR.decode(text) if text.startswith("[") else [int(text)]
    except (msgspec.DecodeError, ValueError):
        return None
    if len(v) == 1:
        return v[0], v[0]
    return (v[0], v[1]) if len(v) == 2 else None


def _conv2d(dims: Sequence[Sequence[int]], concrete: Sequence[str]) -> int | None:
    x, w = _shape(dims, 0, 4), _shape(dims, 1, 4)
    stride, pad, dil, groups = (_pair(concrete, i) for i in (3, 4, 5, 6))
    if x is None or w is None or stride is None or pad is None or dil is None or groups is None:
        return None
    g = groups[0]
    if g <= 0 or min(stride) <= 0 or x[1] != w[1] * g:
        return None
    out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
           for i in (0, 1)]
    if min(out) <= 0:
        return None
    return 2 * x[0] * w[0] * out[0] * out[1] * w[1] * w[2] * w[3]


def op_flops(name: str, input_dims: bytes, concrete_inputs: bytes = b"") -> int | None:
    """The profiler's FLOP count of one operator event from its ``args["Input Dims"]`` and
    ``args["Concrete Inputs"]`` (raw JSON text), or None where ``name`` has no formula or the
    shapes do not fit it (then the event is dropped with a note, never read as zero)."""
    if name not in FORMULA_OPS or not input_dims:
        return None
    try:
        dims = _DIMS.decode(input_dims)
        concrete = _CONCRETE.decode(concrete_inputs) if concrete_inputs else []
    except msgspec.DecodeError:
        return None
    if name == "aten::mm":
        return _gemm(_shape(dims, 0, 2), _shape(dims, 1, 2))
    if name == "aten::addmm":
        return _gemm(_shape(dims, 1, 2), _shape(dims, 2, 2))
    if name == "aten::bmm":
        return _gemm(_shape(dims, 0, 3), _shape(dims, 1, 3))
    if name == "aten::baddbmm":
        return _gemm(_shape(dims, 1, 3), _shape(dims, 2, 3))
    if name == "aten::conv2d":
        return _conv2d(dims, concrete)
    first = dims[0] if dims else None  # aten::mul, aten::add
    if first is None or any(d < 0 for d in first):
        return None
    return math.prod(first)
