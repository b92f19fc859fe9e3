"""A synthetic but realistically labelled GPU fleet history, and a real Prometheus holding it.

Label sets are those of the real dcgm-exporter captures in tests/data/dcgm (L4 kops: gpu,
UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION), as Prometheus stores
them with the Helm chart's ``honorLabels: false``: the target's own pod/namespace/container
(the exporter pod) plus ``exported_pod``/``exported_namespace``/``exported_container`` for
GPUs a workload holds, and nothing for unheld GPUs. One GPU is time-sliced between two pods
(two series at once), one is split into MIG instances (GR_ENGINE_ACTIVE only, no GPU_UTIL),
one node misses scrapes for a while (unobserved time). kube-state-metrics ``kube_pod_labels``
carries the tagging policy (``label_team_id``, ``label_project_id``, ``label_user_id``) for
some pods. Used by tests/fleet and benchmarks/bench_fleet.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa

from gpuaudit.schema import build_table

DAY_S = 86_400
TEAMS = ("vision", "nlp", "recsys")
#: namespaces; "sandbox" is mapped by no one (unattributed), team-* via the mapping file
NAMESPACES = ("team-vision", "team-nlp", "team-recsys", "sandbox")


@dataclass
class Series:
    metric_labels: dict[str, str]
    ts_s: np.ndarray  # int seconds
    util: np.ndarray  # percent
    mig: bool
    pod: str | None
    namespace: str | None
    host: str
    uuid: str
    share: float | None


@dataclass
class Fleet:
    start_s: int
    end_s: int  # last step
    step_s: int
    series: list[Series]
    pods: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # kube labels
    #: node_exporter beside dcgm-exporter: host -> base CPU busy fraction (None: not scraped).
    #: Step k's busy fraction is base + 0.3 on odd steps (see :meth:`node_busy`).
    node_cpu: dict[str, float] | None = None

    def node_busy(self, host: str, ts_s: np.ndarray) -> np.ndarray:
        """The host's CPU busy fraction over the scrape interval ending at ``ts_s``."""
        assert self.node_cpu is not None
        k = (np.asarray(ts_s, dtype=np.int64) - self.start_s) // self.step_s
        return np.minimum(self.node_cpu[host] + 0.3 * (k % 2), 1.0)

    def _node_metrics(self, f: object, t0: int, t1: int, unit: str = "") -> int:
        """node_exporter's node_cpu_seconds_total (2 CPUs; user, system, idle, iowait) and
        node_uname_info, scraped at every step; instance 10.0.<node>.5:9100."""
        if not self.node_cpu:
            return 0
        write = f.write  # type: ignore[attr-defined]
        ts = np.arange(self.start_s, self.end_s + 1, self.step_s, dtype=np.int64)
        keep = (ts >= t0) & (ts < t1)
        n = 0
        write("# TYPE node_cpu_seconds_total gauge\n")
        for node, host in enumerate(sorted(self.node_cpu)):
            busy = self.node_busy(host, ts)
            busy[0] = 0.0  # nothing before the first scrape
            inc = {"user": 0.7 * busy, "system": 0.3 * busy, "idle": 0.8 * (1 - busy),
                   "iowait": 0.2 * (1 - busy)}
            for cpu in ("0", "1"):
                for mode, x in inc.items():
                    total = 1000.0 + np.cumsum(x * self.step_s)
                    lab = (f'cpu="{cpu}",instance="10.0.{node}.5:9100",job="node-exporter",'
                           f'mode="{mode}"')
                    vs = np.char.mod("%.6f", total[keep])
                    tt = np.char.add(ts[keep].astype(str), unit)
                    prefix = f"node_cpu_seconds_total{{{lab}}} "
                    write("".join(np.char.add(np.char.add(np.char.add(prefix, vs), " "),
                                              np.char.add(tt, "\n"))))
                    n += int(keep.sum())
        write("# TYPE node_uname_info gauge\n")
        for node, host in enumerate(sorted(self.node_cpu)):
            lab = f'instance="10.0.{node}.5:9100",job="node-exporter",nodename="{host}"'
            write("".join(f"node_uname_info{{{lab}}} 1 {t}{unit}\n" for t in ts[keep]))
            n += int(keep.sum())
        return n

    def sample_table(self) -> pa.Table:
        """The ground truth as a sample table (what the exporter measured)."""
        cols: dict[str, list[np.ndarray] | list[object]] = {k: [] for k in (
            "ts", "host", "gpu_uuid", "gpu_model", "util", "gr", "pod", "ns", "share",
            "mig")}
        parts: dict[str, list[np.ndarray]] = {k: [] for k in cols}
        for s in self.series:
            n = s.ts_s.shape[0]
            parts["ts"].append(s.ts_s.astype(np.int64) * 1_000_000_000)
            parts["host"].append(np.full(n, s.host, dtype=object))
            parts["gpu_uuid"].append(np.full(n, s.uuid, dtype=object))
            parts["gpu_model"].append(np.full(n, "NVIDIA L4", dtype=object))
            parts["util"].append(np.full(n, np.nan) if s.mig else s.util)
            parts["gr"].append(s.util / 100.0)
            parts["pod"].append(np.full(n, s.pod, dtype=object))
            parts["ns"].append(np.full(n, s.namespace, dtype=object))
            parts["share"].append(np.full(n, np.nan if s.share is None else s.share))
            parts["mig"].append(np.full(n, "3g.12gb" if s.mig else None, dtype=object))
        cat = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.lexsort((cat["pod"].astype(str), cat["ts"], cat["gpu_uuid"].astype(str)))
        cat = {k: v[order] for k, v in cat.items()}
        labels = []
        for ns, pod in zip(cat["ns"], cat["pod"]):
            kl = self.pods.get((ns, pod), {}) if pod else {}
            labels.append(list(kl.items()))
        return build_table({
            "ts": pa.array(cat["ts"], pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            "host": cat["host"].tolist(), "gpu_uuid": cat["gpu_uuid"].tolist(),
            "gpu_model": cat["gpu_model"].tolist(),
            "util_gpu_pct": pa.array(cat["util"], mask=np.isnan(cat["util"]),
                                     type=pa.float32()),
            "gr_engine_active": pa.array(cat["gr"], type=pa.float32()),
            "pod": cat["pod"].tolist(), "namespace": cat["ns"].tolist(),
            "mig_profile": cat["mig"].tolist(),
            "gpu_share": pa.array(cat["share"], mask=np.isnan(cat["share"]),
                                  type=pa.float32()),
            "labels": pa.array(labels, type=pa.map_(pa.string(), pa.string())),
        })

    def subset(self, hosts: set[str]) -> Fleet:
        """The part of the fleet on ``hosts`` (one cluster's store): their series, and the
        kube-state-metrics pod labels of the pods those series name."""
        series = [s for s in self.series if s.host in hosts]
        named = {(s.namespace, s.pod) for s in series if s.pod}
        return Fleet(start_s=self.start_s, end_s=self.end_s, step_s=self.step_s,
                     series=series, pods={k: v for k, v in self.pods.items() if k in named},
                     node_cpu=None if self.node_cpu is None else
                     {h: x for h, x in self.node_cpu.items() if h in hosts})

    def hosts(self) -> list[str]:
        return sorted({s.host for s in self.series})

    def write_openmetrics(self, path: Path, *, extra_metrics: bool = True,
                          window: tuple[int, int] | None = None, ms: bool = False) -> int:
        """OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``; returns the
        number of samples written. ``window`` = [t0, t1) in seconds keeps only the samples in
        it (one file per TSDB block: promtool re-reads its whole input once per 2-hour block,
        so one big file costs blocks x file size). ``ms``: timestamps in milliseconds and no
        ``# EOF`` (the Prometheus text format VictoriaMetrics' /api/v1/import/prometheus reads)."""
        n = 0
        unit = "000" if ms else ""
        t0, t1 = window if window is not None else (-(1 << 62), 1 << 62)
        with open(path, "w", encoding="utf-8") as f:
            metrics = [("DCGM_FI_DEV_GPU_UTIL", "util"), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr")]
            if extra_metrics:
                metrics += [("DCGM_FI_DEV_POWER_USAGE", "power"), ("DCGM_FI_DEV_FB_USED", "fb"),
                            ("DCGM_FI_DEV_FB_FREE", "fbfree")]
            live = []
            for s in self.series:
                a, b = np.searchsorted(s.ts_s, (t0, t1))
                if b > a:
                    live.append((s, slice(int(a), int(b))))
            for metric, kind in metrics:
                f.write(f"# TYPE {metric} gauge\n")
                for s, sl in live:
                    if kind == "util" and s.mig:
                        continue
                    lab = ",".join(f'{k}="{v}"' for k, v in s.metric_labels.items())
                    u = s.util[sl]
                    if kind == "util":
                        vals = u
                    elif kind == "gr":
                        vals = u / 100.0
                    elif kind == "power":
                        vals = 16.0 + u * 0.56
                    elif kind == "fb":
                        vals = np.where(u > 5, 18000.0, 0.0)
                    else:
                        vals = 23034.0 - np.where(u > 5, 18000.0, 0.0)
                    vs = np.char.mod("%.6g", vals)
                    ts = np.char.add(s.ts_s[sl].astype(np.int64).astype(str), unit)
                    prefix = f"{metric}{{{lab}}} "
                    f.write("".join(np.char.add(np.char.add(np.char.add(prefix, vs), " "),
                                                np.char.add(ts, "\n"))))
                    n += vals.shape[0]
            f.write("# TYPE kube_pod_labels gauge\n")
            ts = np.arange(self.start_s, self.end_s + 1, 300)
            ts = ts[(ts >= t0) & (ts < t1)]
            for (ns, pod), kl in sorted(self.pods.items()):
                if not kl or ts.size == 0:
                    continue
                lab = ",".join([f'namespace="{ns}"', f'pod="{pod}"',
                                *(f'label_{k.replace("-", "_")}="{v}"'
                                  for k, v in sorted(kl.items()))])
                f.write("".join(f"kube_pod_labels{{{lab}}} 1 {t}{unit}\n" for t in ts))
                n += ts.shape[0]
            n += self._node_metrics(f, t0, t1, unit)
            if not ms:
                f.write("# EOF\n")
        return n


def _uuid(rng: np.random.Generator) -> str:
    h = rng.integers(0, 16, 32)
    s = "".join("0123456789abcdef"[i] for i in h)
    return f"GPU-{s[:8]}-{s[8:12]}-{s[12:16]}-{s[16:20]}-{s[20:]}"


def _pattern(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "idle":
        return rng.integers(0, 4, n).astype(np.float64)
    if kind == "steady":
        return rng.integers(40, 60, n).astype(np.float64)
    if kind == "saturated":
        return rng.integers(91, 101, n).astype(np.float64)
    # bursty: short idle runs between busy runs
    period = rng.integers(3, 6)
    return np.where((np.arange(n) % period) == 0, 0.0, 100.0)


def make_fleet(*, nodes: int = 3, gpus_per_node: int = 4, hours: float = 6.0,
               step_s: int = 15, seed: int = 7, start_s: int = 1_704_067_200,
               special: bool = True, segment_hours: float = 2.0) -> Fleet:
    """A fleet of ``nodes`` x ``gpus_per_node`` L4 GPUs over ``hours`` at ``step_s``."""
    rng = np.random.default_rng(seed)
    steps = int(hours * 3600 // step_s)
    ts_all = start_s + np.arange(steps, dtype=np.int64) * step_s
    series: list[Series] = []
    pods: dict[tuple[str, str], dict[str, str]] = {}
    seg = max(1, int(segment_hours * 3600 // step_s))
    for node in range(nodes):
        host = f"ip-10-0-{node // 250}-{node % 250}.ec2.internal"
        exporter_pod = f"nvidia-dcgm-exporter-{seed:02d}{node:04d}"
        gap = np.zeros(steps, dtype=bool)
        if special and node == 0:
            gap[steps // 3: steps // 3 + max(2, 600 // step_s)] = True  # missed scrapes
        for g in range(gpus_per_node):
            uuid = _uuid(rng)
            base = {"gpu": str(g), "UUID": uuid, "pci_bus_id": f"00000000:{0x31 + g:02X}:00.0",
                    "device": f"nvidia{g}", "modelName": "NVIDIA L4", "Hostname": host,
                    "DCGM_FI_DRIVER_VERSION": "580.105.08", "instance": f"10.0.{node}.5:9400",
                    "job": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                    "pod": exporter_pod, "container": "nvidia-dcgm-exporter"}
            mig = special and node == 1 % max(nodes, 1) and g == 0 and nodes > 1
            shared = special and node == 0 and g == 1
            instances = [("1", "3g.12gb"), ("2", "3g.12gb")] if mig else [(None, None)]
            for gi, prof in instances:
                labels0 = dict(base)
                if gi is not None:
                    labels0["GPU_I_ID"] = gi
                    labels0["GPU_I_PROFILE"] = prof  # type: ignore[assignment]
                gpu_uuid = f"{uuid}/gi{gi}" if gi is not None else uuid
                for a in range(0, steps, seg):
                    b = min(steps, a + seg)
                    idx = np.arange(a, b)
                    idx = idx[~gap[idx]]
                    if idx.size == 0:
                        continue
                    held = rng.random() < 0.8
                    kind = str(rng.choice(["idle", "steady", "saturated", "bursty"]))
                    util = _pattern(kind, idx.size, rng) if held else \
                        rng.integers(0, 2, idx.size).astype(np.float64)
                    holders: list[tuple[str | None, str | None]] = [(None, None)]
                    if held:
                        k = int(rng.integers(0, len(NAMESPACES)))
                        ns = NAMESPACES[k]
                        holders = [(ns, f"{ns.split('-')[-1]}-train-{node}-{g}-{gi or 0}-{a}")]
                        if shared:
                            holders.append((ns, f"{ns.split('-')[-1]}-infer-{node}-{g}-{a}"))
                    for ns, pod in holders:
                        labels = dict(labels0)
                        if pod is not None:
                            assert ns is not None
                            labels.update(exported_namespace=ns, exported_pod=pod,
                                          exported_container="main")
                            team = ns.split("-")[-1]
                            if rng.random() < 0.5 and ns != "sandbox":
                                pods[(ns, pod)] = {"team-id": team,
                                                   "project-id": f"{team}-p{int(rng.integers(1, 3))}",
                                                   "user-id": f"u{int(rng.integers(1, 5))}"}
                            else:
                                pods.setdefault((ns, pod), {})
                        series.append(Series(
                            labels, ts_all[idx], util, mig, pod, ns, host, gpu_uuid,
                            1.0 / len(holders) if len(holders) > 1 else None))
    return Fleet(start_s=start_s, end_s=int(ts_all[-1]), step_s=step_s, series=series,
                 pods=pods)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: promtool's block length: it cuts its input into 2-hour blocks aligned to the epoch.
BLOCK_S = 7200


def _backfill_window(fleet: Fleet, data_dir: Path, t0: int, extra_metrics: bool) -> int:
    """One 2-hour window: OpenMetrics file -> promtool -> its block moved into ``data_dir``."""
    work = data_dir.parent / f"{data_dir.name}.w{t0}"
    work.mkdir(parents=True, exist_ok=True)
    om = work / "in.om"
    n = fleet.write_openmetrics(om, extra_metrics=extra_metrics, window=(t0, t0 + BLOCK_S))
    out = work / "blocks"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om),
                    str(out)], check=True, capture_output=True, timeout=1800)
    for block in out.iterdir():
        block.rename(data_dir / block.name)
    shutil.rmtree(work, ignore_errors=True)
    return n


_FORKED: Fleet | None = None


def _forked_window(data_dir: Path, t0: int, extra_metrics: bool) -> int:
    assert _FORKED is not None
    return _backfill_window(_FORKED, data_dir, t0, extra_metrics)


def backfill(fleet: Fleet, data_dir: Path, *, extra_metrics: bool = True,
             jobs: int = 1, progress: bool = False) -> int:
    """Write the fleet as OpenMetrics and turn it into TSDB blocks with promtool: one file
    and one promtool run per 2-hour block (``jobs`` at a time, forked workers), all blocks
    into ``data_dir``. Returns the number of samples written.

    ``promtool tsdb create-blocks-from openmetrics`` parses its whole input once per block
    it writes, so a single 7-day file costs 84 full parses; a file per block costs one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    first = fleet.start_s // BLOCK_S * BLOCK_S
    windows = list(range(first, fleet.end_s + 1, BLOCK_S))
    if jobs <= 1:
        return sum(_backfill_window(fleet, data_dir, t0, extra_metrics) for t0 in windows)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    global _FORKED
    _FORKED = fleet  # forked workers inherit it; passing it would pickle every sample
    total = 0
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
        futs = [pool.submit(_forked_window, data_dir, t0, extra_metrics) for t0 in windows]
        for i, fut in enumerate(futs):
            total += fut.result()
            if progress and (i + 1) % 12 == 0:
                print(f"  backfilled {i + 1}/{len(windows)} blocks", flush=True)
    _FORKED = None
    return total


@contextlib.contextmanager
def run_prometheus(data_dir: Path, *, extra_args: tuple[str, ...] = (),
                   remote_read: tuple[str, ...] = ()) -> Iterator[str]:
    """Start Prometheus on 127.0.0.1 (free port) over ``data_dir``; yield its URL; stop it.
    ``remote_read``: the read endpoints (``.../api/v1/read``) it also answers from, recent
    samples included (a long-term store behind it)."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("prometheus is not installed (scripts/test installs it)")
    port = free_port()
    cfg_dir = Path(tempfile.mkdtemp(prefix="gpuaudit-prom-"))
    cfg = cfg_dir / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n" + (
        "remote_read:\n" + "".join(f"  - url: {u}\n    read_recent: true\n"
                                   for u in remote_read) if remote_read else ""))
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data_dir}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
         *extra_args],
        stdout=subprocess.DEVNULL, stderr=open(cfg_dir / "log", "wb"))
    try:
        with _serving(proc, "prometheus", f"http://127.0.0.1:{port}", "/-/ready",
                      cfg_dir / "log") as url:
            yield url
    finally:
        shutil.rmtree(cfg_dir, ignore_errors=True)


