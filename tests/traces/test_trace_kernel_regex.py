"""Kernel-name classification: the fast forms of the regexes decide exactly as the originals."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.traces import kernels as K

PATTERNS = [K._HTA_COMM, K._COMM, K._MEMORY, K._HTA_NOT_COMPUTE, K._TENSOR_CORE,
            *(rx for _, rx in K._CATEGORY_RULES)]
# fragments of real kernel names, in any case, glued together
FRAGMENTS = ["void ", "nccl", "NCCL", "Rccl", "DevKernel", "Kernel", "all_reduce", "AllGather",
             "reduce_scatter", "alltoall", "cross_device_reduce", "Memcpy", "memset", "dma",
             "Sync", "gemm", "Gemm", "sm80_", "_tn", "hmma", "h884gemm", "s1688", "_MI32x32x8",
             "flash", "fmha", "conv", "nchw", "NhwcToNchw", "cudnn::", "softmax", "norm",
             "elementwise", "<", ">", "(", ")", ",", ":", "::", " ", "_", "x", "8", "at::",
             "native::", "(anonymous namespace)", "Cijk_", "bmm", "triton_mm"]
ascii_names = st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(ascii_names)
def test_lowercased_search_decides_as_the_original(name: str) -> None:
    for p in PATTERNS:
        fast = K._Rx(p, K._COMM_NEEDLES if p == K._COMM else ())
        assert fast.search(name, name.lower()) == bool(re.search(p, name)), p


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab_1:< \u212a")), max_size=30))
def test_namespace_strip_and_non_ascii_match_the_original(name: str) -> None:
    assert K._RX_NS.sub("", name) == re.sub(r"[A-Za-z0-9_]*::", "", name)
    low = name.lower() if name.isascii() else None
    for p in PATTERNS:
        assert K._Rx(p).search(name, low) == bool(re.search(p, name)), p


def test_kelvin_sign_takes_the_unicode_path() -> None:
    """``(?i)`` folds U+212A KELVIN SIGN to k; ``str.lower`` also does, but the fast path is
    only for ASCII text, so both agree either way."""
    name = "ncclDev\u212aernel_AllReduce"
    assert K.hta_type([name])[0] == K.COMMUNICATION
    assert bool(re.search(K._COMM, name))


def test_classes_of_real_names_unchanged() -> None:
    names = ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
             "ampere_fp16_s1688gemm_fp16_128x128_ldg8_f2f_stages_32x1_nn",
             "void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)",
             "Memcpy HtoD (Pageable -> Device)", "cudaDeviceSynchronize"]
    hta, cat, tc = K.unique_classes(names)
    assert list(hta) == ["COMPUTATION", "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"]
    assert list(cat)[:4] == ["elementwise", "gemm", "communication", "memory"]
    assert list(tc) == [False, True, False, False, False]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ProfilerStep#DataLoadr_:.() 0123é")), max_size=40))
def test_span_selection_tests_equal_the_span_pattern(name: str) -> None:
    """The selector's two string tests keep exactly the names ``_SPAN_NAME`` matches."""
    from gpuaudit.traces.loader import _DATALOADER, _SPAN_NAME, _STEP_PREFIX

    assert (name.startswith(_STEP_PREFIX) or _DATALOADER in name) == bool(
        _SPAN_NAME.search(name))
