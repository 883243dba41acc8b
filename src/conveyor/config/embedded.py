"""The settings of the embedded PostgreSQL that ``conveyor up`` runs without a database URL:
where its data lives and how ``up`` supervises it. Apart from config.py so that each stays
readable; config.py re-exports it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from conveyor.config.connections import Section


class EmbeddedSettings(Section):
    data_dir: Path | None = Field(None, description="embedded PostgreSQL data; default per-user data dir")
    check_interval: float = Field(
        0.5, gt=0, le=10, description="seconds between `conveyor up`'s checks that its embedded PostgreSQL runs"
    )
    restart_limit: int = Field(
        5,
        ge=0,
        description="restarts of the embedded PostgreSQL within restart_window after which `up` gives up and exits "
        "(0: never restart)",
    )
    restart_window: float = Field(60.0, gt=0, description="seconds over which restart_limit counts restarts")
    restart_backoff: float = Field(
        0.5, ge=0, description="wait before the 2nd restart within restart_window (doubles with each one after)"
    )
    restart_backoff_max: float = Field(10.0, ge=0, description="cap of that wait")

    @model_validator(mode="after")
    def _backoff_capped(self) -> EmbeddedSettings:
        if self.restart_backoff_max < self.restart_backoff:
            raise ValueError("embedded.restart_backoff_max must be at least embedded.restart_backoff")
        return self
