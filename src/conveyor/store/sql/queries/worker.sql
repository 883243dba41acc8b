-- name: worker_by_name
-- The row a (re)registering worker will take over, locked, with its previous state.
SELECT id, status FROM worker WHERE name = %(name)s FOR UPDATE;

-- name: register_worker
-- Upsert by name: a restarted worker keeps its id (and later its queue). Stamped with
-- the server's epoch (stamp_server_epoch(), migration 0011), which tells the executors
-- whether a missing liveness lock means a dead worker or a restarted (or crashed) server.
-- Alive again: why and since when it was inactive (migration 0030) no longer apply.
INSERT INTO worker (name, worker_role, status, runtimes, actions, capabilities, capacity,
                    host, pid, version, stale_after, lock_grace, lock_epoch, lock_lost_at, last_heartbeat,
                    session_tag, registered_at)
VALUES (%(name)s, 'action', %(status)s, %(runtimes)s, %(actions)s, %(capabilities)s, %(capacity)s,
        %(host)s, %(pid)s, %(version)s, %(stale_after)s, %(lock_grace)s, stamp_server_epoch(), NULL, now(),
        %(session_tag)s, now())
ON CONFLICT (name) DO UPDATE
SET status = EXCLUDED.status, runtimes = EXCLUDED.runtimes, actions = EXCLUDED.actions,
    capabilities = EXCLUDED.capabilities, capacity = EXCLUDED.capacity, host = EXCLUDED.host,
    pid = EXCLUDED.pid, version = EXCLUDED.version, stale_after = EXCLUDED.stale_after,
    lock_grace = EXCLUDED.lock_grace, lock_epoch = EXCLUDED.lock_epoch, lock_lost_at = NULL,
    last_heartbeat = now(), session_tag = EXCLUDED.session_tag, registered_at = now(),
    inactive_reason = NULL, inactive_since = NULL
RETURNING id, lock_epoch;

-- name: acquire_worker_lock
SELECT acquire_worker_lock(%(id)s) AS locked;

-- name: detach_orphaned_runs
-- A process that has just started runs nothing yet: whatever still runs (or is being
-- cancelled) on the worker row it takes over belongs to a predecessor that died before
-- an executor swept it (restarted under the same name). Detached from the row -- which
-- is alive again -- the sweep recovers it per the lost-worker policy; the predecessor's
-- late writes are refused (fenced on the worker).
UPDATE execution SET worker = NULL
WHERE worker = %(id)s AND status IN ('running', 'canceling')
RETURNING id, attempt;

-- name: session_keepalives
-- Server side of the liveness connection: drop the session (and so the lock) when
-- its peer has been unreachable for about the worker's staleness bound.
SELECT set_config('tcp_keepalives_idle', %(idle)s, false),
       set_config('tcp_keepalives_interval', %(interval)s, false),
       set_config('tcp_keepalives_count', %(count)s, false),
       set_config('tcp_user_timeout', %(user_timeout_ms)s, false);

-- name: upsert_action
-- Record an action this worker offers (definitions in code are the source of truth).
INSERT INTO action (ref, pack, name, description, runner_type, runtime, parameters_schema, metadata)
VALUES (%(ref)s, %(pack)s, %(name)s, %(description)s, %(runner_type)s, %(runtime)s,
        %(parameters_schema)s, %(metadata)s)
ON CONFLICT (ref) DO UPDATE
SET pack = EXCLUDED.pack, name = EXCLUDED.name, description = EXCLUDED.description,
    runner_type = EXCLUDED.runner_type, runtime = EXCLUDED.runtime,
    parameters_schema = EXCLUDED.parameters_schema, metadata = EXCLUDED.metadata
WHERE (action.description, action.runner_type, action.runtime, action.parameters_schema, action.metadata)
      IS DISTINCT FROM (EXCLUDED.description, EXCLUDED.runner_type, EXCLUDED.runtime,
                        EXCLUDED.parameters_schema, EXCLUDED.metadata);

