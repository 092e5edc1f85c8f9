"""The text tables the benchmarks print: the first column left-aligned (labels), the others right-aligned
(figures), two spaces apart. Owns nothing else; every row has as many cells as the first."""

from __future__ import annotations


def aligned(rows: list[list[str]]) -> list[str]:
    """The rows as lines, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
