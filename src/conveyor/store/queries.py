"""Named SQL queries loaded from ``sql/queries/*.sql``.

Each query starts with ``-- name: <name>`` followed by comment lines that describe
it. Queries are referenced by name (``Q["claim_requested"]``), so SQL never gets
built from strings in Python.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, LiteralString]:
    queries: dict[str, LiteralString] = {}
    folder = resources.files("conveyor.store") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name}")
            lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
            queries[name] = cast(LiteralString, "\n".join(lines).strip().rstrip(";"))  # type: ignore[redundant-cast]
    return queries


Q: dict[str, LiteralString] = _load()
