"""Rule documents (YAML or JSON) -> :class:`RuleSpec`, with every problem listed.

Accepted: ``ref`` (or StackStorm's ``pack`` + ``name``), ``description``, ``enabled``
(default true), ``trigger`` (a name, or StackStorm's ``{type: NAME}``), ``criteria`` and
``action: {ref, parameters}``. StackStorm bookkeeping keys (``tags``, ``uid``, ``id``,
``metadata_file``, ``context``, ``type``) are ignored so its rule files load unchanged;
anything else is a problem, as a misspelt key silently ignored is a rule that never fires
the way its author thinks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import yaml

from conveyor.domain.documents import DEFAULT_LIMITS, DocumentError, Limits, load_yaml
from conveyor.domain.errors import InvalidRuleError
from conveyor.domain.storable import storable_problems
from conveyor.expressions import syntax_errors, unknown_functions
from conveyor.rules import criteria as c
from conveyor.rules.spec import RuleSpec

REF: Final = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$")
KNOWN: Final = frozenset({"ref", "pack", "name", "description", "enabled", "trigger", "criteria", "action"})
IGNORED: Final = frozenset({"tags", "uid", "id", "metadata_file", "context", "type"})
MAX_DOCUMENT: Final = 1 << 20  # bytes of one rule document

Problems = list[tuple[str, str]]  # (path, message)


def load(text: str | bytes, where: str = "", limits: Limits = DEFAULT_LIMITS) -> RuleSpec:
    """One rule from YAML or JSON text (JSON is YAML), read within ``limits`` (refused
    before any alias is expanded) and with no key named twice."""
    if len(text) > MAX_DOCUMENT:
        raise InvalidRuleError([(where, "", f"a rule document may have at most {MAX_DOCUMENT} bytes")])
    try:
        doc = load_yaml(text, limits)
    except DocumentError as exc:
        raise InvalidRuleError([(where, "", str(exc))]) from None
    except yaml.YAMLError as exc:
        raise InvalidRuleError([(where, "", f"not YAML or JSON: {' '.join(str(exc).split())}")]) from None
    return parse(doc, where)


def parse(doc: Any, where: str = "") -> RuleSpec:
    """A rule from its document; raises :class:`InvalidRuleError` listing every problem."""
    problems: Problems = []
    if not isinstance(doc, Mapping):
        raise InvalidRuleError([(where, "", "a rule must be a mapping (ref, trigger, criteria, action)")])
    # "\x00" and "\ud800" escapes (YAML or JSON) give what no database text can hold.
    unstorable = [(where, path, message) for path, message in storable_problems(doc)]
    if unstorable:
        raise InvalidRuleError(unstorable)
    for key in doc:
        if key not in KNOWN and key not in IGNORED:
            problems.append((str(key), "unknown key"))
    ref = _ref(doc, problems)
    trigger = _trigger(doc.get("trigger"), problems)
    raw_criteria = doc.get("criteria") or {}
    tree = parse_criteria(raw_criteria, "criteria", problems)
    action_ref, parameters = _action(doc.get("action"), problems)
    enabled = doc.get("enabled", True)
    if not isinstance(enabled, bool):
        problems.append(("enabled", "must be true or false"))
    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        problems.append(("description", "must be a string"))
    if problems:
        raise InvalidRuleError([(where, p, m) for p, m in problems])
    try:
        definition = json.loads(json.dumps(doc, default=str))  # YAML dates etc. become strings
    except ValueError as exc:  # pragma: no cover - safe_load gives JSON-able values
        raise InvalidRuleError([(where, "", f"not representable as JSON: {exc}")]) from None
    return RuleSpec(
        ref=ref,
        trigger=trigger,
        criteria=dict(raw_criteria),
        tree=tree,
        action_ref=action_ref,
        parameters=parameters,
        enabled=bool(enabled),
        description=description,
        definition=definition,
    )


def _ref(doc: Mapping[str, Any], problems: Problems) -> str:
    ref = doc.get("ref")
    if ref is None and doc.get("name") is not None:
        pack, name = doc.get("pack"), doc.get("name")
        ref = f"{pack}.{name}" if pack else name
    if not isinstance(ref, str) or not ref:
        problems.append(("ref", "required: a ref (or pack and name)"))
        return ""
    if len(ref) > 255 or not REF.fullmatch(ref):
        problems.append(("ref", f"{ref!r} is not a ref (letters, digits, _ and -, one optional pack. prefix)"))
    return ref


def _trigger(value: Any, problems: Problems) -> str:
    if isinstance(value, Mapping):  # StackStorm: trigger: {type: NAME, parameters: ...}
        value = value.get("type")
        path = "trigger.type"
    else:
        path = "trigger"
    if not isinstance(value, str) or not value:
        problems.append((path, "required: the name of a trigger"))
        return ""
    if len(value) > 255 or not REF.fullmatch(value):
        problems.append((path, f"{value!r} is not a trigger name"))
    return value


def _action(value: Any, problems: Problems) -> tuple[str, dict[str, Any]]:
    if not isinstance(value, Mapping):
        problems.append(("action", "required: {ref: ACTION_OR_WORKFLOW, parameters: {...}}"))
        return "", {}
    ref = value.get("ref")
    if not isinstance(ref, str) or not ref or len(ref) > 255:
        problems.append(("action.ref", "required: the ref of an action or workflow"))
        ref = ""
    for key in value:
        if key not in ("ref", "parameters"):
            problems.append((f"action.{key}", "unknown key"))
    parameters = value.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        problems.append(("action.parameters", "must be a mapping of parameter name to value or template"))
        return ref, {}
    for name, template in parameters.items():
        for message in syntax_errors(template):
            problems.append((f"action.parameters.{name}", message))
        for message in unknown_functions(template):
            problems.append((f"action.parameters.{name}", f"expression {message}"))
    return ref, dict(parameters)


def parse_criteria(
    value: Any, path: str, problems: Problems, depth: int = 0, count: list[int] | None = None
) -> c.Criterion:
    """The tree of ``value`` (a criteria mapping); problems appended with their paths."""
    count = [0] if count is None else count
    if depth > c.MAX_DEPTH:
        problems.append((path, f"criteria nest at most {c.MAX_DEPTH} deep"))
        return c.ALWAYS
    if not isinstance(value, Mapping):
        problems.append((path, "must be a mapping of trigger paths (or and/or/not) to checks"))
        return c.ALWAYS
    items: list[c.Criterion] = []
    for key, spec in value.items():
        count[0] += 1
        if count[0] > c.MAX_NODES:
            problems.append((path, f"at most {c.MAX_NODES} checks in one rule"))
            break
        where = f"{path}.{key}"
        if key in ("and", "or"):
            if not isinstance(spec, list) or not spec:
                problems.append((where, "must be a non-empty list of criteria"))
                continue
            subs = tuple(parse_criteria(s, f"{where}[{i}]", problems, depth + 1, count) for i, s in enumerate(spec))
            items.append(c.All(subs) if key == "and" else c.AnyOf(subs))
        elif key == "not":
            items.append(c.Not(parse_criteria(spec, where, problems, depth + 1, count)))
        else:
            check = _check(str(key), spec, where, problems)
            if check is not None:
                items.append(check)
    return items[0] if len(items) == 1 else c.All(tuple(items))


def _check(key: str, spec: Any, where: str, problems: Problems) -> c.Check | None:
    parts = c.split_path(key)
    if parts is None or len(parts) > c.MAX_PATH:
        problems.append(
            (
                where,
                "a criteria key is a path from trigger (trigger.body.branch, "
                "trigger.headers['x-github-event']), or and/or/not",
            )
        )
        return None
    if not isinstance(spec, Mapping):
        problems.append((where, "must be {type: OPERATOR, pattern: VALUE}"))
        return None
    for extra in set(spec) - {"type", "pattern"}:
        problems.append((f"{where}.{extra}", "unknown key"))
    op = spec.get("type")
    if not isinstance(op, str) or op not in c.OPERATORS:
        problems.append((f"{where}.type", f"unknown operator {op!r}; one of {', '.join(sorted(c.OPERATORS))}"))
        return None
    op = c.ALIASES.get(op, op)
    negate = op in c.NEGATIONS
    op = c.NEGATIONS.get(op, op)
    pattern = spec.get("pattern")
    if op not in ("exists",) and "pattern" not in spec:
        problems.append((f"{where}.pattern", "required for this operator"))
    elif op == "regex" and (message := c.regex_problem(pattern)):
        problems.append((f"{where}.pattern", message))
    elif op == "in" and not isinstance(pattern, list):
        problems.append((f"{where}.pattern", "must be a list for 'in'"))
    elif op in ("iequals", "startswith", "endswith") and not isinstance(pattern, str):
        problems.append((f"{where}.pattern", f"must be a string for {op!r}"))
    elif op in ("gt", "gte", "lt", "lte") and not (isinstance(pattern, str) or c._number(pattern)):
        problems.append((f"{where}.pattern", f"must be a number or a string for {op!r}"))
    return c.Check(parts, op, pattern, negate)


def criteria_of(value: Any) -> c.Criterion:
    """A stored rule's criteria (registered through parse, so valid); raises
    :class:`InvalidRuleError` for criteria written around it (raw SQL)."""
    problems: Problems = []
    tree = parse_criteria(value, "criteria", problems)
    if problems:
        raise InvalidRuleError([("", p, m) for p, m in problems])
    return tree


def all_or_problems(loaders: Sequence[Callable[[], RuleSpec]]) -> list[RuleSpec]:
    """Every loader's rule, or one InvalidRuleError with the problems of all of them (a
    registration of several files is all or none, and says everything wrong at once)."""
    specs: list[RuleSpec] = []
    problems: list[tuple[str, str, str]] = []
    for load_one in loaders:
        try:
            specs.append(load_one())
        except InvalidRuleError as exc:
            problems.extend(exc.problems)
    refs = [s.ref for s in specs]
    for ref in sorted({r for r in refs if refs.count(r) > 1}):
        problems.append(("", "ref", f"{ref!r} is defined more than once"))
    if problems:
        raise InvalidRuleError(problems)
    return specs
