"""GPU health: ECC double-bit errors, XID errors, thermal and power throttling.

Reads ``ecc_dbe_total`` (NVML nvmlDeviceGetTotalEccErrors, volatile uncorrected /
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL), ``xid`` (DCGM_FI_DEV_XID_ERRORS), ``clocks_event_reasons``
(nvmlDeviceGetCurrentClocksEventReasons) and ``temp_c``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuaudit.classify.usage import SeriesSignals

__all__ = ["HealthIssue", "check_health"]

HOT_TEMP_C = 85.0
THROTTLE_SHARE = 0.05


@dataclass(frozen=True)
class HealthIssue:
    """``severity`` is ``critical`` (ECC DBE, XID) or ``warning`` (throttling, heat)."""

    gpu_uuid: str
    kind: str
    severity: str
    evidence: str


def check_health(series: Sequence[SeriesSignals]) -> tuple[HealthIssue, ...]:
    out: list[HealthIssue] = []
    for s in series:
        if s.ecc_dbe_delta:
            out.append(HealthIssue(s.gpu_uuid, "ecc_dbe", "critical",
                                   f"{s.ecc_dbe_delta} new double-bit ECC error(s) during the "
                                   "window: drain the GPU and reset or replace it"))
        if s.xid_codes:
            out.append(HealthIssue(s.gpu_uuid, "xid", "critical",
                                   f"XID error(s) {', '.join(map(str, s.xid_codes))}: see "
                                   "NVIDIA's XID catalog for the action"))
        if s.observed_s > 0 and s.thermal_throttle_s / s.observed_s >= THROTTLE_SHARE:
            out.append(HealthIssue(s.gpu_uuid, "thermal_throttle", "warning",
                                   f"thermal slowdown {s.thermal_throttle_s / s.observed_s:.0%} "
                                   "of the time: check cooling and airflow"))
        if s.observed_s > 0 and s.power_throttle_s / s.observed_s >= THROTTLE_SHARE:
            out.append(HealthIssue(s.gpu_uuid, "power_throttle", "warning",
                                   f"power capped {s.power_throttle_s / s.observed_s:.0%} of "
                                   "the time: check the power limit"))
        if s.max_temp_c is not None and s.max_temp_c > HOT_TEMP_C:
            out.append(HealthIssue(s.gpu_uuid, "hot", "warning",
                                   f"peak temperature {s.max_temp_c:.0f} C (> {HOT_TEMP_C:.0f} C)"))
    return tuple(out)
