-- name: claim_requested
-- Claim a batch of requested executions for this executor (requested -> scheduling),
-- oldest first, skipping rows another replica holds: only those that a worker with
-- a free slot can run (its code is there, or it offers the subprocess runtime), and
-- not those waiting for admission (an admission policy's queue holds them back).
-- requested_candidates (migration 0026) finds them at the cost of the rows it takes,
-- whatever the statistics say; they are locked here by primary key. The status test is
-- written `status || ''` so that no index on status can be chosen for this lock (the
-- planner, trusting statistics of a row or two, walked one through the whole backlog);
-- it is re-checked on the locked row with the rest of what made it a candidate (its time,
-- no admission queue), so a row that changed since the statement's snapshot -- claimed by
-- another replica, or back in requested with a backoff -- is not taken.
WITH picked AS (
    SELECT e.id FROM execution e
    WHERE e.id = ANY((SELECT requested_candidates(ARRAY(
              SELECT a.ref FROM action a
              WHERE a.ref = ANY(%(refs)s::text[])
                 OR (a.runner_type = 'subprocess' AND a.runtime = ANY(%(runtimes)s::text[]))
          ), %(limit)s))::bigint[])
      AND e.status || '' = 'requested'
      AND (e.not_before IS NULL OR e.not_before <= now())
      AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE execution e
SET status = 'scheduling', executor = %(executor)s
FROM picked, action a
WHERE e.id = picked.id AND a.ref = e.action_ref
RETURNING e.id, e.action_ref, e.parameters, a.runner_type, a.runtime,
          a.parameters_schema, a.updated AS action_updated,
          extract(epoch FROM now() - e.created)::float8 AS age,
          CASE WHEN e.attempt = 0 THEN '{}'::bigint[] ELSE ARRAY(
              SELECT t.worker FROM execution_attempt t
              WHERE t.execution = e.id AND t.outcome IN ('not_picked_up', 'expired') AND t.worker IS NOT NULL
          ) END AS avoid;

-- name: claim_unplaceable
-- Claim requested executions that no live worker can run at all, so the round fails them
-- ("no workers available"). Only what a worker would run: workflows and inquiries need
-- none (claim_executor_run claims them).
-- Driven from the few actions no live worker offers, each probing the requested rows of
-- its own action (execution_requested_action_idx): the round runs every poll interval on
-- every executor, and a scan of every requested row for the rare unplaceable one cost
-- 14 ms per 100,000 waiting (a sequential scan), all of it spent finding nothing. A lateral
-- probe locks at most limit rows per such action; the outer limit keeps the oldest.
WITH picked AS (
    SELECT c.id FROM action a
    CROSS JOIN LATERAL (
        SELECT e.id FROM execution e
        WHERE e.action_ref = a.ref AND e.status = 'requested'
          AND (e.not_before IS NULL OR e.not_before <= now())
          AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
        ORDER BY e.id
        LIMIT %(limit)s
        FOR UPDATE OF e SKIP LOCKED
    ) c
    WHERE a.runner_type IN ('python', 'subprocess')
      AND NOT (a.ref = ANY(%(refs)s::text[])
               OR (a.runner_type = 'subprocess' AND a.runtime = ANY(%(runtimes)s::text[])))
    ORDER BY c.id
    LIMIT %(limit)s
)
UPDATE execution e
SET status = 'scheduling', executor = %(executor)s
FROM action a
-- An array, not a join with picked: estimated at up to limit rows per action, picked was
-- hashed against a sequential scan of the table.
WHERE e.id = ANY(ARRAY(SELECT id FROM picked)) AND a.ref = e.action_ref
RETURNING e.id, e.action_ref, e.parameters, a.runner_type, a.runtime,
          a.parameters_schema, a.updated AS action_updated,
          extract(epoch FROM now() - e.created)::float8 AS age,
          CASE WHEN e.attempt = 0 THEN '{}'::bigint[] ELSE ARRAY(
              SELECT t.worker FROM execution_attempt t
              WHERE t.execution = e.id AND t.outcome IN ('not_picked_up', 'expired') AND t.worker IS NOT NULL
          ) END AS avoid;

-- name: relaxed_commit
-- The executor's claim and dispatch commits need not wait for the WAL flush: if
-- the server crashes before the flush they are undone (the execution is simply
-- requested again), and the only thing that acts on them, a worker's claim, is a
-- durable commit whose flush includes theirs (WAL is flushed in order).
SET LOCAL synchronous_commit = off;

-- name: durable_commit
-- Back to a flushed commit for a transaction whose outcome someone is told about.
SET LOCAL synchronous_commit = on;

-- name: lock_assignment
-- Serialize placement across executor replicas so two of them cannot both fill
-- the last free slot of a worker. Held for one short transaction.
SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.assign', 0));

-- name: live_workers
-- Workers alive now: active or draining, heartbeat fresh by their own bound (database
-- clock), and their liveness lock held unless the server restarted (or crashed) since
-- they took it. ``accepting`` ones (active, not cordoned) may be given work; the others
-- still count as able to run an action, so its executions wait rather than fail.
-- ``prefetch``: executions it takes beyond its slots (registered in its capabilities).
SELECT w.id, w.name, w.runtimes, w.actions, w.capacity,
       (w.status = 'active' AND NOT w.cordoned) AS accepting,
       coalesce((w.capabilities ->> 'prefetch')::int, 0) AS prefetch,
       worker_load(w.id) AS load
FROM worker w
LEFT JOIN (
    SELECT l.objid FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = worker_lock_class()::oid
) held ON held.objid = w.id::oid
WHERE w.status IN ('active', 'draining')
  AND w.worker_role = 'action'
  AND w.last_heartbeat > now() - make_interval(secs => w.stale_after)
  AND (held.objid IS NOT NULL OR w.lock_epoch IS DISTINCT FROM current_server_epoch())
ORDER BY w.id;

-- name: assign
-- scheduling -> scheduled on the chosen workers, each with a new attempt number and
-- its execution_attempt row (the fencing token). Guarded on status and claimant.
WITH chosen AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(workers)s::bigint[]) AS c(id, worker)
), moved AS (
    UPDATE execution e
    SET status = 'scheduled', worker = chosen.worker, attempt = e.attempt + 1,
        scheduled = now(), started = NULL, ended = NULL, not_before = NULL
    FROM chosen
    WHERE e.id = chosen.id AND e.status = 'scheduling' AND e.executor = %(executor)s
    RETURNING e.id, e.attempt, e.worker
), recorded AS (
    INSERT INTO execution_attempt (execution, attempt, worker, worker_name)
    SELECT moved.id, moved.attempt, moved.worker, w.name
    FROM moved JOIN worker w ON w.id = moved.worker
)
SELECT id, attempt, worker FROM moved;

