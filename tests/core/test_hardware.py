"""gpuaudit.hardware: one model-name parser and the datasheet table every stage reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.hardware import form_factor, gpu_family, gpu_specs, memory_gb, spec_for
from gpuaudit.price.catalog import embedded_catalog


def test_every_catalog_model_has_a_spec_of_its_family_and_memory():
    for entry in embedded_catalog():
        spec = spec_for(entry.gpu_model)
        assert spec is not None, entry.gpu_model
        assert spec.family == gpu_family(entry.gpu_model)
        mem = memory_gb(entry.gpu_model)
        if mem is not None:
            assert spec.memory_gb == mem, (entry.gpu_model, spec.gpu_model)


@pytest.mark.parametrize(("nvml_name", "expected"), [
    ("NVIDIA H100 80GB HBM3", "H100 80GB SXM"),
    ("NVIDIA H100 PCIe", "H100 80GB PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL 94GB"),
    ("NVIDIA H200", "H200 141GB SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
    ("Tesla V100-SXM2-16GB", "V100 16GB SXM2"),
    ("Tesla T4", "T4 16GB"),
    ("NVIDIA A10G", "A10G 24GB"),
    ("NVIDIA L4", "L4 24GB"),
    ("NVIDIA L40S", "L40S 48GB"),
    ("NVIDIA GH200 480GB", "GH200 96GB"),
    ("NVIDIA B200", "B200 180GB"),
])
def test_nvml_names_resolve_to_their_board(nvml_name, expected):
    spec = spec_for(nvml_name)
    assert spec is not None and spec.gpu_model == expected


def test_unknown_models_have_no_spec():
    assert spec_for("AMD Instinct MI250X") is None
    assert spec_for("") is None
    assert spec_for(None) is None


def test_table_is_self_consistent():
    names = [s.gpu_model for s in gpu_specs()]
    assert len(names) == len(set(names))
    for s in gpu_specs():
        assert s.source, s.gpu_model
        assert s.memory_gb > 0 and s.memory_bandwidth_gb_per_s > 0 and s.fp32_tflops > 0
        assert s.host_link in {"pcie3", "pcie4", "pcie5", "nvlink-c2c"}
        # tensor formats get faster as they narrow: fp32 < fp16/bf16 < fp8
        for narrow in (s.fp16_dense_tflops, s.bf16_dense_tflops):
            if narrow is not None:
                assert narrow > s.fp32_tflops, s.gpu_model
        if s.fp8_dense_tflops is not None:
            assert s.bf16_dense_tflops is not None
            assert s.fp8_dense_tflops > s.bf16_dense_tflops, s.gpu_model
        assert (s.mig_max_instances == 7) == (s.family in {"A100", "H100", "H200", "GH200",
                                                          "B200"}), s.gpu_model
        assert form_factor(s.gpu_model) in {None, "SXM", "PCIE", "NVL"}


def test_bf16_is_absent_where_the_chip_has_none():
    for name in ("Tesla V100-SXM2-16GB", "Tesla T4"):
        spec = spec_for(name)
        assert spec is not None and spec.bf16_dense_tflops is None


@given(st.text(max_size=40))
def test_any_name_resolves_or_is_none_never_raises(name):
    spec = spec_for(name)
    assert spec is None or spec.family == gpu_family(name) or spec.gpu_model.lower() == name.strip().lower()
