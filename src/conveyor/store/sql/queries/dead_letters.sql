-- name: record_dead_letter
-- Record a dead letter once: a redelivery of the same one (same message, same death
-- count) only bumps its delivery count. Returns its resolution so far.
INSERT INTO dead_letter (dedupe_key, message_id, transport, queue, exchange, routing_key, reason,
                         message_type, payload, headers, execution, attempt, worker, error)
VALUES (%(dedupe_key)s, %(message_id)s, %(transport)s, %(queue)s, %(exchange)s, %(routing_key)s,
        %(reason)s, %(message_type)s, %(payload)s, %(headers)s, %(execution)s, %(attempt)s,
        %(worker)s, %(error)s)
ON CONFLICT (dedupe_key) DO UPDATE
SET deliveries = dead_letter.deliveries + 1, last_seen = now(),
    error = coalesce(EXCLUDED.error, dead_letter.error)
RETURNING id, resolution;

-- name: lock_dispatch
-- The dispatch a dead letter names, if the execution is still exactly there:
-- scheduled, same attempt, same worker, same dispatch time. Locked until the
-- handler's transaction ends; with how often its dispatch was already not taken.
SELECT e.id, e.attempt, e.worker,
       (SELECT count(*) FROM execution_attempt t
        WHERE t.execution = e.id AND t.outcome IN ('not_picked_up', 'expired'))::int AS missed
FROM execution e
WHERE e.id = %(execution)s AND e.status = 'scheduled' AND e.attempt = %(attempt)s
  AND e.worker = %(worker)s AND e.scheduled = %(scheduled)s::timestamptz
FOR UPDATE;

-- name: resolve_dead_letter
UPDATE dead_letter SET resolution = %(resolution)s, resolved = now(), resolved_by = %(by)s,
                       detail = %(detail)s
WHERE id = %(id)s;

-- name: expired_dispatches
-- PostgreSQL transport: dispatches a worker has not taken within the worker queue
-- TTL, as the dead letters RabbitMQ would have produced. Not one prefetched on a worker
-- whose every slot runs an execution (worker_slots_full, migration 0025): that worker has
-- taken it, as a RabbitMQ worker takes (and acks) its dispatches on receipt, and waits
-- for a slot.
SELECT e.id, e.attempt, e.worker, e.scheduled
FROM execution e
WHERE e.status = 'scheduled' AND e.worker IS NOT NULL
  AND e.scheduled < now() - make_interval(secs => %(ttl)s)
  AND NOT worker_slots_full(e.worker)
ORDER BY e.id
LIMIT 500;

-- name: purge_expired_dead_letters
-- Retention: records older than dead_letter.ttl_ms go.
DELETE FROM dead_letter WHERE first_seen < now() - make_interval(secs => %(ttl)s);

-- name: dead_letter_stats
SELECT count(*) FILTER (WHERE resolution IS NULL)::int AS pending, count(*)::int AS total
FROM dead_letter;

-- name: list_dead_letters
SELECT id, message_id, transport, queue, routing_key, reason, message_type, execution, attempt,
       worker, deliveries, first_seen, resolution, resolved, detail, error
FROM dead_letter
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(resolution)s::text IS NULL OR resolution IS NOT DISTINCT FROM nullif(%(resolution)s, 'pending'))
  AND (%(execution)s::bigint IS NULL OR execution = %(execution)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(since)s::float8 IS NULL OR first_seen >= now() - make_interval(secs => %(since)s))
ORDER BY id DESC
LIMIT %(limit)s;

-- name: get_dead_letter
SELECT * FROM dead_letter WHERE id = %(id)s;

-- name: replay_dead_letter
-- The SQL function of migration 0035: lock, publish again, mark replayed (outcome
-- replayed, skipped or missing); what to publish is checked first by conveyor.verbs.dead_letters.
SELECT outcome, transport, detail
FROM replay_dead_letter(%(id)s, %(by)s, %(skip_replayed)s, %(routing_key)s, %(message_type)s, %(payload)s);

-- name: purge_dead_letters
-- Operator purge with the same filters as the listing (pending ones only when asked):
-- the SQL function of migration 0035.
SELECT id FROM purge_dead_letters(%(reason)s::text, %(resolution)s::text, %(execution)s::bigint, %(queue)s::text,
                                  %(older_than)s::float8, %(include_pending)s::boolean);

-- name: select_dead_letters
-- What `conveyor dead-letters replay` selects with the listing's filters: oldest first
-- (replayed in their original order); letters already replayed only when asked.
SELECT id FROM dead_letter
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(resolution)s::text IS NULL OR resolution IS NOT DISTINCT FROM nullif(%(resolution)s, 'pending'))
  AND (%(execution)s::bigint IS NULL OR execution = %(execution)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(since)s::float8 IS NULL OR first_seen >= now() - make_interval(secs => %(since)s))
  AND (%(include_replayed)s OR resolution IS DISTINCT FROM 'replayed')
ORDER BY id
LIMIT %(limit)s;

-- name: count_purgeable_dead_letters
-- How many rows purge_dead_letters would delete (asked before deleting).
SELECT count(*)::int AS count
FROM dead_letter
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(resolution)s::text IS NULL OR resolution IS NOT DISTINCT FROM nullif(%(resolution)s, 'pending'))
  AND (%(execution)s::bigint IS NULL OR execution = %(execution)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(older_than)s::float8 IS NULL OR first_seen < now() - make_interval(secs => %(older_than)s))
  AND (%(include_pending)s OR resolution IS NOT NULL);
