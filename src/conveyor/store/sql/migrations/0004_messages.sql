-- Messages: the transactional outbox of the RabbitMQ transport and the record of
-- every dead-lettered message (both transports).

-- A message is written here in the transaction that made the state change and
-- published by a relay after commit; the row is deleted once the broker confirmed
-- it. A relay that dies in between leaves the row for the next one (a duplicate
-- delivery is harmless: handlers are guarded).
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    message_id   uuid NOT NULL DEFAULT gen_random_uuid(),
    exchange     text NOT NULL CHECK (exchange IN ('executions', 'events', 'dlx')),
    routing_key  text NOT NULL,
    message_type text NOT NULL,
    payload      jsonb NOT NULL,
    -- The one execution a dispatch concerns (reconciler: "is a message pending?").
    execution    bigint,
    created      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_execution_idx ON outbox (execution) WHERE execution IS NOT NULL;

-- When the reconciler last published a dispatch again: at most once per bound,
-- whichever executor replica runs it.
ALTER TABLE execution_attempt ADD COLUMN republished timestamptz;

CREATE TABLE dead_letter (
    id           bigserial PRIMARY KEY,
    -- message id and how many times it had died: a redelivered dead letter is
    -- recognised; the same message dying again later is a new record.
    dedupe_key   text NOT NULL UNIQUE,
    message_id   text,
    transport    text NOT NULL CHECK (transport IN ('postgres', 'rabbitmq')),
    queue        text NOT NULL,
    exchange     text,
    routing_key  text NOT NULL DEFAULT '',
    reason       text NOT NULL
                 CHECK (reason IN ('expired', 'rejected', 'poison', 'max_redeliveries')),
    message_type text,
    -- The message body: parsed JSON, or {"raw": "..."} when it was not JSON.
    payload      jsonb NOT NULL DEFAULT '{}',
    headers      jsonb NOT NULL DEFAULT '{}',
    -- No foreign keys: a forensic record outlives what it points at.
    execution    bigint,
    attempt      integer,
    worker       bigint,
    error        text,
    deliveries   integer NOT NULL DEFAULT 1,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now(),
    resolution   text CHECK (resolution IN ('rescheduled', 'failed', 'stale', 'invalid', 'replayed')),
    resolved     timestamptz,
    resolved_by  text,
    detail       text
);
CREATE INDEX dead_letter_first_seen_idx ON dead_letter (first_seen);
CREATE INDEX dead_letter_pending_idx ON dead_letter (id) WHERE resolution IS NULL;
CREATE INDEX dead_letter_execution_idx ON dead_letter (execution) WHERE execution IS NOT NULL;