-- name: release_claims
-- scheduling -> requested: hand claims back (no free capacity right now).
UPDATE execution SET status = 'requested', executor = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'scheduling' AND executor = %(executor)s
RETURNING id;

-- name: fail_claims
-- scheduling -> failed with a reason per execution (invalid parameters, no workers).
WITH failing AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS f(id, error)
)
UPDATE execution e
SET status = 'failed', ended = now(), not_before = NULL,
    result = jsonb_build_object('succeeded', false, 'error', failing.error,
                                'failed_by', 'scheduler')
FROM failing
WHERE e.id = failing.id AND e.status = 'scheduling' AND e.executor = %(executor)s
RETURNING e.id;

-- name: reclaim_stale_claims
-- A claim left in scheduling by an executor that died is handed back after a bound.
WITH stale AS (
    SELECT id, executor FROM execution
    WHERE status = 'scheduling' AND updated < now() - make_interval(secs => %(older_than)s)
    FOR UPDATE SKIP LOCKED
)
UPDATE execution e SET status = 'requested', executor = NULL
FROM stale
WHERE e.id = stale.id AND e.status = 'scheduling'
RETURNING e.id, e.attempt, stale.executor;

-- name: try_duty_lock
-- One replica at a time per recovery duty (executor.exclusive_duties): a session lock
-- on the executor's duty-lock connection, released by duty_unlock or with the session.
SELECT pg_try_advisory_lock(hashtextextended(current_schema() || '.duty.' || %(duty)s, 0)) AS locked;

-- name: duty_unlock
SELECT pg_advisory_unlock(hashtextextended(current_schema() || '.duty.' || %(duty)s, 0)) AS unlocked;

-- name: start_workflows
-- Start claimed workflow executions (scheduling -> running in the executor, no worker):
-- create-or-get their workflow state with a 'start' event; too deep or deleted: failed.
SELECT id, status, error FROM start_workflows(%(ids)s::bigint[], %(executor)s, %(max_depth)s);

-- name: next_not_before
-- Seconds (database clock) until the earliest delayed request becomes claimable, NULL if
-- none waits: the scheduling loop sleeps no longer, so a delayed execution is placed at
-- its time rather than at the next poll (execution_not_before_idx, migration 0015).
SELECT extract(epoch FROM min(e.not_before) - now())::float8 AS wait
FROM execution e
WHERE e.status = 'requested' AND e.not_before IS NOT NULL AND e.not_before > now();

-- name: release_gone_executor_claims
-- Claims (scheduling) of an executor whose liveness session is gone, handed back to
-- requested at once rather than after claim_timeout: the process died (its sessions end
-- with it, in milliseconds) or froze past executor_liveness.frozen_after (the server ended
-- that session: idle_session_timeout). Executors since issue #25 end their id with the
-- 12 hex digits their liveness session names (executor/liveness.py); an id without them
-- (an older executor) is left to claim_timeout. Guarded on status and claimant, and
-- skipping rows a live executor's dispatch holds: an executor whose session alone dropped
-- loses nothing but the claims, which its dispatch then finds gone.
WITH live AS MATERIALIZED (
    SELECT s.application_name FROM pg_stat_get_activity(NULL) s
    WHERE s.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND s.application_name LIKE 'conveyor-executor-liveness %'
), gone AS (
    SELECT e.id, e.executor FROM execution e
    WHERE e.status = 'scheduling'
      AND e.executor ~ ':[0-9a-f]{12}$'
      AND NOT EXISTS (
          SELECT 1 FROM live
          WHERE live.application_name LIKE 'conveyor-executor-liveness ' || right(e.executor, 12) || ' [%')
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE execution e SET status = 'requested', executor = NULL
FROM gone
WHERE e.id = gone.id AND e.status = 'scheduling' AND e.executor = gone.executor
RETURNING e.id, e.attempt, gone.executor;
