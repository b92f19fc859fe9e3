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
_COMM_NEEDLES = ("ccl", "all", "reduce")  # in every match of _COMM (lowercase)
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


class _Rx:
    """A pattern; a case-insensitive one (``(?i)``) also compiled for ASCII-lowercased text.

    Python's :mod:`re` is 5-10x slower on ``(?i)`` alternations (no first-character
    prefilter), and kernel names run to thousands of characters. For ASCII text, matching
    ``(?i)P`` on ``text`` is matching ``P.lower()`` on ``text.lower()`` (the patterns use only
    lowercase escapes: ``\\d \\s \\w \\b``); non-ASCII text takes the original pattern,
    whose Unicode case folding differs (the Kelvin sign matches ``k``). ``needles``: lowercase
    substrings of which every match contains one (a cheap test before the search).
    """

    def __init__(self, pattern: str, needles: tuple[str, ...] = ()) -> None:
        self.rx = re.compile(pattern)
        self.needles = needles
        self.low: re.Pattern[str] | None = None
        if pattern.startswith("(?i)"):
            if re.search(r"\\[A-Z]", pattern):
                raise ValueError(f"uppercase escape in a case-insensitive pattern: {pattern}")
            self.low = re.compile(pattern[4:].lower())

    def search(self, text: str, low: str | None) -> bool:
        """Whether the pattern occurs in ``text`` (``low``: ``text.lower()`` when ASCII)."""
        if low is not None and self.low is not None:
            if self.needles and not any(w in low for w in self.needles):
                return False
            return self.low.search(low) is not None
        return self.rx.search(text) is not None


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _lower(texts: Sequence[str]) -> list[str | None]:
    return [t.lower() if t.isascii() else None for t in texts]


_RX_HTA_COMM, _RX_COMM = _Rx(_HTA_COMM), _Rx(_COMM, _COMM_NEEDLES)
_RX_MEMORY, _RX_NOT_COMPUTE = _Rx(_MEMORY), _Rx(_HTA_NOT_COMPUTE)
_RX_RULES = tuple((cat, _RX_COMM if rx == _COMM else _Rx(rx)) for cat, rx in _CATEGORY_RULES)
_RX_TC = _Rx(_TENSOR_CORE)
_RX_VOID, _RX_KEY, _RX_NS = _rx(r"^void\s+"), _rx(r"^([^<(]*)(?:<([^,<>(]*))?.*$"), _rx(
    r"(?<![A-Za-z0-9_])[A-Za-z0-9_]*::")  # the lookbehind skips mid-word starts (no match
# can begin there that could not begin at the word's start): linear, not quadratic, time


def hta_type(names: Sequence[str], *, hta_compat: bool = False) -> np.ndarray:
    """HTA kernel type per name: COMMUNICATION, MEMORY, COMPUTATION or OTHER.

    OTHER is HTA's name for ``*Sync`` events and non-NCCL names its compute regex rejects.
    """
    comm = _RX_HTA_COMM if hta_compat else _RX_COMM
    out = [COMMUNICATION if comm.search(n, lo) else MEMORY if _RX_MEMORY.search(n, lo)
           else OTHER if _RX_NOT_COMPUTE.search(n, lo) else COMPUTATION
           for n, lo in zip(names, _lower(names))]
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


def _category(full: str, full_low: str | None, key: str, key_low: str | None) -> str:
    for cat, rx in _RX_RULES:
        if (rx.search(full, full_low) if cat in ("memory", "communication")
                else rx.search(key, key_low)):
            return cat
    return "other"


def _categories(names: Sequence[str], keys: Sequence[str]) -> np.ndarray:
    return np.array([_category(n, nl, k, kl) for n, nl, k, kl in
                     zip(names, _lower(names), keys, _lower(keys))], dtype=object)


def category(names: Sequence[str]) -> np.ndarray:
    """The finer category per kernel name (first matching rule in :data:`CATEGORIES` order),
    judged on :func:`kernel_key`; memory and communication on the full name."""
    return _categories(names, kernel_key(names))


def _tensor_core(keys: Sequence[str]) -> np.ndarray:
    return np.array([_RX_TC.search(k, kl) for k, kl in zip(keys, _lower(keys))], dtype=bool)


def is_tensor_core(names: Sequence[str]) -> np.ndarray:
    """True where a kernel name says it runs on tensor cores (MMA/HMMA/WGMMA, TF32/FP16...)."""
    return _tensor_core(kernel_key(names))


def unique_classes(names: Sequence[str], hta_compat: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hta type, category, tensor-core flag) of each of the distinct ``names``."""
    keys = kernel_key(names)
    return hta_type(names, hta_compat=hta_compat), _categories(names, keys), _tensor_core(keys)
