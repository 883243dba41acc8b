"""Worker-side metrics (conveyor.worker.instrument, the result writer) and the fields of
a worker's execution log lines in JSON mode, without a database."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog
from prometheus_client import REGISTRY

from conveyor.actions.core import core
from conveyor.config import Settings
from conveyor.domain.outcome import AttemptEnd, Decision
from conveyor.domain.status import ExecutionStatus
from conveyor.ops import logs
from conveyor.store.rows import ClaimedRun
from conveyor.transport.postgres import PostgresTransport
from conveyor.worker import service
from conveyor.worker.instrument import observe_claims, observe_result
from conveyor.worker.results import Finished, ResultWriter


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_scheduling_latency_is_observed_for_first_attempts_only() -> None:
    before = count("conveyor_scheduling_latency_seconds_count")
    total = count("conveyor_scheduling_latency_seconds_sum")
    observe_claims(
        [
            ClaimedRun(1, 1, "core.noop", {}, "python", {}, since_request=0.25),
            ClaimedRun(2, 2, "core.noop", {}, "python", {}, since_request=90.0),  # a re-run: includes earlier attempts
            ClaimedRun(3, 1, "core.noop", {}, "python", {}),  # an unknown claim recovered after a lost answer
        ]
    )
    assert count("conveyor_scheduling_latency_seconds_count") - before == 1
    assert count("conveyor_scheduling_latency_seconds_sum") - total == pytest.approx(0.25)


def test_results_count_durations_by_action_and_outcome_and_execution_timeouts() -> None:
    labels = {"action": "shop.report", "outcome": "timeout"}
    before = count("conveyor_execution_duration_seconds_count", **labels)
    timeouts = count("conveyor_execution_timeouts_total", kind="execution")
    writer = ResultWriter(pool=None, worker="w")  # type: ignore[arg-type]
    decision = Decision(ExecutionStatus.TIMEOUT, None, "timed out")
    writer.put(Finished(1, 1, AttemptEnd.TIMEOUT, decision, {"duration": 3.5}, "timed out", action="shop.report"))
    assert count("conveyor_execution_duration_seconds_count", **labels) - before == 1
    assert count("conveyor_execution_timeouts_total", kind="execution") - timeouts == 1
    assert writer.pending == {1}


def test_a_result_without_duration_is_not_a_run_time() -> None:
    before = count("conveyor_execution_duration_seconds_count", action="unknown", outcome="cancelled")
    observe_result(None, "cancelled", {"succeeded": False, "error": "cancelled"})
    assert count("conveyor_execution_duration_seconds_count", action="unknown", outcome="cancelled") == before


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


async def test_worker_execution_log_lines_carry_execution_attempt_and_worker(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Configured here, not in a fixture: an async test may see another captured stderr.
    logs.configure("debug", json_output=True)
    # Module loggers cache their configuration on first use: a fresh one sees this one.
    monkeypatch.setattr(service, "log", structlog.get_logger(service.__name__))
    settings = Settings(worker={"name": "w-json"})  # type: ignore[arg-type]
    transport = PostgresTransport("postgresql://unused", "conveyor")
    worker = service.WorkerService(settings, "postgresql://unused", None, transport, list(core))  # type: ignore[arg-type]
    row = ClaimedRun(7, 2, "core.echo", {"message": "hi"}, "python", {})
    try:
        await worker._execute(worker._runs.add(7, 2, {}), row)
    finally:
        worker._threads.shutdown()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    about = [line for line in lines if line.get("event", "").startswith("execution ")]
    assert {line["event"] for line in about} >= {"execution started", "execution finished"}
    for line in about:
        assert (line["execution_id"], line["attempt"], line["worker"]) == (7, 2, "w-json"), line
        assert line["action"] == "core.echo"
