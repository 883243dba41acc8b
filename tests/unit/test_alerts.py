"""The Prometheus alert rules parse (``promtool check rules``) and fire as intended on
synthetic series (``promtool test rules``, cases in deploy/prometheus/alerts_test.yml).
Without promtool the tests skip locally and fail under CI=true (.ci/run installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
METRICS = (ROOT / "src" / "conveyor" / "ops" / "metrics.py", ROOT / "src" / "conveyor" / "executor" / "gauges.py")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool not found (Debian: apt-get install prometheus)"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: a missing tool fails the run)")
        pytest.skip(reason)
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_rules_are_valid(promtool: str) -> None:
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_fire_as_intended(promtool: str) -> None:
    proc = run(promtool, "test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_unit_tested() -> None:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    tested = {t["alertname"] for case in cases["tests"] for t in case.get("alert_rule_test", [])}
    assert alerts == tested


def test_rules_use_only_metrics_conveyor_exports() -> None:
    """A renamed metric would leave an alert that never fires: every conveyor_* name in
    the rules must be defined in the code."""
    rules = RULES.read_text(encoding="utf-8")
    used = set(re.findall(r"\b(conveyor_[a-z_]+)\b", rules))
    code = "".join(path.read_text(encoding="utf-8") for path in METRICS)
    defined = set(re.findall(r'"(conveyor_[a-z_]+)"', code))
    assert used, "no metric in the rules?"
    assert used <= defined, f"not defined in the code: {sorted(used - defined)}"