-- name: heartbeat
-- No row back: an executor declared this worker dead (its work is being recovered).
UPDATE worker SET last_heartbeat = now() WHERE id = %(id)s AND status <> 'inactive' RETURNING status;

-- name: set_worker_status
-- The worker's own moves: draining (shutdown begun), or inactive with the reason the worker
-- gives (stopped: its graceful shutdown, migration 0030) and the database's time. A row
-- already inactive keeps its status, reason and time: an executor declared the worker
-- dead (heartbeat_stale while it was partitioned, say) before it could stop, and that is
-- what happened to it.
UPDATE worker
SET status = %(status)s::text,
    inactive_reason = CASE WHEN %(status)s::text = 'inactive' THEN %(reason)s::text END,
    inactive_since = CASE WHEN %(status)s::text = 'inactive' THEN now() END
WHERE id = %(id)s AND NOT (status = 'inactive' AND %(status)s::text = 'inactive');

-- name: claim_scheduled
-- scheduled -> running for executions dispatched to this worker, guarded by worker.
-- Returns the attempt number every later write must quote (fencing), and the seconds
-- since the request (database clock) for the scheduling-latency histogram.
WITH picked AS (
    SELECT id FROM execution
    WHERE worker = %(worker)s AND status = 'scheduled'
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), started AS (
    UPDATE execution e SET status = 'running', started = now()
    FROM picked WHERE e.id = picked.id
    RETURNING e.id, e.attempt, e.action_ref, e.parameters, e.started,
              extract(epoch FROM e.started - e.created)::float8 AS since_request
), stamped AS (
    UPDATE execution_attempt t SET started = started.started
    FROM started WHERE t.execution = started.id AND t.attempt = started.attempt
)
SELECT s.id, s.attempt, s.action_ref, s.parameters, a.runner_type, a.metadata, s.since_request
FROM started s JOIN action a ON a.ref = s.action_ref;

-- name: unknown_claims
-- Running on this worker but not among what it knows it runs or has results for: a
-- claim that committed while its answer was lost with the connection. Nothing ran them.
SELECT e.id, e.attempt, e.action_ref, e.parameters, a.runner_type, a.metadata
FROM execution e JOIN action a ON a.ref = e.action_ref
WHERE e.worker = %(worker)s AND e.status = 'running' AND e.id <> ALL(%(known)s::bigint[])
ORDER BY e.id;

-- name: finish
-- running -> completed|failed|timeout (or requested again, or cancelled), fenced by
-- (execution, worker, attempt); the ids written. finish_executions (migration 0028) says
-- how, and why it is a function. The results go in binary (%(results)b): a jsonb[] in text
-- is an array literal psycopg escapes in Python and the server parses back, 0.7 s of the
-- worker's loop for a 10 MiB output (0.1 s in binary), long enough with a second such run
-- to miss a heartbeat.
SELECT id FROM finish_executions(%(worker)s, %(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
                                 %(outcomes)s::text[], %(delays)s::float8[], %(results)b::jsonb[],
                                 %(errors)s::text[]) AS id;

-- name: detach_runs
-- Executions this worker stopped because it lost its standing, detached from it
-- (fenced on worker and attempt) so that an executor's sweep applies the lost-worker
-- policy to them, as for any lost worker.
WITH d AS (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS d(id, attempt))
UPDATE execution e SET worker = NULL
FROM d
WHERE e.id = d.id AND e.attempt = d.attempt AND e.worker = %(worker)s
  AND e.status IN ('running', 'canceling')
RETURNING e.id;

-- name: append_output
-- Live output: chunks of running executions' output, fenced on (execution, worker,
-- attempt) and a live status (append_output, migration 0029); the executions written.
-- The chunks go in binary (%(chunks)b): as text, psycopg escapes the bytea[] literal in
-- Python on the worker's loop (0.34 s for 10 MiB, against 0.04 s).
SELECT execution FROM append_output(%(worker)s, %(executions)s::bigint[], %(attempts)s::int[],
                                    %(streams)s::text[], %(chunks)b::bytea[]) AS execution;
