"""Acceptance: ``conveyor run --idempotency-key``: a script that runs the same command
again (after a timeout, say) gets the execution of the first run."""

from __future__ import annotations

import pytest

from acceptance.helpers import Procs, conveyor_env, describe

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def test_run_with_an_idempotency_key(procs: Procs) -> None:
    first = procs.run("run", "core.echo", "message=hi", "--idempotency-key", "deploy-42")
    again = procs.run("run", "core.echo", "message=hi", "--idempotency-key", "deploy-42")
    other = procs.run("run", "core.echo", "message=hi")
    for result in (first, again, other):
        assert result.returncode == 0, describe(result)
    assert first.stdout.strip() == again.stdout.strip() != other.stdout.strip()
    assert int(first.stdout)

    reused = procs.run("run", "core.echo", "message=other", "--idempotency-key", "deploy-42")
    assert reused.returncode == 1, describe(reused)
    assert f"already used for another request (execution {first.stdout.strip()})" in reused.stderr
    assert "Traceback" not in reused.stderr

    invalid = procs.run("run", "core.echo", "message=hi", "--idempotency-key", "x" * 256)
    assert invalid.returncode == 1, describe(invalid)
    assert "invalid idempotency key" in invalid.stderr
    assert len(invalid.stderr.strip().splitlines()) == 1, describe(invalid)
