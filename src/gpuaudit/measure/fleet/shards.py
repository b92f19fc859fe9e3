"""A fleet past one Prometheus: several stores (shards by cluster or region) and long ranges
cut into time shards, fetched concurrently over HTTP.

- :func:`parse_stores`: ``--prometheus`` values, each ``URL`` or ``NAME=URL``
  (``eu=http://prom-eu:9090``); a Thanos / Mimir / VictoriaMetrics query URL is one store;
- :func:`plan_shards`: every store x every run of ``chunks_per_shard`` chunks of the audit's
  step-aligned chunk grid (:func:`gpuaudit.classify.pushdown.chunk_grid`), so each shard
  answers exactly its part of what one pull over the whole range answers;
- :func:`fan_out`: runs a fetch per shard, ``workers`` shards at a time (each store's
  :class:`~gpuaudit.measure.fleet.prometheus.PromClient` bounds its own requests in flight and
  retries 429, 5xx and timeouts with backoff). A shard that still fails is an error naming
  the shard, its store and URL, never a silent partial answer; with ``allow_partial`` it is
  listed (:class:`MissingShard`) and the others go on.

What is fetched and how the answers merge is the caller's (the PromQL pushdown and its exact
merge live in :mod:`gpuaudit.classify.pushdown`): measure moves bytes, classify decides.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

from gpuaudit.errors import InputError, PartialAnswerError, SourceUnavailableError

__all__ = ["MissingShard", "Shard", "Store", "fan_out", "parse_stores", "plan_shards"]

_T = TypeVar("_T")
_J = TypeVar("_J")


@dataclass(frozen=True)
class Store:
    """One Prometheus-compatible query endpoint and the name the report gives it."""

    name: str
    url: str


@dataclass(frozen=True)
class Shard:
    """A store's run of chunks: ``chunks`` are inclusive (first step, last step) pairs."""

    store: Store
    index: int
    chunks: tuple[tuple[float, float], ...]

    @property
    def start_s(self) -> float:
        return self.chunks[0][0]

    @property
    def end_s(self) -> float:
        return self.chunks[-1][1]

    @property
    def label(self) -> str:
        return f"{self.store.name} {_iso(self.start_s)}..{_iso(self.end_s)}"


@dataclass(frozen=True)
class MissingShard:
    """A shard left out of a partial audit (``--allow-partial``), and why."""

    store: str
    url: str
    start: str
    end: str
    error: str


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stores(items: Sequence[str]) -> list[Store]:
    """``--prometheus`` values -> stores. ``NAME=URL`` names a store; a bare URL is named by
    its host and port. Names and URLs must be unique (the same store twice would count its
    GPUs twice)."""
    out: list[Store] = []
    for item in items:
        text = item.strip()
        name, sep, url = text.partition("=")
        if not sep or "://" in name:
            name, url = "", text
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise InputError(f"--prometheus {item!r} is not a URL (no http:// or https://)",
                             fix="give URL or NAME=URL, e.g. --prometheus eu=http://prom-eu:9090")
        name = name.strip()
        if not name:
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            name = parts.hostname or url
            if parts.port is not None:
                name += f":{parts.port}"
        if not all(c.isalnum() or c in "-_.:" for c in name):
            raise InputError(f"store name {name!r} (in --prometheus {item!r}) has characters "
                             "other than letters, digits and -_.:",
                             fix="name stores like eu, us-east-1, cluster_a")
        out.append(Store(name, url))
    for what, field in (("name", 0), ("URL", 1)):
        seen: set[str] = set()
        for s in out:
            k = (s.name, s.url)[field]
            if k in seen:
                raise InputError(f"two --prometheus stores have the same {what} {k!r}",
                                 fix="give each store once, with its own NAME=URL")
            seen.add(k)
    if not out:
        raise InputError("no --prometheus URL", fix="--prometheus http://prom:9090")
    return out


def plan_shards(stores: Sequence[Store], chunks: Sequence[tuple[float, float]],
                chunks_per_shard: int) -> list[Shard]:
    """Every store x every run of ``chunks_per_shard`` consecutive chunks, in time order per
    store (the stores interleaved, so concurrent shards spread over the stores)."""
    k = max(1, chunks_per_shard)
    runs = [tuple(chunks[i:i + k]) for i in range(0, len(chunks), k)]
    return [Shard(store, i, run) for i, run in enumerate(runs) for store in stores]


def fan_out(jobs: Sequence[_J], fetch: Callable[[_J], _T], *, describe: Callable[[_J], Store],
            label: Callable[[_J], str], workers: int, allow_partial: bool = False,
            ) -> tuple[list[tuple[_J, _T]], list[tuple[_J, str]]]:
    """``fetch`` each job, ``workers`` at a time; returns the answers in the jobs' order and
    the failed jobs with their error text (only with ``allow_partial``). A job that fails
    (:class:`SourceUnavailableError`: the store down or erring after its retries) stops the
    rest and is raised again naming the job (``label``), its store and URL."""
    results: dict[int, _T] = {}
    failed: list[tuple[int, str]] = []
    pool = cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs) or 1)))
    try:
        futures = {pool.submit(fetch, job): i for i, job in enumerate(jobs)}
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except SourceUnavailableError as exc:
                job = jobs[i]
                store = describe(job)
                if not allow_partial:
                    for other in futures:
                        other.cancel()
                    partial = ("or audit without it: `gpuaudit fleet --allow-partial` (the "
                               "report lists what is missing)")
                    if isinstance(exc, PartialAnswerError):  # (its fix says what to do)
                        fix = exc.fix
                    elif exc.fix:
                        fix = f"{exc.fix}; {partial}"
                    else:
                        fix = f"check the store, {partial}"
                    raise SourceUnavailableError(
                        f"shard {label(job)} (store {store.name}, {store.url}) failed: "
                        f"{exc.what}", where=exc.where or store.url, fix=fix) from exc
                failed.append((i, exc.what))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if failed and len(failed) == len(jobs):
        i, text = failed[0]
        store = describe(jobs[i])
        raise SourceUnavailableError(
            f"every shard failed; the first, {label(jobs[i])} ({store.url}): {text}",
            where=store.url, fix="check the stores are up and reachable")
    return ([(jobs[i], results[i]) for i in sorted(results)],
            [(jobs[i], text) for i, text in sorted(failed)])
