"""How many children Orquesta's own conductor dispatches for the definitions of
tests/unit/workflows/orquesta_cases.py (not a test: the project's tests cannot import
orquesta). Those counts are recorded there, and test_conductor_finite.py holds Conveyor's
conductor to them; ``--check`` fails if Orquesta's differ from the recorded ones.

    python bench/orquesta_counts.py [--check]      (in a venv with orquesta 1.x and PyYAML)

The driver is the one of Orquesta's own conducting tests (orquesta/tests/unit/base.py,
assert_conducting_sequences): in rounds, every task returned by get_next_tasks() is set
running and then ended (failed if its name is in the case's ``fail`` set, else
succeeded), then get_next_tasks() is asked again, until it returns nothing. A dispatch is
one action execution set running (a retry is one more). A round cap stops a definition
that Orquesta itself would run forever (reported as such).
"""

from __future__ import annotations

import collections
import collections.abc
import fractions
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

# The installed orquesta (and the networkx it pins) predate Python 3.10: they import
# fractions.gcd and collections.MutableSequence & co., gone since. Put them back.
fractions.gcd = math.gcd  # type: ignore[attr-defined]
for _name in ("Mapping", "MutableMapping", "Sequence", "MutableSequence", "Iterable", "Set", "MutableSet",
              "Callable", "Hashable"):  # fmt: skip
    setattr(collections, _name, getattr(collections.abc, _name))

import yaml  # noqa: E402
from orquesta import conducting, events, statuses  # noqa: E402
from orquesta.specs import native as native_specs  # noqa: E402
from orquesta.utils import parameters as _parameters  # noqa: E402

# ... and a global flag in the middle of a pattern ("(?i)true"), an error since 3.11.
_parameters.REGEX_INLINE_PARAMS = _parameters.REGEX_INLINE_PARAMS.replace("(?i)true", "(?i:true)").replace(
    "(?i)false", "(?i:false)"
)

MAX_ROUNDS = 200


def count(definition: str, fail: frozenset[str]) -> dict[str, Any]:
    spec = native_specs.WorkflowSpec(yaml.safe_load(definition))
    conductor = conducting.WorkflowConductor(spec)
    conductor.request_workflow_status(statuses.RUNNING)
    per_task: dict[str, int] = {}
    rounds = 0
    queue = conductor.get_next_tasks()
    while queue and rounds < MAX_ROUNDS:
        rounds += 1
        for task in queue:
            task_id, route = task["id"], task["route"]
            conductor.update_task_state(task_id, route, events.ActionExecutionEvent(statuses.RUNNING))
            per_task[task_id] = per_task.get(task_id, 0) + 1
            status = statuses.FAILED if task_id in fail else statuses.SUCCEEDED
            conductor.update_task_state(task_id, route, events.ActionExecutionEvent(status, result=None))
        queue = conductor.get_next_tasks()
    return {
        "dispatched": sum(per_task.values()),
        "per_task": dict(sorted(per_task.items())),
        "status": conductor.get_workflow_status() if not queue else "runs forever (round cap)",
    }


def cases() -> Any:
    path = Path(__file__).resolve().parent.parent / "tests" / "unit" / "workflows" / "orquesta_cases.py"
    spec = importlib.util.spec_from_file_location("orquesta_cases", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["orquesta_cases"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.CASES


def main() -> int:
    recorded = cases()
    out = {name: count(case.definition, case.fail) for name, case in recorded.items()}
    json.dump(out, sys.stdout, indent=2)
    print()
    if "--check" in sys.argv[1:]:
        wrong = [name for name, case in recorded.items()
                 if (out[name]["per_task"], out[name]["status"]) != (case.per_task, case.status)]  # fmt: skip
        if wrong:
            print("recorded counts differ from Orquesta's:", ", ".join(wrong), file=sys.stderr)
            return 1
        print("recorded counts agree with Orquesta's", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
