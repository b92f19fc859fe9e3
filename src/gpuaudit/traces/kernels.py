"""Kernel classes from kernel names (CUDA, cuDNN, cuBLAS, CUTLASS, NCCL, ROCm).

Two taxonomies:

* HTA's three types (``COMPUTATION``, ``COMMUNICATION``, ``MEMORY``), by name regex as in
  HolisticTraceAnalysis 0.5.0 (``hta.utils.utils.get_kernel_type``), with ``hta_compat``
  reproducing its fault that ``void ncclDevKernel_*`` (NCCL >= 2.19) counts as computation
  (HTA issues #122, #247). Without it any ``nccl``/``rccl`` kernel is communication.
* A finer category for the kernel breakdown: gemm, convolution, attention, elementwise,
  reduction, communication, memory, other; and whether a matmul-class kernel uses tensor
  cores (hmma/wgmma/tensorop/xmma ... versus plain ``sgemm``).

All functions work on Arrow string arrays (vectorised regex), never per kernel in Python.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

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


def hta_type(names: pa.Array | pa.ChunkedArray, *, hta_compat: bool = False) -> pa.Array:
    """HTA kernel type per name: COMMUNICATION, MEMORY, COMPUTATION or OTHER.

    OTHER is HTA's name for ``*Sync`` events and non-NCCL names its compute regex rejects.
    """
    names = _combine(names)
    comm = pc.match_substring_regex(names, _HTA_COMM if hta_compat else _COMM)
    mem = pc.match_substring_regex(names, _MEMORY)
    not_compute = pc.match_substring_regex(names, _HTA_NOT_COMPUTE)
    out = pc.if_else(comm, COMMUNICATION,
                     pc.if_else(mem, MEMORY, pc.if_else(not_compute, OTHER, COMPUTATION)))
    return _combine(out)


def kernel_key(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The part of a demangled kernel name that says what it does: the function's own name
    plus its first template argument, namespaces dropped. ``void cutlass::Kernel<cutlass_80_
    tensorop_s1688gemm_...>(Params)`` -> ``Kernel cutlass_80_tensorop_s1688gemm_...``;
    argument lists (``fbgemm_gpu::...`` types in an embedding kernel) no longer count."""
    s = pc.replace_substring(_combine(names), "(anonymous namespace)", "anon")
    s = pc.replace_substring_regex(s, r"^void\s+", "")
    s = pc.replace_substring_regex(s, r"^([^<(]*)(?:<([^,<>(]*))?.*$", r"\1 \2")
    return _combine(pc.replace_substring_regex(s, r"[A-Za-z0-9_]*::", ""))


def category(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The finer category per kernel name (first matching rule in :data:`CATEGORIES` order),
    judged on :func:`kernel_key`; memory and communication on the full name."""
    full = _combine(names)
    names = kernel_key(full)
    out: pa.Array = pa.array(["other"] * len(names), pa.string())
    for cat, rx in reversed(_CATEGORY_RULES):
        target = full if cat in ("memory", "communication") else names
        out = pc.if_else(pc.match_substring_regex(target, rx), cat, out)
    return _combine(out)


def is_tensor_core(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """True where a kernel name says it runs on tensor cores (MMA/HMMA/WGMMA, TF32/FP16...)."""
    return _combine(pc.match_substring_regex(kernel_key(names), _TENSOR_CORE))


def unique_classes(names: pa.Array | pa.ChunkedArray,
                   hta_compat: bool = False) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """Classify the distinct names once: returns (indices into uniques, hta type, category,
    tensor-core flag), each class array aligned with the unique names."""
    enc = pc.dictionary_encode(_combine(names))
    uniq = enc.dictionary
    return (enc.indices, hta_type(uniq, hta_compat=hta_compat), category(uniq),
            is_tensor_core(uniq))


def _combine(a: pa.Array | pa.ChunkedArray | pa.Scalar) -> pa.Array:
    if isinstance(a, pa.ChunkedArray):
        return a.combine_chunks()
    assert isinstance(a, pa.Array)
    return a
