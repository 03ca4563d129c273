"""Expand Slurm hostlist expressions (``node[1-3,7],gpu-a[01-02]``) without calling Slurm.

``squeue --json`` reports a job's nodes as one hostlist string; the bridge filters jobs by
node itself (22.05's ``--json`` ignores ``-w``), so it needs the expansion in-process.

Not python-hostlist, on purpose: it expands the same syntax (the unit tests use it as an
oracle), but it is GPL-2.0-or-later, and the bridge (Apache-2.0) ships as a wheel and an
image; these fifty lines keep GPL code out of both.
"""

from __future__ import annotations

import re

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
MAX_EXPANSION = 100_000


class HostlistError(ValueError):
    pass


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(term: str) -> list[str]:
    open_at = term.find("[")
    if open_at < 0:
        return [term]
    close_at = term.index("]", open_at)
    prefix, body, rest = term[:open_at], term[open_at + 1 : close_at], term[close_at + 1 :]
    values: list[str] = []
    for piece in body.split(","):
        m = _RANGE.fullmatch(piece.strip())
        if m is None:
            raise HostlistError(f"bad range {piece!r} in {term!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo) if lo.startswith("0") else 0
        if int(hi) < int(lo) or int(hi) - int(lo) > MAX_EXPANSION:
            raise HostlistError(f"bad range {piece!r} in {term!r}")
        values.extend(f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    tails = _expand_one(rest) if rest else [""]
    return [f"{prefix}{v}{t}" for v in values for t in tails]


def expand(expr: str | None) -> list[str]:
    """``"node[1-2],gpu7"`` -> ``["node1", "node2", "gpu7"]``; empty/None -> ``[]``."""
    if not expr or expr in ("(null)", "n/a", "None assigned"):
        return []
    out: list[str] = []
    for term in _split_top(expr.strip()):
        out.extend(_expand_one(term))
    return out
