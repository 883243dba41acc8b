"""The CI-sized chaos run, on each transport: about 35 s of load and faults each (see
docs/chaos.md; ``pytest -s`` shows the report). Deselect with ``-m 'not chaos'``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .harness import ChaosConfig, Unavailable
from .own_broker import run_chaos_own_broker

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.mark.chaos
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["postgres", "rabbitmq"])
def test_chaos(transport: str, tmp_path: Path) -> None:
    config = ChaosConfig(transport=transport, duration=35.0, rate=40.0, log_dir=tmp_path / "chaos", settle_timeout=90)
    try:
        result = run_chaos_own_broker(config)
    except Unavailable as exc:
        if IN_CI:
            pytest.fail(f"{exc} (CI=true: a missing service fails the run)")
        pytest.skip(str(exc))
    print(result.report)
    assert not result.violations, "\n".join(["violations (the report is printed above):", *result.violations[:30]])