@contextlib.contextmanager
def _serving(proc: subprocess.Popen[bytes], name: str, url: str, ready: str,
             log: Path) -> Iterator[str]:
    """Wait (60 s at most) until the server ``proc`` answers 200 on ``url + ready``, yield
    ``url``, then stop it (SIGTERM; SIGKILL after 20 s). If it exits first, the error
    carries the tail of its ``log``."""
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: "
                                   + log.read_text(errors="replace")[-2000:])
            try:
                if httpx.get(f"{url}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become ready in 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def import_victoria_metrics(fleet: Fleet, url: str, work: Path, *,
                            extra_metrics: bool = True) -> int:
    """Load ``fleet`` into a running VictoriaMetrics through /api/v1/import/prometheus (text
    format with millisecond timestamps), one 2-hour window per request, then flush so every
    sample is searchable. Returns the number of samples sent."""
    work.mkdir(parents=True, exist_ok=True)
    first = fleet.start_s // BLOCK_S * BLOCK_S
    total = 0
    with httpx.Client(timeout=600) as client:
        for t0 in range(first, fleet.end_s + 1, BLOCK_S):
            path = work / f"vm-{t0}.prom"
            total += fleet.write_openmetrics(path, extra_metrics=extra_metrics,
                                             window=(t0, t0 + BLOCK_S), ms=True)
            with open(path, "rb") as f:
                r = client.post(f"{url}/api/v1/import/prometheus", content=f.read())
            r.raise_for_status()
            path.unlink()
        client.get(f"{url}/internal/force_flush").raise_for_status()
    return total


