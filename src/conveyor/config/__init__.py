"""Configuration: defaults < YAML file (``--config`` / ``CONVEYOR_CONFIG``) < environment.

Environment variables are ``CONVEYOR__SECTION__KEY`` (``CONVEYOR__WORKER__HEARTBEAT_INTERVAL=5``)
plus ``DATABASE_URL`` and ``DATABASE_DIRECT_URL``. Key names and defaults follow the seeds.
Every value's source is kept so ``conveyor config show`` can say where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from conveyor.config.connections import (
    DatabaseSettings as DatabaseSettings,
)
from conveyor.config.connections import (
    DeadLetterSettings as DeadLetterSettings,
)
from conveyor.config.connections import (
    MessageQueueSettings as MessageQueueSettings,
)
from conveyor.config.connections import (
    RabbitMQSettings as RabbitMQSettings,
)
from conveyor.config.connections import Section as _Section
from conveyor.config.documents import DocumentSettings
from conveyor.config.embedded import EmbeddedSettings as EmbeddedSettings
from conveyor.config.executor import ExecutorLivenessSettings as ExecutorLivenessSettings
from conveyor.config.keys import (
    ENV_PREFIX,
    KeyChecker,
    canonicalize,
    check_unknown,
    env_path,
)
from conveyor.config.workflow import WorkflowBounds
from conveyor.domain.errors import ConveyorError
from conveyor.domain.retention import FINISHED, retention_seconds
from conveyor.domain.storable import OUTPUT_LIMIT


class ExecutorSettings(_Section):
    scheduled_timeout: float = Field(300, gt=0, description="seconds an execution may stay scheduled")
    timeout_check_interval: float = Field(60, gt=0, description="seconds between recovery sweeps")
    poll_interval: float = Field(1.0, gt=0, description="polling fallback when no NOTIFY arrives")
    batch_size: int = Field(100, ge=1, le=10_000, description="executions claimed per statement")
    claim_timeout: float = Field(30, gt=0, description="a claim left in scheduling is reclaimed after this")
    no_worker_grace: float = Field(
        0, ge=0, description="seconds to wait for a capable worker before failing 'no workers available'"
    )
    scheduled_timeout_reschedules: int = Field(
        1, ge=0, description="times a scheduled-but-never-started execution is moved to another worker before failing"
    )
    metrics_interval: float = Field(15, gt=0, description="seconds between refreshes of the database gauges")
    exclusive_duties: bool = Field(
        False,
        description="run each recovery duty on one replica at a time (pg_try_advisory_xact_lock); "
        "every duty is safe on all replicas at once, this only cuts duplicate scans",
    )
    admission_repair_interval: float = Field(
        5, gt=0, description="seconds between checks for admission groups with a free slot and a waiter"
    )
    duty_failures_before_unready: int = Field(
        3,
        ge=1,
        description="consecutive failures (other than a database outage) after which a recovery duty "
        "is reported failing and the executor's readiness fails, until the duty succeeds again",
    )
    idempotency_key_retention: float = Field(
        86_400, gt=0, description="seconds an idempotency key is kept after its first use (then purged)"
    )
    inquiry_check_interval: float = Field(
        1.0, gt=0, description="seconds between checks for inquiries past their ttl (timeout or default answer)"
    )


class WorkerSettings(_Section):
    name: str | None = Field(None, description="unique worker name; default host-pid")
    heartbeat_interval: float = Field(10, gt=0, description="seconds between heartbeats")
    heartbeat_staleness_multiplier: float = Field(
        3, ge=1, description="a worker is stale after heartbeat_interval x this"
    )
    lock_grace: float = Field(
        0.25,
        ge=0,
        le=30,
        description="seconds to re-take the liveness lock after the session dropped, "
        "before executors declare the worker dead",
    )
    max_concurrent_tasks: int = Field(10, ge=1, description="executions run at once")
    prefetch: int | None = Field(
        None,
        ge=0,
        description="executions placed on the worker beyond its slots, started the moment a slot frees "
        "(default: max_concurrent_tasks, at least 8 and at most 100; 0: none)",
    )
    shutdown_timeout: float = Field(30, ge=0, description="seconds SIGTERM waits for running work")
    poll_interval: float = Field(1.0, gt=0, description="polling fallback when no NOTIFY arrives")
    execution_timeout: float = Field(600, gt=0, description="default per-action execution timeout")
    kill_grace: float = Field(5, ge=0, description="seconds between SIGTERM and SIGKILL on timeout")
    output_limit: int = Field(
        OUTPUT_LIMIT, ge=1024, description="bytes kept of each of stdout, stderr and a returned value (its JSON text)"
    )
    output_interval: float = Field(
        0.25, gt=0, description="seconds between sends of running executions' output (live output)"
    )
    isolation: Literal["thread", "process"] = Field(
        "thread",
        description="where Python actions run unless the action says otherwise: thread (in the worker "
        "process) or process (a child process killed on cancel, timeout or lost standing)",
    )
    runtimes: list[str] = Field(default_factory=lambda: ["python", "shell"])
    imports: list[str] = Field(default_factory=list, description="modules whose actions this worker offers")

    @property
    def prefetched(self) -> int:
        """Executions waiting on this worker beyond its slots (``prefetch``, or its default)."""
        # At least 8: the executor refills a prefetch one scheduling round after the
        # worker took from it; a worker with few slots empties a smaller one before that.
        return min(max(self.max_concurrent_tasks, 8), 100) if self.prefetch is None else self.prefetch

    @property
    def staleness(self) -> float:
        """The threshold: a worker silent this long is dead (recorded in its row as stale_after)."""
        return self.heartbeat_interval * self.heartbeat_staleness_multiplier

    @property
    def self_fence_after(self) -> float:
        """A worker that could not heartbeat this long stops its work: one interval before
        the executors may declare it dead and run that work elsewhere."""
        return max(self.heartbeat_interval, self.staleness - self.heartbeat_interval)


class RecoverySettings(_Section):
    sweep_interval: float = Field(0.5, gt=0, description="seconds between dead-worker sweeps on each executor")
    watch_interval: float = Field(
        0.1,
        gt=0,
        description="seconds between checks for a worker whose liveness session is gone (one cheap query "
        "on each executor; a sweep runs at once when one is)",
    )
    on_worker_lost: Literal["retry", "abandon"] = Field(
        "retry", description="a running execution whose worker died: run it again, or abandon it"
    )
    worker_lost_max_attempts: int = Field(3, ge=1, description="attempts lost with their worker before abandoning")
    backoff_base: float = Field(1.0, ge=0, description="backoff before the 2nd re-run after a lost worker (doubles)")
    backoff_max: float = Field(60.0, ge=0, description="cap of that backoff")


class RetrySettings(_Section):
    max_attempts: int = Field(1, ge=1, description="attempts for failed/timed-out executions (1 = no retry)")
    backoff_base: float = Field(1.0, ge=0, description="backoff before the 2nd attempt (doubles each time)")
    backoff_max: float = Field(60.0, ge=0, description="cap of that backoff")
    retry_on: list[Literal["failed", "timeout"]] = Field(
        default=["failed", "timeout"], description="outcomes that are retried"
    )


class HealthSettings(_Section):
    port: int | None = Field(None, ge=0, le=65535, description="HTTP port for /healthz and /readyz; unset = off")
    host: str = Field("0.0.0.0", description="address the health endpoint listens on")
    max_loop_lag: float = Field(2.0, gt=0, description="readiness fails when the event loop lags more than this")


class ApiSettings(_Section):
    host: str = Field("0.0.0.0", description="address the REST API and dashboard listen on")
    port: int = Field(8080, ge=0, le=65535, description="port of the REST API and dashboard (the seeds' 8080)")
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="largest request body accepted (413 above)")
    stream_interval: float = Field(1.0, gt=0, le=60, description="seconds between polls of the execution event stream")
    database_timeout: float = Field(
        1.0,
        gt=0,
        le=60,
        description="seconds a request waits for a database connection before answering 503 (database unavailable)",
    )
    retry_after: int = Field(2, ge=1, le=3600, description="the Retry-After seconds of a 503 (database unavailable)")


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_output: bool = Field(False, alias="json")


class WorkflowSettings(WorkflowBounds):  # the bounds: config_workflow.py
    max_depth: int = Field(
        10, ge=0, le=1000, description="deepest sub-workflow nesting (a workflow is 0); deeper fails at start"
    )
    poll_interval: float = Field(
        2.0, gt=0, description="seconds between checks for workflow events and timeouts when no NOTIFY arrives"
    )
    batch_size: int = Field(50, ge=1, le=10_000, description="workflows advanced per pass")


class EventSettings(_Section):
    poll_interval: float = Field(
        2.0, gt=0, description="seconds between checks for events awaiting their rules when no NOTIFY arrives"
    )
    batch_size: int = Field(100, ge=1, le=10_000, description="events whose rules are evaluated per pass")


class ScheduleSettings(_Section):
    poll_interval: float = Field(
        5.0,
        gt=0,
        description="longest sleep between checks for due schedule slots (the executors wake at the next one)",
    )
    batch_size: int = Field(100, ge=1, le=10_000, description="due schedules fired per pass")


class RetentionSettings(_Section):
    """Finished executions kept per status (seconds, or 30s/15m/12h/7d; null/"off": kept for
    good), purged by the executors in bounded batches (purge_executions, migration 0024)."""

    completed: float | None = Field(7 * 86_400, ge=0, description="completed executions are kept this long")
    cancelled: float | None = Field(7 * 86_400, ge=0, description="cancelled executions are kept this long")
    failed: float | None = Field(30 * 86_400, ge=0, description="failed executions are kept this long")
    timeout: float | None = Field(30 * 86_400, ge=0, description="timed-out executions are kept this long")
    abandoned: float | None = Field(30 * 86_400, ge=0, description="abandoned executions are kept this long")
    interval: float = Field(60, gt=0, description="seconds between retention runs (one replica at a time)")
    batch_size: int = Field(1000, ge=1, le=100_000, description="top-level executions deleted per transaction")
    max_batches: int = Field(100, ge=1, description="batches per run at most (the rest waits for the next run)")

    @field_validator("completed", "cancelled", "failed", "timeout", "abandoned", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return retention_seconds(value)

    def policy(self) -> dict[str, float]:
        """Seconds kept, by finished status, for the statuses that are purged at all."""
        # The fields named after a finished status, in their declared order (the purge's).
        kept = {s: getattr(self, s) for s in type(self).model_fields if s in FINISHED}
        return {status: seconds for status, seconds in kept.items() if seconds is not None}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", populate_by_name=True
    )

    transport: Literal["postgres", "rabbitmq"] = "postgres"
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)  # type: ignore[arg-type]
    executor_liveness: ExecutorLivenessSettings = Field(default_factory=ExecutorLivenessSettings)  # type: ignore[arg-type]
    worker: WorkerSettings = Field(default_factory=WorkerSettings)  # type: ignore[arg-type]
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)  # type: ignore[arg-type]
    retry: RetrySettings = Field(default_factory=RetrySettings)  # type: ignore[arg-type]
    health: HealthSettings = Field(default_factory=HealthSettings)  # type: ignore[arg-type]
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)  # type: ignore[arg-type]
    log: LogSettings = Field(default_factory=LogSettings)  # type: ignore[arg-type]
    api: ApiSettings = Field(default_factory=ApiSettings)  # type: ignore[arg-type]
    message_queue: MessageQueueSettings = Field(default_factory=MessageQueueSettings)  # type: ignore[arg-type]
    dead_letter: DeadLetterSettings = Field(default_factory=DeadLetterSettings)  # type: ignore[arg-type]
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)  # type: ignore[arg-type]
    events: EventSettings = Field(default_factory=EventSettings)  # type: ignore[arg-type]
    schedules: ScheduleSettings = Field(default_factory=ScheduleSettings)  # type: ignore[arg-type]
    retention: RetentionSettings = Field(default_factory=RetentionSettings)  # type: ignore[arg-type]
    documents: DocumentSettings = Field(default_factory=DocumentSettings)  # type: ignore[arg-type]

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        """The seeds' names for keys (config_keys.ALIASES), for settings built in code."""
        return canonicalize(data, "the settings")[0] if isinstance(data, Mapping) else data

    @property
    def dead_letter_exchange(self) -> str:
        return self.dead_letter.exchange or f"{self.message_queue.prefix}.dlx"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init carries the YAML file (merged by load_settings); env overrides it. Aliases
        # are resolved per source so that an env variable overrides a file's alias.
        return (_DatabaseUrlSource(settings_cls), _Aliased(settings_cls, env_settings), init_settings)


