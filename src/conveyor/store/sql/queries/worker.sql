-- name: register_worker
-- Upsert by name: a restarted worker keeps its id (and later its queue).
INSERT INTO worker (name, worker_role, status, runtimes, actions, capabilities, capacity,
                    host, pid, version, last_heartbeat)
VALUES (%(name)s, 'action', 'active', %(runtimes)s, %(actions)s, %(capabilities)s, %(capacity)s,
        %(host)s, %(pid)s, %(version)s, now())
ON CONFLICT (name) DO UPDATE
SET status = 'active', runtimes = EXCLUDED.runtimes, actions = EXCLUDED.actions,
    capabilities = EXCLUDED.capabilities, capacity = EXCLUDED.capacity, host = EXCLUDED.host,
    pid = EXCLUDED.pid, version = EXCLUDED.version, last_heartbeat = now()
RETURNING id;

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
UPDATE worker SET last_heartbeat = now() WHERE id = %(id)s RETURNING status;

-- name: set_worker_status
UPDATE worker SET status = %(status)s WHERE id = %(id)s;

-- name: claim_scheduled
-- scheduled -> running for executions dispatched to this worker, guarded by worker.
-- Returns the attempt number every later write must quote (fencing).
WITH picked AS (
    SELECT id FROM execution
    WHERE worker = %(worker)s AND status = 'scheduled'
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), started AS (
    UPDATE execution e SET status = 'running', started = now()
    FROM picked WHERE e.id = picked.id
    RETURNING e.id, e.attempt, e.action_ref, e.parameters, e.started
), stamped AS (
    UPDATE execution_attempt t SET started = started.started
    FROM started WHERE t.execution = started.id AND t.attempt = started.attempt
)
SELECT s.id, s.attempt, s.action_ref, s.parameters, a.runner_type, a.metadata
FROM started s JOIN action a ON a.ref = s.action_ref;

-- name: finish
-- running -> completed|failed|timeout, fenced by (execution, worker, attempt); a write
-- from an attempt that is no longer current changes nothing and is reported back.
WITH done AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
                         %(results)s::jsonb[], %(errors)s::text[]) AS d(id, attempt, status, result, error)
), finished AS (
    UPDATE execution e SET status = done.status, result = done.result, ended = now()
    FROM done
    WHERE e.id = done.id AND e.worker = %(worker)s AND e.attempt = done.attempt AND e.status = 'running'
    RETURNING e.id, e.attempt, e.status, e.ended, done.error
), recorded AS (
    UPDATE execution_attempt t
    SET ended = finished.ended, outcome = finished.status, error = finished.error
    FROM finished WHERE t.execution = finished.id AND t.attempt = finished.attempt
)
SELECT id FROM finished;

-- name: hand_back_scheduled
-- Shutdown: scheduled work this worker has not started goes back to requested at once
-- (not an attempt that ran: its attempt row is closed as handed back).
WITH back AS (
    UPDATE execution SET status = 'requested', worker = NULL, executor = NULL, started = NULL
    WHERE worker = %(worker)s AND status = 'scheduled'
    RETURNING id, attempt
), recorded AS (
    UPDATE execution_attempt t SET ended = now(), outcome = 'handed_back'
    FROM back WHERE t.execution = back.id AND t.attempt = back.attempt
)
SELECT id FROM back;

-- name: release_running
-- Shutdown past shutdown_timeout: executions this worker was running and had to
-- cancel go back to requested for another attempt; the attempt is closed as interrupted.
WITH back AS (
    UPDATE execution SET status = 'requested', worker = NULL, executor = NULL, started = NULL
    WHERE worker = %(worker)s AND status = 'running'
    RETURNING id, attempt
), recorded AS (
    UPDATE execution_attempt t SET ended = now(), outcome = 'interrupted', error = 'worker shut down'
    FROM back WHERE t.execution = back.id AND t.attempt = back.attempt
)
SELECT id FROM back;
