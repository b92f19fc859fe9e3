"""The errors gpuaudit raises: each says what happened, where, and how to fix it.

Every error a user can meet derives from :class:`GpuauditError`. The CLI prints
``error: <message>`` on stderr and exits 2 for these, so a message must stand on its own:
the bad value, its location (file:line, column, metric, label) and the fix.
"""

from __future__ import annotations

import re

__all__ = [
    "GpuauditError",
    "InputError",
    "MissingExtraError",
    "PartialAnswerError",
    "PricingError",
    "QueryTooLarge",
    "SampleTableError",
    "SourceUnavailableError",
    "bounded",
    "redact",
]

# scheme://userinfo@ -- the user and password of a URL (RFC 3986 section 3.2.1)
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]+@")


_LONG_RUN = re.compile(r"\S{241,}")


def bounded(text: str) -> str:
    """``text`` with every run of more than 240 non-blank characters (a 10 MB line quoted as
    a column name, a value from a hostile file) cut to its first 160 and last 40 characters
    around a count of what was left out: an error stays a few lines, whatever it quotes."""
    if len(text) <= 240:
        return text
    return _LONG_RUN.sub(lambda m: f"{m.group()[:160]}...[{len(m.group()) - 200:,} characters"
                         f" cut]...{m.group()[-40:]}", text)


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``:
    ``http://user:secret@prom:9090`` -> ``http://***@prom:9090``. The one function every
    place that shows a URL (errors, report origins, HTML titles) goes through."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text


class GpuauditError(Exception):
    """Base of every error gpuaudit raises on purpose."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        # no error ever shows a URL's password, whoever composed it
        self.what = bounded(redact(what))
        self.where = None if where is None else bounded(redact(where))
        self.fix = None if fix is None else bounded(redact(fix))
        super().__init__(self._compose())

    def _compose(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only arguments defeat Exception's default pickling; a worker process
        # (classify's parallel ranges) sends its error back whole
        return (_restore, (type(self), str(self), dict(self.__dict__)))


def _restore(cls: type[GpuauditError], message: str, state: dict[str, object]) -> GpuauditError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class InputError(GpuauditError):
    """A file, URL or argument the user gave cannot be read as they meant it."""


class SampleTableError(InputError):
    """A value breaks the sample table's contract (range, unit, order).

    ``column`` and ``row`` name the offending cell; ``row`` is 0-based in the table the
    validator saw (importers translate it to file:line in ``where``).
    """

    def __init__(
        self,
        what: str,
        *,
        column: str,
        row: int | None = None,
        value: object = None,
        where: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.column = column
        self.row = row
        self.value = value
        super().__init__(what, where=where, fix=fix)


class PricingError(InputError):
    """No price can be found for what was measured (unknown model, provider or option): an
    :class:`InputError`, since the fix is always the user's (``--gpu-model``, ``--price``,
    ``--provider``, a catalog)."""


class QueryTooLarge(InputError):
    """The server refused a query as too big (points per series, samples in memory).
    ``by_chunk``: a shorter time chunk makes the query smaller (False: a window of fixed
    length, such as the fleet's 24 h utilization, refused whatever the chunk)."""

    by_chunk = True


class SourceUnavailableError(GpuauditError):
    """A measurement source (NVML, a Prometheus server, an exporter) cannot be reached."""


class PartialAnswerError(SourceUnavailableError):
    """A store answered, but said its answer leaves out a part it could not reach (a
    remote-read endpoint, a Thanos store, a VictoriaMetrics storage node): the figures would
    silently miss it. ``gpuaudit fleet --allow-partial`` keeps such answers, with a note."""


class MissingExtraError(GpuauditError, ImportError):
    """An optional integration was asked for but its package is not installed.

    ``extra`` names the pip extra that installs it (``pip install 'gpuaudit[mlflow]'``).
    Also an :class:`ImportError`, so ``except ImportError`` catches it as users expect.
    """

    def __init__(self, what: str, *, extra: str, where: str | None = None) -> None:
        self.extra = extra
        super().__init__(what, where=where, fix=f"pip install 'gpuaudit[{extra}]'")
