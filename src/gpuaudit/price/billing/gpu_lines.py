"""Which bill lines are GPU lines: instance types and SKUs found in the price catalog.

A line is a GPU line when its SKU text (usage type, instance type, SKU id and description;
see ``readers.CANONICAL``) names an instance of the catalog as a whole token
(``USE1-BoxUsage:p4d.24xlarge``, ``a3-highgpu-8g``, ``Standard_ND96isr_H100_v5`` or
``ND96isr H100 v5``, ``gpu_8x_h100_sxm``), or is a per-GPU SKU that says so
(``Nvidia Tesla A100 GPU running in Americas``: one GPU per unit). The catalog row gives the
GPU model and the GPUs per instance. Nothing is guessed from prices or names alone: a line
that names no catalog instance is a non-GPU line, summed and shown apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpuaudit.price.catalog import CatalogEntry, embedded_catalog, gpu_family

__all__ = ["GpuSku", "match_sku", "match_skus"]


@dataclass(frozen=True)
class GpuSku:
    """What a GPU line's SKU text resolved to."""

    instance: str
    gpu_model: str
    gpus_per_instance: int
    catalog_provider: str
    per_gpu: bool = False  # the SKU is billed per GPU (quantity = GPU-hours)


def _compact(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


@lru_cache(maxsize=4)
def _patterns(entries: tuple[CatalogEntry, ...]) -> list[tuple[re.Pattern[str], int, GpuSku]]:
    """(pattern, specificity, sku) for each catalog instance, most specific first."""
    out: list[tuple[re.Pattern[str], int, GpuSku]] = []
    for e in entries:
        sku = GpuSku(e.instance, e.gpu_model, e.gpus_per_instance, e.provider)
        name = e.instance.strip()
        pats = [re.escape(name.lower())]
        if e.provider == "azure":  # Standard_ND96isr_H100_v5 also reads "ND96isr H100 v5"
            bare = re.sub(r"^standard_", "", name.lower())
            pats.append(r"[ _]?".join(re.escape(p) for p in bare.split("_")))
        for p in pats:
            out.append((re.compile(rf"(?<![a-z0-9.]){p}(?![a-z0-9])"), len(p), sku))
    out.sort(key=lambda t: -t[1])
    return out


_PER_GPU = re.compile(r"\bnvidia\b.*\bgpu\b|\bgpu\b.*\bnvidia\b")


def match_sku(text: str | None, entries: Sequence[CatalogEntry] | None = None
              ) -> GpuSku | None:
    """The catalog instance (or per-GPU SKU) a line's SKU text names, or None."""
    if not text:
        return None
    low = text.lower()
    for pat, _n, sku in _patterns(tuple(entries if entries is not None else embedded_catalog())):
        if pat.search(low):
            return sku
    if _PER_GPU.search(low):
        fam = gpu_family(text)
        if fam is not None:
            return GpuSku(instance=f"{fam} (per GPU)", gpu_model=fam, gpus_per_instance=1,
                          catalog_provider="", per_gpu=True)
    return None


def match_skus(texts: Iterable[str | None],
               entries: Sequence[CatalogEntry] | None = None) -> dict[str, GpuSku]:
    """``match_sku`` over the distinct SKU texts of a bill; the GPU ones only."""
    out: dict[str, GpuSku] = {}
    for t in texts:
        if t is None or t in out:
            continue
        m = match_sku(t, entries)
        if m is not None:
            out[t] = m
    return out
