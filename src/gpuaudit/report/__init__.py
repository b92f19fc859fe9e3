"""Render: turn an :class:`~gpuaudit.result.AuditResult` into text. Renderers never compute."""

from __future__ import annotations

from gpuaudit.errors import InputError
from gpuaudit.result import FORMATS, AuditResult

__all__ = ["FORMATS", "render"]


def render(result: AuditResult, fmt: str = "terminal", *, width: int = 100,
           color: bool = False) -> str:
    """The report in ``fmt`` (terminal, json, markdown, html)."""
    if fmt == "terminal":
        from gpuaudit.report.terminal import render_terminal

        return render_terminal(result, width=width, color=color)
    if fmt == "json":
        from gpuaudit.report.json import dumps

        return dumps(result)
    if fmt == "markdown":
        from gpuaudit.report.markdown import render_markdown

        return render_markdown(result)
    if fmt == "html":
        from gpuaudit.report.html import render_html

        return str(render_html(result))
    raise InputError(f"unknown report format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
