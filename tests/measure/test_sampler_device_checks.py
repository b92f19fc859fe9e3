"""The shape checks of benchmarks/device/h200_check.py, on synthetic tables (no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuaudit.schema import build_table

_PATH = Path(__file__).parents[2] / "benchmarks" / "device" / "h200_check.py"
_spec = importlib.util.spec_from_file_location("h200_check", _PATH)
assert _spec and _spec.loader
h200 = importlib.util.module_from_spec(_spec)
sys.modules["h200_check"] = h200
_spec.loader.exec_module(h200)


def _table(util: np.ndarray, gpm: bool = True):
    n = util.size
    rng = np.random.default_rng(0)
    cols = {"ts": np.arange(n, dtype=np.int64) * 10**8, "host": ["h"] * n,
            "gpu_uuid": ["GPU-0"] * n, "gpu_index": np.zeros(n, np.int16),
            "util_gpu_pct": util.astype(np.float32),
            "power_w": (100 + 5 * util + rng.normal(0, 1, n)).clip(0).astype(np.float32)}
    if gpm:
        for c in ("sm_active", "tensor_active", "dram_active"):
            cols[c] = (util / 100 * 0.5).astype(np.float32)
    return build_table(cols)


def test_busy_table_passes_as_bf16_and_fails_as_idle() -> None:
    t = _table(np.full(150, 99.0))
    assert h200.check("bf16", t) == []
    assert any("idle" in p for p in h200.check("idle", t))


def test_too_few_samples_or_no_gpm_fail() -> None:
    assert "want >= 100" in h200.check("idle", _table(np.zeros(50)))[0]
    problems = h200.check("idle", _table(np.zeros(150), gpm=False))
    assert any("GPM column" in p for p in problems)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_starved_shape_is_bouncing_low_util(seed: int) -> None:
    rng = np.random.default_rng(seed)
    util = np.where(rng.random(200) < 0.3, 100.0, 0.0)
    assert h200.check("starved", _table(util)) == []
    assert h200.check("starved", _table(np.full(200, 30.0)))  # steady: no bounce
