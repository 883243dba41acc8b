"""Prometheus metrics of this process, served on ``/metrics`` of the health endpoint.

Names follow the seeds' monitoring list; dashboards and the alert rules in
``deploy/prometheus/alerts.yml`` build on them. Gauges that describe shared state
(executions, workers, backlog ages, dead-letter depth, outbox backlog) are refreshed
from the database by each executor, so any replica can be scraped; the execution,
worker and backlog gauges are exported by executors only (``executor/gauges.py``).
Counters and histograms count what this process did.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DEAD_LETTERS = Counter(
    "conveyor_dead_letters_total",
    "Dead letters handled by this process, by reason and resolution",
    ["reason", "resolution"],
)
DEAD_LETTER_HANDLER_SECONDS = Histogram(
    "conveyor_dead_letter_handler_seconds",
    "Time to record and resolve one dead letter",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
DLQ_DEPTH = Gauge(
    "conveyor_dlq_depth",
    "Dead letters waiting: unresolved records plus messages in the broker's dead-letter queue",
)
DEAD_LETTER_RECORDS = Gauge("conveyor_dead_letter_records", "Dead-letter records kept (retention: dead_letter.ttl_ms)")
DUTY_FAILURES = Counter(
    "conveyor_executor_duty_failures_total",
    "Executor duty runs that failed for another reason than a database outage (a bug), by duty",
    ["duty"],
)
DUTY_FAILING = Gauge(
    "conveyor_executor_duty_failing",
    "1 while an executor duty has failed executor.duty_failures_before_unready times in a row",
    ["duty"],
)
EXECUTIONS_PURGED = Counter(
    "conveyor_executions_purged_total",
    "Finished executions deleted by this executor's retention duty (retention.*), by the status of the purge",
    ["status"],
)
OUTBOX_DEPTH = Gauge("conveyor_outbox_depth", "Outbox messages committed but not yet published")
OUTBOX_PUBLISHED = Counter("conveyor_outbox_published_total", "Outbox messages published and confirmed by the broker")

# -- executions ---------------------------------------------------------------------

SCHEDULING_LATENCY = Histogram(
    "conveyor_scheduling_latency_seconds",
    "Time from request to running (database clock), observed by the worker that starts a first attempt",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
EXECUTION_DURATION = Histogram(
    "conveyor_execution_duration_seconds",
    "Run time of one attempt on this worker, by action and outcome (completed, failed, timeout)",
    ["action", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
EXECUTION_TIMEOUTS = Counter(
    "conveyor_execution_timeouts_total",
    "Timeouts: kind=execution, an action overran its timeout on this worker; kind=scheduled, "
    "the schedule-to-start monitor found a dispatch not started within its scheduled_timeout",
    ["kind"],
)
TIMEOUT_KINDS = ("execution", "scheduled")

# -- recovery -----------------------------------------------------------------------

RECOVERIES = Counter(
    "conveyor_recoveries_total",
    "Executions the dead-worker sweep of this process recovered from lost workers: handed_back "
    "(scheduled, never started), requeued (running, to run again), abandoned, cancelled",
    ["kind"],
)
RECOVERY_KINDS = ("handed_back", "requeued", "abandoned", "cancelled")
WORKER_DOWNTIME = Histogram(
    "conveyor_worker_downtime_seconds",
    "From a worker's last heartbeat to the sweep marking it inactive (database clock)",
    buckets=(0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800),
)

# -- transports ---------------------------------------------------------------------

TRANSPORT_ERRORS = Counter(
    "conveyor_transport_errors_total",
    "Transport failures of this process: connect (cannot connect), consume (a listener or broker "
    "session lost, or a consumed message given back), publish (a publish not confirmed or failed)",
    ["transport", "operation"],
)


def transport_error(transport: str, operation: str, count: int = 1) -> None:
    """Count a transport failure (``operation``: connect, consume or publish)."""
    TRANSPORT_ERRORS.labels(transport, operation).inc(count)


# Every known series starts at 0, so that rate() and increase() see the first event.
for _kind in TIMEOUT_KINDS:
    EXECUTION_TIMEOUTS.labels(_kind)
for _kind in RECOVERY_KINDS:
    RECOVERIES.labels(_kind)
for _transport in ("postgres", "rabbitmq"):
    for _operation in ("connect", "consume", "publish"):
        TRANSPORT_ERRORS.labels(_transport, _operation)

# -- webhooks -----------------------------------------------------------------------

WEBHOOK_REQUESTS = Counter(
    "conveyor_webhook_requests_total",
    "Requests to webhook doors (POST /api/v1/webhooks/{name}) answered by this process, by webhook "
    '(a registered name, else "unknown") and HTTP status code',
    ["webhook", "code"],
)

# Rules (executor/events.py), counted after commit. No trigger label: trigger names are
# the users', and a label per name would grow without bound.
EVENTS_PROCESSED = Counter(
    "conveyor_events_processed_total",
    "Events whose rules this process evaluated, by whether any rule matched (matched, unmatched)",
    ["result"],
)
ENFORCEMENTS = Counter(
    "conveyor_enforcements_total",
    "Enforcements written by this process, by outcome (requested, template_error, request_error, rule_disabled)",
    ["outcome"],
)
# -- schedules (issue #13) ----------------------------------------------------------

SCHEDULE_LAG = Histogram(
    "conveyor_schedule_lag_seconds",
    "How late a schedule slot fired: fired - slot (database clock), slots fired by this executor",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
)
SCHEDULE_SLOTS = Counter(
    "conveyor_schedule_slots_total",
    "Schedule slots decided by this executor, by outcome (requested, emitted, skipped, missed, buffered, "
    "request_error); outcome=missed counts the slots lost to an outage beyond the catch-up policy",
    ["outcome"],
)
for _outcome in ("requested", "emitted", "skipped", "missed", "buffered", "request_error"):
    SCHEDULE_SLOTS.labels(_outcome)
