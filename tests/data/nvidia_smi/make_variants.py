"""Regenerate the tiny nvidia-smi variant logs from the first rows of the real nanoGPT log.

Run from the repository root: ``python tests/data/nvidia_smi/make_variants.py``. Each variant
keeps the real timestamps, GPU indices, utilization, power and temperature of the first
``N_STAMPS`` sampling rounds (8 GPUs each) and rewrites them the way other nvidia-smi
invocations print them. Columns the real log lacks (name, memory, clocks, throttle reasons,
ECC) are filled with fixed H100 values, marked synthetic in the README.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

HERE = Path(__file__).parent
REAL = HERE / "nanogpt_8xh100_nvidia_smi.csv"
N_STAMPS = 3
NAME = "NVIDIA H100 80GB HBM3"


def real_rows() -> list[dict[str, str]]:
    with REAL.open() as f:
        rows = list(csv.DictReader(f))
    return rows[: 8 * N_STAMPS]


def ts_of(row: dict[str, str]) -> dt.datetime:
    return dt.datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00"))


def smi_local(t: dt.datetime) -> str:
    """nvidia-smi's own timestamp: local time, no zone (here the UTC wall time)."""
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def full_fields(row: dict[str, str], units: bool) -> list[str]:
    idx = int(row["gpu_index"])
    util = row["utilization_gpu_percent"].strip()
    power = row["power_W"].strip()
    mem = str(17092 + 3 * idx) if float(util) > 0 else "0"

    def u(v: str, unit: str) -> str:
        return f"{v} {unit}" if units else v

    return [
        smi_local(ts_of(row)), str(idx), NAME, u(util, "%"), u(mem, "MiB"), u("81559", "MiB"),
        u(power, "W"), row["temperature_C"].strip(), u("1980", "MHz"),
        "0x0000000000000004" if idx % 2 else "0x0000000000000001", "0",
    ]


HEADER_UNITS = ("timestamp, index, name, utilization.gpu [%], memory.used [MiB], "
                "memory.total [MiB], power.draw [W], temperature.gpu, clocks.current.sm [MHz], "
                "clocks_event_reasons.active, ecc.errors.uncorrected.volatile.total")
FIELDS = ("timestamp,index,name,utilization.gpu,memory.used,memory.total,power.draw,"
          "temperature.gpu,clocks.sm,clocks_event_reasons.active,"
          "ecc.errors.uncorrected.volatile.total")


def write(name: str, lines: list[str]) -> None:
    (HERE / name).write_text("\n".join(lines) + "\n")


def main() -> None:
    rows = real_rows()
    # --format=csv: header with units, values with units, ", " separators
    write("smi_units.csv", [HEADER_UNITS] + [", ".join(full_fields(r, True)) for r in rows])
    # --format=csv,nounits: header keeps the units, values do not
    write("smi_nounits.csv", [HEADER_UNITS] + [", ".join(full_fields(r, False)) for r in rows])
    # --format=csv,noheader: no header at all (needs --fields)
    write("smi_noheader.csv", [", ".join(full_fields(r, True)) for r in rows])
    # [N/A] / [Not Supported] / N/A cells, older driver name clocks_throttle_reasons
    lines = [HEADER_UNITS.replace("clocks_event_reasons", "clocks_throttle_reasons")]
    for i, r in enumerate(rows):
        f = full_fields(r, True)
        if i % 4 == 1:
            f[6] = "[N/A]"
        if i % 4 == 2:
            f[10] = "[Not Supported]"
        if i % 4 == 3:
            f[4] = "N/A"
        lines.append(", ".join(f))
    write("smi_na.csv", lines)
    # ISO timestamps with Z and epoch seconds, minimal field set
    write("smi_iso_z.csv", ["timestamp,index,utilization.gpu,power.draw"] + [
        f"{r['timestamp']},{r['gpu_index']},{r['utilization_gpu_percent'].strip()},"
        f"{r['power_W'].strip()}" for r in rows])
    write("smi_epoch_s.csv", ["timestamp, index, utilization.gpu [%], power.draw [W]"] + [
        f"{ts_of(r).timestamp():.3f}, {r['gpu_index']}, {r['utilization_gpu_percent'].strip()}"
        f", {r['power_W'].strip()}" for r in rows])


if __name__ == "__main__":
    main()
