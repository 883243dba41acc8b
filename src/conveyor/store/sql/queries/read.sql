-- name: get_execution
SELECT e.id, e.action_ref, e.parameters, e.status, e.result, e.worker, w.name AS worker_name,
       e.executor, e.parent, e.enforcement, e.attempt, e.created, e.updated, e.scheduled,
       e.started, e.ended, e.cancelled_by, e.requested_by,
       -- Only while it still waits (database clock): readers show it as is.
       CASE WHEN e.status = 'requested' AND e.not_before > now() THEN e.not_before END AS not_before
FROM execution e LEFT JOIN worker w ON w.id = e.worker
WHERE e.id = %(id)s;

-- name: get_attempts
SELECT attempt, worker, worker_name, scheduled, started, ended, outcome, error
FROM execution_attempt WHERE execution = %(id)s ORDER BY attempt;

-- name: list_workers
SELECT w.id, w.name, w.worker_role, w.status, w.runtimes, w.capacity,
       worker_load(w.id) AS load,
       w.host, w.pid, w.last_heartbeat,
       extract(epoch FROM now() - w.last_heartbeat)::float8 AS heartbeat_age,
       w.created, w.updated, w.cordoned, w.stale_after, w.inactive_reason, w.inactive_since,
       extract(epoch FROM now() - w.inactive_since)::float8 AS inactive_age
FROM worker w
ORDER BY w.status, w.name;

-- name: list_actions
SELECT ref, pack, name, description, runner_type, runtime, parameters_schema, metadata
FROM action ORDER BY ref;

-- name: get_action
SELECT ref, pack, name, description, runner_type, runtime, parameters_schema, metadata
FROM action WHERE ref = %(ref)s;

-- name: counts_by_status
-- The dashboard's overview: every execution not finished, and the finished ones of the
-- last hour (database clock). Counting all finished rows read the whole table on every
-- refresh (7.4 s at 10 M rows, issue #14); both parts are ranges of the (status, updated)
-- index (a finished row is not updated again, so `updated` is its end).
SELECT status, count(*)::bigint AS n FROM execution
WHERE status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling')
   OR (status = ANY(terminal_statuses())
       AND updated >= now() - interval '1 hour')
GROUP BY status ORDER BY status;

-- name: execution_output
-- Live output (migration 0029): an execution's chunks after a cursor (a chunk id; 0 for
-- all), in order, across its attempts, with whether it has ended (a reader following it
-- stops once it has, and has read everything).
SELECT o.id, o.attempt, o.stream, o.data, o.created,
       e.status = ANY(terminal_statuses()) AS ended
FROM execution e
LEFT JOIN LATERAL (
    SELECT * FROM execution_output x
    WHERE x.execution = e.id AND x.id > %(after)s
    ORDER BY x.id
    LIMIT %(limit)s
) o ON true
WHERE e.id = %(id)s
ORDER BY o.id;

-- name: pooled_session_settings
-- What a session behind a transaction pooler got from the server (database.pooler): its
-- search_path must lead to Conveyor's schema, since no startup option can set it.
SELECT current_schema() AS schema, current_setting('search_path') AS search_path,
       quote_ident(current_user) AS role, quote_ident(current_database()) AS database,
       current_setting('idle_in_transaction_session_timeout') AS idle_timeout;