@contextlib.contextmanager
def run_victoria_metrics(data_dir: Path, *, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Start single-node VictoriaMetrics (Debian's ``victoria-metrics``) on 127.0.0.1 (free
    port) over ``data_dir``; yield its URL; stop it. Caches off, no latency offset, so a
    query sees every imported sample at once."""
    if shutil.which("victoria-metrics") is None:
        raise RuntimeError("victoria-metrics is not installed (scripts/test installs it)")
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.vm.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        ["victoria-metrics", f"-storageDataPath={data_dir}",
         f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
         "-search.disableCache", "-search.latencyOffset=0s", "-selfScrapeInterval=0",
         *extra_args],
        stdout=subprocess.DEVNULL, stderr=log)
    try:
        with _serving(proc, "victoria-metrics", f"http://127.0.0.1:{port}", "/health",
                      log_path) as url:
            yield url
    finally:
        log.close()


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


__all__ = ["Fleet", "backfill", "import_victoria_metrics", "make_fleet", "os", "peak_rss_mib",
           "run_prometheus", "run_victoria_metrics"]


def team_report(url: str, fleet: Fleet, **kw: object) -> dict:  # type: ignore[type-arg]
    """``audit_fleet`` of ``fleet`` in the store at ``url`` by team (tests/data/fleet's
    teams.toml, 1.37 USD/GPU-h), as JSON without what differs run to run: the time it was
    made, the transfer and the origin (which names the store's port)."""
    import json

    from gpuaudit.api import audit_fleet

    r = audit_fleet(prometheus=url, start_s=fleet.start_s, end_s=fleet.end_s,
                    step_s=fleet.step_s, by=("team",),
                    map_file=Path(__file__).parents[1] / "data" / "fleet" / "teams.toml",
                    pricing={"price": "1.37"}, **kw)  # type: ignore[arg-type]
    d = json.loads(r.render("json"))
    d.pop("generated_at", None)
    d["extra"]["fleet"].pop("transfer")
    d["source"].pop("origin")
    return d  # type: ignore[no-any-return]
