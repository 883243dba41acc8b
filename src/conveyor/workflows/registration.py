"""Registration as every caller does it (``conveyor workflows register``, ``POST
/api/v1/workflows``, ``Client.register_workflow``): parse each definition, validate it
against the actions that exist, and only when nothing is wrong hand the stored form to the
database's one verb, ``register_workflow`` (the ``register_workflow`` query). What is here
is the pure part: the caller reads the known action refs (``workflow_known_actions``) and
runs the query, sync or async alike.

Several definitions are registered together or not at all, and may name each other (a
task running a sub-workflow registered in the same call), so the refs being registered
count as known actions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.domain.errors import InvalidWorkflowError
from conveyor.domain.storable import storable_problems
from conveyor.workflows.parse import load_workflow, parse_workflow
from conveyor.workflows.problems import Problem, WorkflowError
from conveyor.workflows.spec import WorkflowSpec
from conveyor.workflows.validate import validate

# action.ref's CHECK: a workflow is an action, so its ref is one.
_REF = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+")
MAX_SOURCE = 1024 * 1024  # characters of one definition's text (a bound on what a parser is fed)


@dataclass(frozen=True, slots=True)
class Definition:
    """One definition to register: ``text`` (YAML, or JSON, which is YAML), ``data`` (the
    same document already loaded, e.g. a JSON body) or a ``spec`` already built; ``ref``
    names it when it has no ``ref:``; ``where`` names it in messages (a file name)."""

    text: str | None = None
    data: Mapping[str, Any] | None = None
    spec: WorkflowSpec | None = None
    ref: str | None = None
    where: str = ""


@dataclass(frozen=True, slots=True)
class Registration:
    spec: WorkflowSpec
    source: str | None

    def params(self) -> dict[str, Any]:
        """The ``register_workflow`` query's parameters."""
        return {
            "ref": self.spec.ref,
            "definition": Jsonb(self.spec.to_json()),
            "source": self.source or "",
            "description": self.spec.description,
            "parameters_schema": Jsonb(self.spec.parameters_schema),
        }


def _parse(d: Definition, limits: Limits) -> WorkflowSpec:
    if d.spec is not None:
        return d.spec if d.ref is None or d.ref == d.spec.ref else _renamed(d.spec, d.ref)
    if d.data is not None:
        return load_workflow(d.data, ref=d.ref)
    if d.text is None:
        raise WorkflowError([Problem("", "no definition given")])
    if len(d.text) > MAX_SOURCE:
        raise WorkflowError([Problem("", f"the definition is over {MAX_SOURCE} characters")])
    return parse_workflow(d.text, ref=d.ref, limits=limits)


def _renamed(spec: WorkflowSpec, ref: str) -> WorkflowSpec:
    return WorkflowSpec.from_json({**spec.to_json(), "ref": ref})


def prepare(
    definitions: Sequence[Definition], known_actions: Collection[str], limits: Limits = DEFAULT_LIMITS
) -> list[Registration]:
    """The checked registrations, in order; InvalidWorkflowError lists every problem of
    every definition (a definition that does not parse is not validated further). A text
    is read within ``limits`` (the ``documents`` settings)."""
    problems: list[tuple[str, str, str]] = []
    specs: list[tuple[Definition, WorkflowSpec]] = []
    for d in definitions:
        try:
            specs.append((d, _parse(d, limits)))
        except WorkflowError as exc:
            problems += [(d.where, p.path, p.message) for p in exc.problems]
    known = {*known_actions, *(spec.ref for _, spec in specs)}
    seen: dict[str, str] = {}
    for d, spec in specs:
        if not _REF.fullmatch(spec.ref) or len(spec.ref) > 255:
            problems.append((d.where, "ref", f"{spec.ref!r} is not a ref: give pack.name (letters, digits, _ - .)"))
        if spec.ref in seen:
            problems.append((d.where, "ref", f"{spec.ref} is also defined by {seen[spec.ref] or 'another definition'}"))
        seen.setdefault(spec.ref, d.where)
        problems += [(d.where, p.path, p.message) for p in validate(spec, known)]
        problems += [(d.where, path, message) for path, message in _unstorable(d, spec)]
    if problems:
        raise InvalidWorkflowError(problems)
    return [Registration(spec, _source(d)) for d, spec in specs]


def _unstorable(d: Definition, spec: WorkflowSpec) -> list[tuple[str, str]]:
    """What PostgreSQL would refuse in the stored definition (a ``"\\x00"`` or ``"\\ud800"``
    escape in YAML), else in the text kept as written: refused here, with its path."""
    stored = spec.to_json()
    found = [(_task_named(stored, path), message) for path, message in storable_problems(stored)]
    return found or list(storable_problems(_source(d) or "", "(the definition's text)"))


def _task_named(stored: Mapping[str, Any], path: str) -> str:
    """``tasks[0].input.x`` (the stored list) as the definition says it: ``tasks.a.input.x``."""
    match = re.match(r"tasks\[(\d+)\]", path)
    if match is None:
        return path
    return f"tasks.{stored['tasks'][int(match.group(1))]['name']}{path[match.end() :]}"


def _source(d: Definition) -> str | None:
    """What is kept as written: the text, or a loaded document as JSON (which is YAML)."""
    if d.data is not None:
        return json.dumps(d.data, indent=2, ensure_ascii=False)
    return d.text
