"""What a GPU model is: its family, memory and form read from a name, and its datasheet figures.

Rank 0, beside the schema: the diagnosis (classify) judges PCIe, NVLink and DRAM traffic as a
share of the GPU's own link and memory bandwidth, the catalog (price) matches a measured model
name to a price row, and capacity planning sizes work against memory and peak FLOP/s. One
parser of model names serves them all, so ``NVIDIA A100-SXM4-80GB`` (NVML), ``A100 80GB SXM``
(the catalog) and ``a100`` (a user's ``--gpu-model``) mean the same GPU everywhere.

The figures live in ``data/gpu_specs.csv``, one row per model, each with its source (NVIDIA's
datasheets). Tensor FLOP/s are dense: NVIDIA quotes "with sparsity" figures at twice that.
Bandwidths are per direction, as DCGM and NVML count bytes (``DCGM_FI_PROF_PCIE_TX_BYTES``
and ``_RX_BYTES`` separately); datasheets quote NVLink bidirectional, so the table halves it.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from gpuaudit.errors import InputError

__all__ = [
    "MIG_COMPUTE_SLICES",
    "MIG_MEMORY_SLICES",
    "MPS_MAX_CLIENTS",
    "TIME_SLICING_DEFAULT_REPLICAS",
    "GpuSpec",
    "MigProfile",
    "form_factor",
    "gpu_family",
    "gpu_specs",
    "memory_gb",
    "mig_layout_problem",
    "mig_profiles",
    "spec_for",
]

SPECS_FILE = "gpu_specs.csv"
MIG_FILE = "mig_profiles.csv"

#: A MIG-capable GPU (A100, H100, H200, GH200, B200) is cut into 8 memory slices and 7 compute
#: slices; a GPU instance occupies a contiguous run of memory slices starting at one of its
#: profile's placements (NVIDIA MIG User Guide, "Supported MIG Profiles"; NVML
#: ``nvmlDeviceGetGpuInstancePossiblePlacements``: "creation of a new GPU instance will fail if
#: there is overlap with the already occupied memory slices").
MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7

#: CUDA MPS: at most 48 client processes per device on Volta and newer (16 before Volta)
#: (NVIDIA Multi-Process Service guide, docs.nvidia.com/deploy/mps, "Limitations").
MPS_MAX_CLIENTS = 48
MPS_SOURCE = ("NVIDIA Multi-Process Service guide (docs.nvidia.com/deploy/mps): up to 48 "
              "clients per device on Volta and newer; memory is not isolated unless "
              "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is set, compute shares via "
              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")

#: Time-slicing has no replica limit of its own; 4 is the replicas value of NVIDIA's GPU
#: Operator example ("Time-Slicing GPUs in Kubernetes"), which also says replicas share memory
#: and faults: "unlike MIG, there is no memory or fault-isolation between replicas".
TIME_SLICING_DEFAULT_REPLICAS = 4
TIME_SLICING_SOURCE = ("NVIDIA GPU Operator, Time-Slicing GPUs in Kubernetes "
                       "(docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/"
                       "gpu-sharing.html): replicas: 4 in the example config; no memory or "
                       "fault isolation between replicas")

# Longest names first so "L40S" wins over "L4", "GH200" over "H200", "A10G" over "A10".
FAMILIES = ("GH200", "B200", "H200", "H100", "A100", "L40S", "L40", "A10G", "A10", "L4",
            "V100", "T4")


def gpu_family(name: str) -> str | None:
    """The GPU family in a model name (``NVIDIA A100-SXM4-80GB`` -> ``A100``), or None."""
    up = name.upper().replace("-", " ").replace("_", " ")
    for fam in FAMILIES:
        if re.search(rf"(?<![A-Z0-9]){fam}(?![0-9])", up):
            if fam == "L40" and "L40S" in up:
                continue
            return fam
    return None


def memory_gb(name: str) -> int | None:
    """The memory size a model name states (``A100-SXM4-80GB`` -> 80), or None."""
    # "A10G 24GB" is 24 GB: digits inside a model name ("10G") are not a size
    m = re.search(r"(?<![A-Z0-9])(\d{2,3})\s*GI?B\b", name.upper().replace("-", " "))
    return int(m.group(1)) if m else None


def form_factor(name: str) -> str | None:
    """``NVL``, ``PCIE`` or ``SXM`` from a model name (NVML's ``HBM3`` names are SXM boards)."""
    up = name.upper()
    if "NVL" in up:
        return "NVL"
    if "PCIE" in up:
        return "PCIE"
    if "SXM" in up or "HBM3" in up or "HGX" in up:
        return "SXM"
    return None


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet figures. None where the chip has no such unit or link.

    ``bf16_dense_tflops`` is None on chips without bf16 tensor cores (V100, T4), so a rule
    asking "could this job use bf16?" can tell. ``host_link`` names the CPU link (``pcie3``,
    ``pcie4``, ``pcie5``, ``nvlink-c2c``); ``mig_max_instances`` is 0 where MIG is absent.
    """

    gpu_model: str
    family: str
    memory_gb: float
    memory_bandwidth_gb_per_s: float
    fp32_tflops: float
    fp16_dense_tflops: float | None
    bf16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    host_link: str
    host_link_gb_per_s_per_direction: float
    nvlink_gb_per_s_per_direction: float | None
    tdp_w: float | None
    mig_max_instances: int
    source: str

    @property
    def host_link_bytes_per_s(self) -> float:
        return self.host_link_gb_per_s_per_direction * 1e9

    @property
    def nvlink_bytes_per_s(self) -> float | None:
        n = self.nvlink_gb_per_s_per_direction
        return None if n is None else n * 1e9

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gb_per_s * 1e9


def _number(row: dict[str, str], column: str, line: int) -> float | None:
    text = row[column].strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{column} {text!r} is not a number", where=f"{SPECS_FILE}:{line}",
                         fix="write the datasheet figure as a plain number") from None


@lru_cache(maxsize=1)
def gpu_specs() -> tuple[GpuSpec, ...]:
    """Every row of the embedded spec table, in file order (a family's common board first)."""
    text = resources.files("gpuaudit").joinpath("data").joinpath(SPECS_FILE).read_text(encoding="utf-8")
    out = []
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        family = gpu_family(row["gpu_model"])
        if family is None:
            raise InputError(f"model {row['gpu_model']!r} names no known GPU family",
                             where=f"{SPECS_FILE}:{line}", fix=f"use one of {FAMILIES}")

        def num(col: str, _row: dict[str, str] = row, _line: int = line) -> float | None:
            return _number(_row, col, _line)

        def need(col: str, _row: dict[str, str] = row, _line: int = line) -> float:
            value = _number(_row, col, _line)
            if value is None:
                raise InputError(f"{col} is empty", where=f"{SPECS_FILE}:{_line}",
                                 fix="every model needs this figure")
            return value

        out.append(GpuSpec(
            gpu_model=row["gpu_model"], family=family,
            memory_gb=need("memory_gb"),
            memory_bandwidth_gb_per_s=need("memory_bandwidth_gb_per_s"),
            fp32_tflops=need("fp32_tflops"),
            fp16_dense_tflops=num("fp16_dense_tflops"),
            bf16_dense_tflops=num("bf16_dense_tflops"),
            fp8_dense_tflops=num("fp8_dense_tflops"),
            host_link=row["host_link"].strip(),
            host_link_gb_per_s_per_direction=need("host_link_gb_per_s_per_direction"),
            nvlink_gb_per_s_per_direction=num("nvlink_gb_per_s_per_direction"),
            tdp_w=num("tdp_w"),
            mig_max_instances=int(need("mig_max_instances")),
            source=row["source"].strip(),
        ))
    return tuple(out)


@lru_cache(maxsize=256)
def spec_for(model: str | None) -> GpuSpec | None:
    """The spec row for a model name, or None where its family is not in the table.

    Matching as the price catalog matches: the exact name, else the family narrowed by the
    memory size and then the form the name states; where several rows remain, the family's
    first row (its most common board) answers. Remembered per name (the table is fixed; a
    1,000-GPU report's rules ask ~2,000 times for one or two names).
    """
    if not model:
        return None
    rows = gpu_specs()
    exact = [s for s in rows if s.gpu_model.lower() == model.strip().lower()]
    if exact:
        return exact[0]
    family = gpu_family(model)
    cands = [s for s in rows if s.family == family]
    if not cands:
        return None
    mem = memory_gb(model)
    if mem is not None:
        cands = [s for s in cands if memory_gb(s.gpu_model) == mem] or cands
    form = form_factor(model)
    if form is not None:
        cands = [s for s in cands if form_factor(s.gpu_model) == form] or cands
    return cands[0]


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of one board (``data/mig_profiles.csv``).

    ``memory_slices`` of 8 and ``compute_slices`` of 7; ``placements`` are the memory slices
    an instance may start at (an instance occupies ``[start, start + memory_slices)``);
    ``max_instances`` how many of this profile alone fit one GPU.
    """

    board: str
    name: str
    memory_slices: int
    compute_slices: int
    max_instances: int
    placements: tuple[int, ...]
    source: str

    @property
    def memory_gb(self) -> float:
        """The memory the name states (``3g.40gb`` -> 40)."""
        return float(self.name.split(".")[1].removesuffix("gb"))

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / MIG_COMPUTE_SLICES


@lru_cache(maxsize=1)
def _mig_rows() -> tuple[MigProfile, ...]:
    text = resources.files("gpuaudit").joinpath("data").joinpath(MIG_FILE).read_text(encoding="utf-8")
    out = []
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            prof = MigProfile(
                board=row["board"].strip(), name=row["profile"].strip(),
                memory_slices=int(row["memory_slices"]), compute_slices=int(row["compute_slices"]),
                max_instances=int(row["max_instances"]),
                placements=tuple(int(x) for x in row["placements"].split()),
                source=row["source"].strip())
        except ValueError:
            raise InputError("a slice count or placement is not an integer",
                             where=f"{MIG_FILE}:{line}",
                             fix="write slices and placements as whole numbers") from None
        out.append(prof)
    return tuple(out)


def mig_profiles(model: str | None) -> tuple[MigProfile, ...]:
    """The MIG profiles of a GPU model, smallest first; () where the model has no MIG.

    Matched by family and memory size, as :func:`spec_for` matches (``H100`` means the 80 GB
    board, the family's first row).
    """
    spec = spec_for(model)
    if spec is None or spec.mig_max_instances == 0:
        return ()
    mem = round(spec.memory_gb)
    rows = [p for p in _mig_rows() if gpu_family(p.board) == spec.family
            and memory_gb(p.board) == mem]
    return tuple(sorted(rows, key=lambda p: (p.memory_slices, p.compute_slices)))


def mig_layout_problem(layout: list[tuple[MigProfile, int]]) -> str | None:
    """Why a set of (profile, start slice) instances is not a layout NVIDIA allows, or None.

    Rules: every start is one of the profile's placements, instances' memory slices do not
    overlap, no profile exceeds its instance count, and compute slices total at most 7.
    """
    used = [False] * MIG_MEMORY_SLICES
    counts: dict[str, int] = {}
    compute = 0
    for prof, start in layout:
        if start not in prof.placements:
            return f"{prof.name} cannot start at memory slice {start} (allowed {prof.placements})"
        for i in range(start, start + prof.memory_slices):
            if i >= MIG_MEMORY_SLICES or used[i]:
                return f"{prof.name} at {start} overlaps memory slice {i}"
            used[i] = True
        counts[prof.name] = counts.get(prof.name, 0) + 1
        if counts[prof.name] > prof.max_instances:
            return f"more than {prof.max_instances} x {prof.name}"
        compute += prof.compute_slices
    if compute > MIG_COMPUTE_SLICES:
        return f"{compute} compute slices > {MIG_COMPUTE_SLICES}"
    return None
