"""The deployment files in deploy/ (issue #16), validated with what this machine has: the
systemd units by ``systemd-analyze verify``, the Kubernetes manifests against the API's
schemas (``kubernetes-validate``, which bundles them), and both against Conveyor's own
settings (every key a real setting, every stop longer than the worker's shutdown timeout)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conveyor.config import Settings, load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
KUBERNETES = "1.30"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
SHUTDOWN = Settings().worker.shutdown_timeout


def documents() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def test_there_is_a_unit_per_process_and_a_manifest_per_kind() -> None:
    assert [u.name for u in UNITS] == ["conveyor-api.service", "conveyor-executor.service", "conveyor-worker.service"]
    kinds = sorted({d["kind"] for d in documents()})
    assert kinds == ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Secret", "Service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_verifies_each_unit(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if IN_CI:
            pytest.fail("systemd-analyze is missing (CI=true)")
        pytest.skip("systemd-analyze is missing")
    # The unit as installed names /opt/conveyor/venv; here, the test's own conveyor (verify
    # checks that the command exists and is executable).
    conveyor = Path(sys.executable).with_name("conveyor")
    text = unit.read_text().replace("/opt/conveyor/venv/bin/conveyor", str(conveyor))
    (tmp_path / unit.name).write_text(text)
    run = subprocess.run([analyze, "verify", str(tmp_path / unit.name)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on settings it ignores (a bad time value): its warnings fail this too.
    assert (run.returncode, run.stderr.strip()) == (0, ""), run.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_each_unit_stops_gracefully_and_restarts_on_failure(unit: Path) -> None:
    lines = dict(
        line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    role = unit.stem.removeprefix("conveyor-")
    assert lines["ExecStart"].split()[1:] == [role]
    assert lines["KillSignal"] == "SIGTERM"
    assert float(lines["TimeoutStopSec"]) > SHUTDOWN
    assert lines["Restart"] == "on-failure"


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises with the problem


def test_each_deployment_probes_health_drains_in_time_and_has_a_budget() -> None:
    docs = documents()
    budgets = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    names = sorted(d["metadata"]["name"] for d in deployments)
    assert names == ["conveyor-api", "conveyor-executor", "conveyor-worker"]
    for d in deployments:
        pod = d["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > SHUTDOWN
        [container] = pod["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {"configMapRef": {"name": "conveyor-config"}} in container["envFrom"]
        assert {"secretRef": {"name": "conveyor-database"}} in container["envFrom"]
        assert d["spec"]["selector"]["matchLabels"] in budgets


def test_the_settings_they_set_are_conveyors_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key of the ConfigMap and of the units' environment file loads (an unknown
    setting is refused by name), and the health port the probes use is the one set."""
    [config] = [d for d in documents() if d["kind"] == "ConfigMap"]
    example = DEPLOY / "systemd" / "conveyor.env.example"
    env_file = dict(
        line.split("=", 1) for line in example.read_text().splitlines() if line and not line.startswith("#")
    )
    for settings in (config["data"], {k: v for k, v in env_file.items() if k != "DATABASE_URL"}):
        for key in [k for k in os.environ if k.startswith("CONVEYOR")]:
            monkeypatch.delenv(key)
        for key, value in settings.items():
            assert re.fullmatch(r"CONVEYOR__[A-Z_]+__[A-Z_]+|CONVEYOR__TRANSPORT", key), key
            monkeypatch.setenv(key, str(value))
        loaded = load_settings(None).settings
        assert loaded.health.port == 8081
        assert loaded.worker.shutdown_timeout == SHUTDOWN
