"""Plain-text and Markdown tables for the reports that print rows of figures (the bill,
capacity planning): first column left-aligned, the figures right-aligned."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table", "plain_table"]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Fixed-width columns, a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                     for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return out
