-- name: outbox_claim
-- The oldest unpublished messages, skipping rows another relay is publishing.
SELECT id, message_id::text AS message_id, exchange, routing_key, message_type, payload,
       created
FROM outbox
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: outbox_delete
DELETE FROM outbox WHERE id = ANY(%(ids)s::bigint[]);

-- name: outbox_depth
SELECT count(*)::int AS depth, extract(epoch FROM now() - min(created))::float8 AS oldest FROM outbox;

-- name: reconcile_requested
-- Requested executions older than the bound (and due), when no execution.requested is
-- pending in the outbox: one message for all of them. Executors also poll, so this is
-- a wake-up.
WITH stuck AS (
    SELECT e.id FROM execution e
    WHERE e.status = 'requested' AND e.updated < now() - make_interval(secs => %(after)s)
      AND (e.not_before IS NULL OR e.not_before <= now())
      AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
      AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.routing_key = 'execution.requested')
    ORDER BY e.id
    LIMIT 1000
)
INSERT INTO outbox (exchange, routing_key, message_type, payload)
SELECT 'executions', 'execution.requested', 'execution.requested',
       jsonb_build_object('execution_ids', jsonb_agg(stuck.id ORDER BY stuck.id))
FROM stuck
HAVING count(*) > 0
RETURNING jsonb_array_length(payload -> 'execution_ids') AS count;

-- name: reconcile_scheduled
-- Dispatches not started within the bound, with no message pending in the outbox and
-- not published again within the bound, are published again (the worker's claim is
-- guarded, so a second copy is a no-op). The attempt row remembers when.
WITH stuck AS (
    SELECT e.id, e.attempt, e.worker, e.scheduled
    FROM execution e JOIN execution_attempt t ON t.execution = e.id AND t.attempt = e.attempt
    WHERE e.status = 'scheduled' AND e.worker IS NOT NULL
      AND e.scheduled < now() - make_interval(secs => %(after)s)
      AND (t.republished IS NULL OR t.republished < now() - make_interval(secs => %(after)s))
      AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.execution = e.id)
    ORDER BY e.id
    LIMIT 1000
    FOR UPDATE OF t SKIP LOCKED
), marked AS (
    UPDATE execution_attempt t SET republished = now()
    FROM stuck WHERE t.execution = stuck.id AND t.attempt = stuck.attempt
)
INSERT INTO outbox (exchange, routing_key, message_type, payload, execution)
SELECT 'executions', 'execution.scheduled.worker.' || stuck.worker, 'execution.scheduled',
       jsonb_build_object('execution_id', stuck.id, 'attempt', stuck.attempt, 'worker_id', stuck.worker,
                          'scheduled', stuck.scheduled),
       stuck.id
FROM stuck
ORDER BY stuck.id
RETURNING execution;
