-- name: create_token
-- The SQL function of migration 0035 (the secret is made and shown by the caller).
SELECT id, name, role, prefix, created FROM create_api_token(%(name)s, %(role)s, %(hash)s, %(prefix)s);

-- name: token_by_hash
-- The live token with this hash; marks it used (at most once a minute per token).
WITH found AS (
    SELECT id, name, role, last_used FROM api_token WHERE token_hash = %(hash)s AND revoked IS NULL
), touched AS (
    UPDATE api_token t SET last_used = now()
    FROM found WHERE t.id = found.id AND (found.last_used IS NULL OR found.last_used < now() - interval '1 minute')
)
SELECT id, name, role FROM found;

-- name: list_tokens
SELECT id, name, role, prefix, created, last_used, revoked FROM api_token ORDER BY id;

-- name: revoke_token
-- The SQL function of migration 0035: no row if there is no live token of that id.
SELECT id FROM revoke_api_token(%(id)s);

-- name: count_admin_tokens
SELECT count(*)::int AS n FROM api_token WHERE role = 'admin' AND revoked IS NULL;

-- name: api_list_executions
-- Summaries, newest first with keyset pagination on id; every filter optional. A
-- summary leaves out what can be large: the parameters are their JSON text's first
-- characters (201: the caller cuts 200 and knows whether there was more), the result
-- is its small fields (stdout, stderr and data left out); sizes are as stored
-- (pg_column_size: after compression, and read without fetching the value). Reading
-- result_summary fetches (and decompresses) each result: callers that show none of it
-- (the dashboard's list, polled while open) pass with_result = false.
SELECT e.id, e.action_ref, e.status, e.worker, w.name AS worker_name,
       e.executor, e.parent, e.enforcement, e.attempt, e.created, e.updated, e.scheduled,
       e.started, e.ended,
       -- Only while it still waits (database clock): a delayed request, a retry's backoff.
       CASE WHEN e.status = 'requested' AND e.not_before > now() THEN e.not_before END AS not_before,
       left(e.parameters::text, 201) AS parameters_head, pg_column_size(e.parameters) AS parameters_size,
       CASE WHEN %(with_result)s::bool THEN
           CASE WHEN jsonb_typeof(e.result) = 'object' THEN e.result - '{stdout,stderr,data}'::text[] END
       END AS result_summary,
       pg_column_size(e.result) AS result_size,
       -- The error's start, for the dashboard's list (issue #15); read only for the
       -- statuses that carry one, so the other rows' results are not fetched for it.
       CASE WHEN e.status IN ('failed', 'timeout', 'abandoned', 'cancelled') THEN left(e.result ->> 'error', 201)
       END AS error_head
FROM execution e LEFT JOIN worker w ON w.id = e.worker
WHERE (%(statuses)s::text[] IS NULL OR e.status = ANY(%(statuses)s::text[]))
  AND (%(action)s::text IS NULL OR e.action_ref = %(action)s)
  AND (%(worker)s::text IS NULL OR w.name = %(worker)s)
  AND (%(since)s::timestamptz IS NULL OR e.created >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR e.created < %(until)s)
  AND (%(before)s::bigint IS NULL OR e.id < %(before)s)
  -- Searches (issue #15): parameters containing a JSON object, text in the error. No
  -- index serves them (no GIN on parameters, the error is inside the result), so the
  -- caller always bounds them by an id window, floor <= id < before (conveyor.api.search:
  -- at most SCAN ids): the plan is a backward range scan of the primary key over that
  -- window, filtering each row, never the whole table (EXPLAIN in test_execution_search).
  AND (%(floor)s::bigint IS NULL OR e.id >= %(floor)s)
  AND (%(parameters)s::jsonb IS NULL OR e.parameters @> %(parameters)s::jsonb)
  AND (%(error)s::text IS NULL
       OR (e.status IN ('failed', 'timeout', 'abandoned', 'cancelled')
           AND strpos(lower(e.result ->> 'error'), lower(%(error)s::text)) > 0))
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: execution_top_id
-- One above the newest execution's id (the primary key's last entry): where a search's
-- id window starts when the caller gave no cursor.
SELECT coalesce(max(id), 0) + 1 AS top FROM execution;

-- name: executions_changed
-- Executions whose row changed after the cursor (updated, id), oldest change first:
-- the event stream's page. The status list (every status: test_named_queries checks it)
-- and the plain bound on updated let the (status, updated) index find the few rows
-- changed since the cursor; without them each poll scanned the whole table (3.9 s at
-- 10 M finished rows, issue #14).
SELECT e.id, e.action_ref, e.status, e.worker, w.name AS worker_name, e.attempt, e.created,
       e.updated, e.started, e.ended
FROM execution e LEFT JOIN worker w ON w.id = e.worker
WHERE e.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling',
                   'completed', 'failed', 'timeout', 'cancelled', 'abandoned')
  AND e.updated >= %(updated)s::timestamptz
  AND (e.updated, e.id) > (%(updated)s::timestamptz, %(id)s::bigint)
ORDER BY e.updated, e.id
LIMIT 500;

-- name: executions_changed_late
-- Rows stamped just behind the cursor (by a transaction that started earlier but
-- committed later): the stream skips the ones it already sent.
SELECT e.id, e.action_ref, e.status, e.worker, w.name AS worker_name, e.attempt, e.created,
       e.updated, e.started, e.ended
FROM execution e LEFT JOIN worker w ON w.id = e.worker
WHERE e.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling',
                   'completed', 'failed', 'timeout', 'cancelled', 'abandoned')  -- the index, as above
  AND e.updated > %(back)s::timestamptz AND (e.updated, e.id) <= (%(updated)s::timestamptz, %(id)s::bigint)
ORDER BY e.updated DESC, e.id DESC
LIMIT 500;

-- name: stream_start
SELECT now() AS updated;

-- name: cancel_execution
-- The SQL function of migration 0008 (lock, then change, in statements of their own).
SELECT id, was, now, worker FROM cancel_execution(%(id)s, %(by)s);

-- name: canceling_on_worker
SELECT id, attempt FROM execution WHERE worker = %(worker)s AND status = 'canceling';