# Plain variables for the URLs, winning over CONVEYOR__DATABASE__*: DATABASE_URL is the one
# every PaaS and tool already sets; DATABASE_DIRECT_URL its pooler-bypassing companion
# (the name Prisma and others use for the same purpose).
URL_VARIABLES = {"url": "DATABASE_URL", "direct_url": "DATABASE_DIRECT_URL"}


class _DatabaseUrlSource(EnvSettingsSource):
    """``DATABASE_URL`` and ``DATABASE_DIRECT_URL``."""

    def __call__(self) -> dict[str, Any]:
        urls = {key: os.environ[var] for key, var in URL_VARIABLES.items() if os.environ.get(var)}
        return {"database": urls} if urls else {}


def _url_variable(key: str) -> str | None:
    """The plain variable that set this key (``database.url``: DATABASE_URL), if one did."""
    section, _, name = key.partition(".")
    var = URL_VARIABLES.get(name) if section == "database" else None
    return var if var and os.environ.get(var) else None


class _Aliased(PydanticBaseSettingsSource):
    """Another source with the seeds' key names moved to Conveyor's."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ delegates

    def __call__(self) -> dict[str, Any]:
        return canonicalize(self._inner(), "the environment")[0]


class LoadedSettings(BaseModel):
    settings: Settings
    sources: dict[str, str]
    config_file: Path | None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def load_settings(config_file: str | Path | None = None) -> LoadedSettings:
    path_text = str(config_file) if config_file else os.environ.get("CONVEYOR_CONFIG")
    path = Path(path_text) if path_text else None
    file_data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConveyorError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConveyorError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConveyorError(f"config file {path} must hold a mapping of sections")
        file_data = loaded or {}
    checker = KeyChecker(Settings)
    check_unknown(file_data, f"config file {path}", os.environ, checker)
    file_data, file_aliases = canonicalize(file_data, f"config file {path}")
    try:
        settings = Settings(**file_data)
    except ValidationError as exc:
        raise ConveyorError(f"invalid configuration: {_problems(exc)}") from None
    except SettingsError as exc:  # e.g. a list/mapping value in the environment that is not JSON
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise ConveyorError(
            f"invalid configuration: {exc}{cause}; list and mapping values set in the environment "
            "must be JSON, e.g. CONVEYOR__WORKER__RUNTIMES='[\"python\"]'"
        ) from None
    return LoadedSettings(
        settings=settings, sources=_sources(settings, path, file_data, file_aliases, checker), config_file=path
    )


def _problems(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        key = _url_variable(key) or key  # the variable the user set, not the key it feeds
        problems.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def _sources(
    settings: Settings, path: Path | None, file_data: dict[str, Any], file_aliases: dict[str, str], checker: KeyChecker
) -> dict[str, str]:
    """Where each key's value came from: DATABASE_URL > CONVEYOR__ variables > the file."""
    from_env: dict[str, str] = {}
    for name in os.environ:
        if name.upper().startswith(ENV_PREFIX):
            canon, _ = checker.canonical(env_path(name).split("."))
            from_env[".".join(canon)] = f"env {name}"
    sources: dict[str, str] = {}
    file_keys = set(_flatten(file_data))
    for key in _flatten(settings.model_dump(by_alias=True)):
        if variable := _url_variable(key):
            sources[key] = f"env {variable}"
        elif key in from_env:
            sources[key] = from_env[key]
        elif key in file_keys:
            alias = f" (as {file_aliases[key]})" if key in file_aliases else ""
            sources[key] = f"file {path}{alias}"
        else:
            sources[key] = "default"
    return sources
