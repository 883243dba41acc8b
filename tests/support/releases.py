"""The releases CHANGELOG.md records: each heading ``## [X.Y.Z] - <date or unreleased>[, commit <sha>]``.
The topmost is the release under way (pyproject's version); the first one with a commit is the
previous release, which the rolling-upgrade test installs beside the current code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (.+?)(?:, commit ([0-9a-f]{40}))?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Release:
    version: str
    when: str
    commit: str | None


def releases(changelog: Path = ROOT / "CHANGELOG.md") -> list[Release]:
    return [Release(m[1], m[2], m[3]) for m in _HEADING.finditer(changelog.read_text(encoding="utf-8"))]


def previous_release() -> Release:
    """The newest release with a recorded commit."""
    return next(r for r in releases() if r.commit is not None)
