"""What is wrong with a workflow definition, each with where it is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem. ``path`` names the spot in the definition, dotted, lists indexed:
    ``tasks.deploy.next[0].do`` ("" for the definition as a whole)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class WorkflowError(ValueError):
    """A definition that cannot be loaded: every problem found, not only the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def join(path: str, key: str | int) -> str:
    """``path`` extended by a key (``a.b``) or an index (``a[0]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key
