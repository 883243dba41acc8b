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

from conveyor.domain.documents import DEFAULT_LIMITS, Limits
from conveyor.rules import parse
from conveyor.rules.spec import RuleSpec
from conveyor.store.db import Conn
from conveyor.store.queries import Q
from conveyor.verbs import rules as rule_verbs
from conveyor.verbs.drive import run

RuleSource = str | bytes | Path | Mapping[str, Any]


def spec_of(rule: RuleSource, where: str = "", limits: Limits = DEFAULT_LIMITS) -> RuleSpec:
    if isinstance(rule, Path):
        return parse.load(rule.read_bytes(), where or str(rule), limits)
    if isinstance(rule, str | bytes):
        return parse.load(rule, where, limits)
    return parse.parse(rule, where)


class RuleMethods:
    conn: Conn
    document_limits: Limits

    def register_rule(self, rule: RuleSource) -> dict[str, Any]:
        """Register (create or update) one rule; returns ``{"ref", "id", "created"}``."""
        return self.register_rules([rule])[0]

    def register_rules(self, rules: Sequence[RuleSource]) -> list[dict[str, Any]]:
        """Several rules in one transaction: all or none (every file's problems listed)."""
        specs = parse.all_or_problems([functools.partial(spec_of, r, limits=self.document_limits) for r in rules])
        return run(self.conn, rule_verbs.register(specs))

    def rules(self, *, trigger: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.conn.execute(Q["list_rules"], {"trigger": trigger, "limit": limit}).fetchall())

    def rule(self, ref: str, *, enforcements: int = 20) -> dict[str, Any]:
        """One rule with its definition and its ``enforcements`` most recent enforcements."""
        out = rule_verbs.found(ref, self.conn.execute(Q["get_rule"], {"ref": ref}).fetchone())
        out["enforcements"] = list(
            self.conn.execute(Q["rule_enforcements"], {"ref": ref, "limit": enforcements}).fetchall()
        )
        return out

    def delete_rule(self, ref: str) -> None:
        run(self.conn, rule_verbs.delete(ref))

    def enable_rule(self, ref: str) -> bool:
        """Enable; returns whether it was enabled already."""
        return self._set_enabled(ref, True)

    def disable_rule(self, ref: str) -> bool:
        """Disable (matching events then record 'rule_disabled'); returns whether it was enabled."""
        return self._set_enabled(ref, False)

    def _set_enabled(self, ref: str, enabled: bool) -> bool:
        return run(self.conn, rule_verbs.set_enabled(ref, enabled))
