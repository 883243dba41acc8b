"""The SDK's rule methods (part of :class:`conveyor.sdk.Client`): register rules (YAML or
JSON text, a file, a mapping), list, read (with recent enforcements), delete, enable and
disable them. Each change is one SQL function (``register_rule``, ``delete_rule``,
``set_rule_enabled``, migration 0016); the rule is validated first (conveyor.rules.parse),
every problem listed in one InvalidRuleError.

    with Client(url) as client:
        client.register_rule(Path("rules/on_push.yaml"))
        client.disable_rule("ci.on_push")
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.domain.errors import NotFoundError
from conveyor.rules import parse
from conveyor.rules.spec import RuleSpec
from conveyor.store.queries import Q
from conveyor.verbs import common as verbs

RuleSource = str | bytes | Path | Mapping[str, Any]


def spec_of(rule: RuleSource, where: str = "", limits: Limits = DEFAULT_LIMITS) -> RuleSpec:
    if isinstance(rule, Path):
        return parse.load(rule.read_bytes(), where or str(rule), limits)
    if isinstance(rule, str | bytes):
        return parse.load(rule, where, limits)
    return parse.parse(rule, where)


def register_args(spec: RuleSpec) -> dict[str, Any]:
    args = spec.sql_args()
    for key in ("criteria", "parameters", "definition"):
        args[key] = Jsonb(args[key])
    return args


def rule_found(ref: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    if row is None:
        raise NotFoundError(f"no rule {ref!r}")
    return dict(row)


class RuleMethods:
    conn: psycopg.Connection[Any]
    document_limits: Limits

    def register_rule(self, rule: RuleSource) -> dict[str, Any]:
        """Register (create or update) one rule; returns ``{"ref", "id", "created"}``."""
        return self.register_rules([rule])[0]

    def register_rules(self, rules: Sequence[RuleSource]) -> list[dict[str, Any]]:
        """Several rules in one transaction: all or none (every file's problems listed)."""
        specs = parse.all_or_problems([functools.partial(spec_of, r, limits=self.document_limits) for r in rules])
        out = []
        with verbs.refusals(), self.conn.transaction():
            for spec in specs:
                row = self.conn.execute(Q["register_rule"], register_args(spec)).fetchone()
                assert row is not None
                out.append({"ref": spec.ref, "id": int(row["rule_id"]), "created": bool(row["created"])})
        return out

    def rules(self, *, trigger: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.conn.execute(Q["list_rules"], {"trigger": trigger, "limit": limit}).fetchall())

    def rule(self, ref: str, *, enforcements: int = 20) -> dict[str, Any]:
        """One rule with its definition and its ``enforcements`` most recent enforcements."""
        out = rule_found(ref, self.conn.execute(Q["get_rule"], {"ref": ref}).fetchone())
        out["enforcements"] = list(
            self.conn.execute(Q["rule_enforcements"], {"ref": ref, "limit": enforcements}).fetchall()
        )
        return out

    def delete_rule(self, ref: str) -> None:
        row = self.conn.execute(Q["delete_rule"], {"ref": ref}).fetchone()
        if not row or not row["deleted"]:
            raise NotFoundError(f"no rule {ref!r}")

    def enable_rule(self, ref: str) -> bool:
        """Enable; returns whether it was enabled already."""
        return self._set_enabled(ref, True)

    def disable_rule(self, ref: str) -> bool:
        """Disable (matching events then record 'rule_disabled'); returns whether it was enabled."""
        return self._set_enabled(ref, False)

    def _set_enabled(self, ref: str, enabled: bool) -> bool:
        row = self.conn.execute(Q["set_rule_enabled"], {"ref": ref, "enabled": enabled}).fetchone()
        return bool(rule_found(ref, row)["was"])
