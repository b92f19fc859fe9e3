"""Kernel classes from kernel names (CUDA, cuDNN, cuBLAS, CUTLASS, NCCL, ROCm).

Two taxonomies:

* HTA's three types (``COMPUTATION``, ``COMMUNICATION``, ``MEMORY``), by name regex as in
  HolisticTraceAnalysis 0.5.0 (``hta.utils.utils.get_kernel_type``), with ``hta_compat``
  reproducing its fault that ``void ncclDevKernel_*`` (NCCL >= 2.19) counts as computation
  (HTA issues #122, #247). Without it any ``nccl``/``rccl`` kernel is communication.
* A finer category for the kernel breakdown: gemm, convolution, attention, elementwise,
  reduction, communication, memory, other; and whether a matmul-class kernel uses tensor
  cores (hmma/wgmma/tensorop/xmma ... versus plain ``sgemm``).

All functions take the distinct names (a trace has hundreds, not one per kernel launch) and
use Python's :mod:`re`, so loading and analysing a trace needs neither pyarrow nor DuckDB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

__all__ = ["CATEGORIES", "category", "hta_type", "is_tensor_core", "kernel_key", "unique_classes"]

COMPUTATION, COMMUNICATION, MEMORY, OTHER = "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"

_HTA_COMM = r"^nccl.*Kernel"
_COMM = r"(?i)(^|[\s:])(nccl|rccl)\w*|ncclDevKernel|ncclKernel|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|alltoall"
_MEMORY = r"^(Memcpy|Memset|dma)"
_HTA_NOT_COMPUTE = r"^(nccl.*Kernel|.*(Memcpy)|(Memset)|.*Sync)"  # HTA's regex, verbatim

CATEGORIES = ("gemm", "convolution", "attention", "communication", "memory", "elementwise",
              "reduction", "normalization", "other")

_CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("memory", _MEMORY),
    ("communication", _COMM),
    ("attention", r"(?i)flash|fmha|attention|attn|sdpa|mha_|_mha|cudnn_fused_.*softmax"),
    ("convolution", r"(?i)conv|winograd|implicit_gemm|implicit_convolve|dgrad|wgrad|fprop|"
                    r"nchw|nhwc(?:ToNchw|_)?.*kernel_conv|cudnn::.*conv"),
    ("gemm", r"(?i)gemm|gemv|matmul|cublas|cutlass|xmma|hmma|wgmma|gmma|tensorop|"
             r"_mm_|\bbmm|sm\d\d_.*_tn|addmm|Kernel_GEMM|triton_mm|^Cijk_"),
    ("normalization", r"(?i)norm|batch_norm|bn_fw|bn_bw|layer_norm|rms_?norm|welford"),
    ("reduction", r"(?i)reduce|reduction|softmax|argmax|topk|sum_kernel|mean_kernel|cumsum|"
                  r"scan|sort"),
    ("elementwise", r"(?i)elementwise|vectorized|unrolled|pointwise|copy|fill|triton_poi|"
                    r"index|gather|scatter|cat|dropout|activation|relu|gelu|silu|add|mul|"
                    r"where|cast|clamp|foreach|adam|sgd|optimizer|embedding"),
)

_TENSOR_CORE = (
    r"(?i)hmma|wgmma|gmma|tensorop|xmma|imma|_mma|mma_|\bh\d{3,4}gemm|[hi]\d{3,4}gemm|"
    r"s1688|s16816|h1688|h16816|884gemm|bf16|f16f16|fp16|half|tf32|fp8|e4m3|e5m2|"
    r"flash|fmha|cutlass_\d+_tensorop|sm[89]\d_|_MI\d+x\d+x\d+"
)


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_RX_HTA_COMM, _RX_COMM = _rx(_HTA_COMM), _rx(_COMM)
_RX_MEMORY, _RX_NOT_COMPUTE = _rx(_MEMORY), _rx(_HTA_NOT_COMPUTE)
_RX_RULES = tuple((cat, _rx(rx)) for cat, rx in _CATEGORY_RULES)
_RX_TC = _rx(_TENSOR_CORE)
_RX_VOID, _RX_KEY, _RX_NS = _rx(r"^void\s+"), _rx(r"^([^<(]*)(?:<([^,<>(]*))?.*$"), _rx(
    r"[A-Za-z0-9_]*::")


def hta_type(names: Sequence[str], *, hta_compat: bool = False) -> np.ndarray:
    """HTA kernel type per name: COMMUNICATION, MEMORY, COMPUTATION or OTHER.

    OTHER is HTA's name for ``*Sync`` events and non-NCCL names its compute regex rejects.
    """
    comm = _RX_HTA_COMM if hta_compat else _RX_COMM
    out = [COMMUNICATION if comm.search(n) else MEMORY if _RX_MEMORY.search(n)
           else OTHER if _RX_NOT_COMPUTE.search(n) else COMPUTATION for n in names]
    return np.array(out, dtype=object)


def _key(name: str) -> str:
    s = _RX_VOID.sub("", name.replace("(anonymous namespace)", "anon"), count=1)
    s = _RX_KEY.sub(r"\1 \2", s, count=1)
    return _RX_NS.sub("", s)


def kernel_key(names: Sequence[str]) -> list[str]:
    """The part of a demangled kernel name that says what it does: the function's own name
    plus its first template argument, namespaces dropped. ``void cutlass::Kernel<cutlass_80_
    tensorop_s1688gemm_...>(Params)`` -> ``Kernel cutlass_80_tensorop_s1688gemm_...``;
    argument lists (``fbgemm_gpu::...`` types in an embedding kernel) no longer count."""
    return [_key(n) for n in names]


def _category(full: str, key: str) -> str:
    for cat, rx in _RX_RULES:
        if rx.search(full if cat in ("memory", "communication") else key):
            return cat
    return "other"


def category(names: Sequence[str]) -> np.ndarray:
    """The finer category per kernel name (first matching rule in :data:`CATEGORIES` order),
    judged on :func:`kernel_key`; memory and communication on the full name."""
    return np.array([_category(n, k) for n, k in zip(names, kernel_key(names))], dtype=object)


def is_tensor_core(names: Sequence[str]) -> np.ndarray:
    """True where a kernel name says it runs on tensor cores (MMA/HMMA/WGMMA, TF32/FP16...)."""
    return np.array([bool(_RX_TC.search(k)) for k in kernel_key(names)], dtype=bool)


def unique_classes(names: Sequence[str], hta_compat: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hta type, category, tensor-core flag) of each of the distinct ``names``."""
    return hta_type(names, hta_compat=hta_compat), category(names), is_tensor_core(names)
