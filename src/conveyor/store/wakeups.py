"""The wake-up vocabulary, written once for both sides of the database.

The database wakes its listeners, in the transaction that made the change: its SQL
function ``wake(topic, ...)`` (and the triggers of ``outbox`` and ``execution_output``)
NOTIFY on the channel ``<schema>.<topic>``, or ``<schema>.worker.<id>`` for one worker,
or write the outbox for the relay (``transport_route``). ``Topic`` is every channel the
SQL NOTIFYs on; ``WAKES`` is every topic ``wake()`` takes, with the channel it rings.
A test reads the functions back from the database (``pg_proc``) and asserts both match,
so a topic added on one side alone fails it. ``store.db.channel`` builds the names.
"""

from __future__ import annotations

from enum import StrEnum


class Topic(StrEnum):
    """A NOTIFY channel (after the schema): what a listener subscribes to."""

    REQUESTED = "requested"  # executions wait to be scheduled
    CAPACITY = "capacity"  # a worker freed slots or joined
    COMPLETED = "completed"  # executions reached a terminal state (payload: ids)
    WORKER = "worker"  # work dispatched to one worker (qualified by its id)
    OUTBOX = "outbox"  # internal: outbox rows await the relay (RabbitMQ transport)
    WORKFLOW = "workflow"  # workflow executions have events to apply (a NOTIFY on both transports)
    EVENT = "event"  # events wait for their rules (a NOTIFY on both transports)
    SCHEDULE = "schedule"  # a schedule was created or changed (a NOTIFY on both transports)
    INQUIRY = "inquiry"  # inquiries were created (payload: ids; a NOTIFY on both transports)
    OUTPUT = "output"  # executions' live output was stored (payload: ids; a NOTIFY on both transports)


# wake()'s topics: what happened, and the channel it rings on the PostgreSQL transport
# (on RabbitMQ some are an outbox row instead). A dispatch rings each worker it placed
# work on; the outbox and output channels are rung by their own triggers, not by wake().
WAKES: dict[str, Topic] = {
    "workflow": Topic.WORKFLOW,
    "requested": Topic.REQUESTED,
    "completed": Topic.COMPLETED,
    "capacity": Topic.CAPACITY,
    "dispatched": Topic.WORKER,
    "worker": Topic.WORKER,
    "inquiry": Topic.INQUIRY,
    "event": Topic.EVENT,
    "schedule": Topic.SCHEDULE,
}
