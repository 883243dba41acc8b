"""Every named query the code asks for exists: ``Q["x"]`` is looked up at run time, so a
query lost in a merge (as ``inquiry_of_execution`` once was, failing every execution page
with a KeyError) is otherwise found only by whoever opens that page."""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.store.queries import Q

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"
USED = re.compile(r"""\bQ\[\s*["'](\w+)["']\s*\]""")


def test_every_query_named_in_the_code_is_defined() -> None:
    used = {(m.group(1), str(path.relative_to(SRC))) for path in SRC.rglob("*.py")
            for m in USED.finditer(path.read_text(encoding="utf-8"))}  # fmt: skip
    assert len({name for name, _ in used}) > 50  # the pattern still finds them
    assert sorted((name, where) for name, where in used if name not in Q) == []


def test_status_lists_that_stand_for_every_status_name_them_all() -> None:
    """The event stream's queries list every status so the (status, updated) index serves
    them (issue #14): a status added to the graph but not there would never be streamed."""
    from conveyor.domain.status import ExecutionStatus

    for name in ("executions_changed", "executions_changed_late"):
        listed = re.search(r"e\.status IN \(([^)]*)\)", Q[name])
        assert listed, name
        assert set(re.findall(r"'(\w+)'", listed.group(1))) == {s.value for s in ExecutionStatus}, name
