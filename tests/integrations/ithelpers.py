"""Helpers shared by the integration tests (imported by name: pytest puts this folder on
sys.path)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]

#: two fake H100s: one busy in a square wave, one idle
TWO_GPUS = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 0.2}}, {}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_gpu_env(libdir: Path, tmp: Path, scenario: dict) -> dict[str, str]:
    """The environment of a child process that loads the fake libnvidia-ml.so.1."""
    path = tmp / "scenario.json"
    path.write_text(json.dumps(scenario))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env[SCENARIO_ENV] = str(path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for key in ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(key, None)
    return env


def _log_chunks(data: bytes) -> list[bytes]:
    """Records of a LevelDB-format log (what W&B's ``run-<id>.wandb`` file is): 32 KiB
    blocks, each record a 7-byte header (crc32c, length, type FULL/FIRST/MIDDLE/LAST)."""
    import struct

    assert data[:4] == b":W&B", data[:8]  # W&B's 7-byte file header: ident, magic, version
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length:  # the writer is still writing this record
            break
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            out.append(buf + chunk)
            buf = b""
    return out


class WandbRun:
    """What one offline W&B run directory holds, read back from its ``.wandb`` file with
    W&B's own protobuf messages."""

    def __init__(self, path: Path) -> None:
        from wandb.proto import wandb_internal_pb2 as pb

        self.path = path
        self.records = []
        for chunk in _log_chunks(path.read_bytes()):
            r = pb.Record()
            r.ParseFromString(chunk)
            self.records.append(r)

    def of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.records if r.WhichOneof("record_type") == kind]

    @staticmethod
    def _key(item) -> str:  # type: ignore[no-untyped-def]
        return item.key or ".".join(item.nested_key)

    @property
    def run_id(self) -> str:
        return str(self.of("run")[0].run_id)

    @property
    def tags(self) -> list[str]:
        return list(self.of("run")[-1].tags)

    @property
    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for s in self.of("summary"):
            for u in s.update:
                out[self._key(u)] = json.loads(u.value_json)
        return out

    @property
    def config(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for c in self.of("config"):
            for u in c.update:
                out[self._key(u)] = json.loads(u.value_json)
        return out

    @property
    def history(self) -> list[dict[str, object]]:
        return [{self._key(i): json.loads(i.value_json) for i in h.item}
                for h in self.of("history")]

    @property
    def exit_code(self) -> int | None:
        exits = self.of("exit")
        return int(exits[-1].exit_code) if exits else None


def wandb_runs(root: Path, run_id: str, timeout_s: float = 120.0) -> list[WandbRun]:
    """Every offline run directory under ``root`` for ``run_id``, oldest first, once each
    file holds its exit record: ``run.finish()`` returns before W&B's writer process has
    written the last records, so the reader waits for them (bounded)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        paths = sorted(root.rglob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
        runs = [WandbRun(p) for p in paths]
        if (runs and all(r.exit_code is not None for r in runs)) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)
