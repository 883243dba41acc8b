"""The issue's YAML bomb (issue #25, point 1), shared by the unit, integration and
acceptance tests of the bounded document reader."""

from __future__ import annotations


def bomb(levels: int = 7, width: int = 9) -> str:
    """A workflow with ``levels`` lists of ``width`` aliases of the level below: a few
    hundred bytes of text, ``width ** levels`` items once expanded."""
    lines = ["ref: tests.bomb", "vars:", "  - l0: &l0 lol"]
    for n in range(1, levels + 1):
        lines.append(f"  - l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * width) + "]")
    lines += ["tasks:", "  a:", "    action: core.noop"]
    return "\n".join(lines) + "\n"


def written_out(values: int) -> str:
    """A flow list of ``values`` ones, with no alias: two bytes a value, every one of them
    parsed before a bound can refuse the document."""
    return "[" + ",".join(["1"] * values) + "]"
