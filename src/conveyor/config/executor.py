"""How fast a frozen or dead executor lets go of what it holds (issue #25, point 7). Apart
from config.py so that it stays readable; config.py re-exports it, and ``Settings`` holds
it as the ``executor_liveness`` section."""

from __future__ import annotations

from pydantic import Field, model_validator

from conveyor.config.connections import Section


class ExecutorLivenessSettings(Section):
    hold_timeout: float = Field(
        4.0,
        gt=0,
        description="seconds an executor's transaction may sit idle holding its row locks (a schedule, a "
        "workflow, a pending event, the sweep) before the server ends its session: the bound on how long an "
        "executor frozen inside a pass delays the other replicas; under the 10 s a schedule slot may be late "
        "and still fire on time (idle_in_transaction_session_timeout of the executor's sessions)",
    )
    frozen_after: float = Field(
        3.0,
        gt=0,
        description="seconds an executor may stop answering on its liveness session (pinged every third of "
        "it) before the server ends that session and the other replicas hand its scheduling claims back "
        "(idle_session_timeout of that session; a killed executor's claims return at once)",
    )
    check_interval: float = Field(
        0.25, gt=0, description="seconds between each replica's looks for claims of an executor that is gone"
    )

    @model_validator(mode="after")
    def _ping_fits(self) -> ExecutorLivenessSettings:
        if self.frozen_after < 0.3:
            raise ValueError("frozen_after must be at least 0.3 s (the liveness session is pinged every third of it)")
        return self
