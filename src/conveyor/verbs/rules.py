"""Rules: register (create or update by ref), delete, enable and disable; one SQL function
each (``register_rule``, ``delete_rule``, ``set_rule_enabled``, migration 0016) and one
body each, run by ``drive.run`` (SDK, CLI) and ``drive.run_async`` (API). A rule is
parsed and validated before (conveyor.rules.parse: every problem in one InvalidRuleError);
what is here is storing it and what the answers mean."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from conveyor.domain.errors import NotFoundError
from conveyor.rules.spec import RuleSpec
from conveyor.verbs.common import refusals
from conveyor.verbs.drive import Verb, sql


def register(specs: Sequence[RuleSpec]) -> Verb[list[dict[str, Any]]]:
    """Several rules in one transaction, all or none: ``[{"ref", "id", "created"}]``."""
    out = []
    with refusals():
        for spec in specs:
            row = yield sql("register_rule", register_args(spec))
            assert row is not None  # the function returns a row or raises
            out.append({"ref": spec.ref, "id": int(row["rule_id"]), "created": bool(row["created"])})
    return out


def delete(ref: str) -> Verb[None]:
    """Delete a rule; its enforcements stay, naming it (rule_ref)."""
    row = yield sql("delete_rule", {"ref": ref})
    if not row or not row["deleted"]:
        raise not_found(ref)


def set_enabled(ref: str, enabled: bool) -> Verb[bool]:
    """Enable or disable a rule: whether it was enabled before."""
    row = yield sql("set_rule_enabled", {"ref": ref, "enabled": enabled})
    return bool(found(ref, row)["was"])


def register_args(spec: RuleSpec) -> dict[str, Any]:
    """``register_rule``'s parameters."""
    args = spec.sql_args()
    for key in ("criteria", "parameters", "definition"):
        args[key] = Jsonb(args[key])
    return args


def not_found(ref: str) -> NotFoundError:
    return NotFoundError(f"no rule {ref!r}")


def found(ref: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    if row is None:
        raise not_found(ref)
    return dict(row)
