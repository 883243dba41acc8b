-- name: lock_sweep
-- One replica at a time runs a sweep (the others skip theirs): not needed for
-- correctness, every statement below is guarded, but it saves duplicate scans.
SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.sweep', 0)) AS locked;

-- name: note_lost_locks
-- First sight of a missing liveness lock, in the server lifetime that granted it (no
-- restart or crash since: current_server_epoch(), migration 0011): noted, not yet
-- fatal -- the worker may take it again within its lock_grace. A lock found again
-- clears the note.
WITH held AS (
    SELECT l.objid FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = worker_lock_class()::oid
)
UPDATE worker w
SET lock_lost_at = CASE WHEN EXISTS (SELECT 1 FROM held WHERE held.objid = w.id::oid) THEN NULL ELSE now() END
WHERE w.status IN ('active', 'draining')
  AND w.lock_epoch = current_server_epoch()
  AND (w.lock_lost_at IS NULL) = NOT EXISTS (SELECT 1 FROM held WHERE held.objid = w.id::oid);

-- name: deactivate_dead_workers
-- Mark dead workers inactive (guarded: only active or draining ones): heartbeat older
-- than the worker's own bound, or its liveness lock gone in the server lifetime that
-- granted it and either
--   - no session of the worker's process left (migration 0022): a process that dies
--     loses every session at once, the kernel closes its sockets -- dead now; or
--   - still gone lock_grace after it was first found missing: its other sessions lived
--     on (the liveness session alone was dropped, by pg_terminate_backend or a proxy),
--     so the worker had that long to take its lock again.
-- The first test trusts pg_stat_activity only for a registration older than its
-- snapshot: PostgreSQL takes that snapshot at the transaction's first read of it, in
-- this statement (the sweep reads it nowhere before), and a worker's liveness session
-- is connected before it registers -- so a worker registered before this statement
-- began is in the snapshot unless its session ended. A row re-registered meanwhile has
-- its note cleared, which the re-check of this UPDATE sees.
-- A heartbeat's age counts from the start of this server lifetime at the earliest
-- (stamped here if no worker has registered in it yet): while the server was down or
-- restarting no worker could beat, and judged by its last beat before an outage longer
-- than stale_after, every worker was declared dead the moment the server was back --
-- before it could re-register -- and results it had finished meanwhile were refused and
-- their commands run again (issue 25). A worker that died meanwhile is found stale_after
-- after the server's return; one out of reach stops its own work before that
-- (self_fence_after, on its own clock, from its last beat).
WITH epoch AS MATERIALIZED (
    SELECT stamp_server_epoch() AS started
), held AS (
    SELECT l.objid FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = worker_lock_class()::oid
), alive AS (
    -- The process tags ("... [tag]", conveyor.store.db.tagged) of this database's sessions.
    -- Sessions behind a transaction pooler are tagged "<tag>" and not matched: the pooler
    -- lends them to any process, so they say nothing of one being alive.
    SELECT DISTINCT substring(s.application_name FROM '\[([0-9a-f]{12})\]') AS tag
    FROM pg_stat_activity s WHERE s.datname = current_database()
)
-- Why (inactive_reason, migration 0030) is decided in the SET, over the row version the
-- re-check judged: process_gone, else lock_lost, else heartbeat_stale -- the order the
-- WHERE gives (a lock judged lost wins over a heartbeat that is also stale: it is the
-- sharper cause).
UPDATE worker w
SET status = 'inactive', inactive_since = now(),
    inactive_reason = CASE
        WHEN w.lock_epoch = current_server_epoch()
             AND NOT EXISTS (SELECT 1 FROM held WHERE held.objid = w.id::oid)
             AND w.session_tag IS NOT NULL AND w.registered_at < statement_timestamp()
             AND NOT EXISTS (SELECT 1 FROM alive WHERE alive.tag = w.session_tag) THEN 'process_gone'
        WHEN w.lock_epoch = current_server_epoch()
             AND NOT EXISTS (SELECT 1 FROM held WHERE held.objid = w.id::oid)
             AND w.lock_lost_at <= now() - make_interval(secs => w.lock_grace) THEN 'lock_lost'
        ELSE 'heartbeat_stale' END
WHERE w.status IN ('active', 'draining')
  AND (w.last_heartbeat IS NULL
       OR GREATEST(w.last_heartbeat, (SELECT started FROM epoch)) < now() - make_interval(secs => w.stale_after)
       OR (w.lock_epoch = current_server_epoch()
           AND NOT EXISTS (SELECT 1 FROM held WHERE held.objid = w.id::oid)
           AND (w.lock_lost_at <= now() - make_interval(secs => w.lock_grace)
                OR (w.session_tag IS NOT NULL AND w.registered_at < statement_timestamp()
                    AND NOT EXISTS (SELECT 1 FROM alive WHERE alive.tag = w.session_tag)))))
RETURNING w.id, w.name, w.inactive_reason AS reason,
          extract(epoch FROM now() - w.last_heartbeat)::float8 AS heartbeat_age,
          -- The reason as the flags the sweep's log lines (and older tests) read.
          w.inactive_reason IN ('process_gone', 'lock_lost') AS lock_lost,
          w.inactive_reason = 'process_gone' AS process_gone;

-- name: liveness_missing
-- The recovery watch's frequent question (recovery.watch_interval): has an active
-- worker's liveness session gone from pg_stat_activity? Only a trigger -- the sweep it
-- starts judges by the lock and every session (deactivate_dead_workers) -- so it is
-- kept cheap: pg_stat_activity copies the backends' status array (pg_locks would take
-- every lock-table partition lock), read once (MATERIALIZED), the epoch looked up once.
-- Rows with no tag (older workers) wait for the periodic sweep.
WITH live AS MATERIALIZED (
    SELECT s.application_name FROM pg_stat_get_activity(NULL) s
    WHERE s.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND s.application_name LIKE 'conveyor-worker-liveness [%'
)
SELECT EXISTS (
    SELECT 1 FROM worker w
    WHERE w.status IN ('active', 'draining') AND w.session_tag IS NOT NULL
      AND w.lock_epoch = (SELECT current_server_epoch()) AND w.registered_at < statement_timestamp()
      AND NOT EXISTS (SELECT 1 FROM live WHERE strpos(live.application_name, '[' || w.session_tag || ']') > 0)
) AS missing;

-- name: hand_back_scheduled
-- The SQL function of migration 0009 (on one worker, or with NULL on any gone worker).
SELECT id, worker, attempt, worker_name FROM hand_back_scheduled(%(worker)s::bigint);

-- name: lost_running
-- Executions running (or being cancelled) on a worker that is gone, with what the
-- recovery decision needs; locked until the sweep's transaction ends.
SELECT e.id, e.attempt, e.status, e.worker, w.name AS worker_name, a.metadata,
       (SELECT count(*) FROM execution_attempt t
        WHERE t.execution = e.id AND t.outcome = 'worker_lost')::int AS lost_before
FROM execution e
JOIN action a ON a.ref = e.action_ref
LEFT JOIN worker w ON w.id = e.worker
WHERE e.status IN ('running', 'canceling') AND (w.id IS NULL OR w.status = 'inactive')
  AND a.runner_type <> 'workflow'  -- runs in the executor, on no worker: never lost with one
ORDER BY e.id
FOR UPDATE OF e SKIP LOCKED;

-- name: resolve_attempts
-- Apply recovery decisions to running executions, fenced on the attempt (and on the
-- worker when %(worker)s is given -- a worker releasing its own): requested again
-- (after a backoff), abandoned, failed or cancelled. The attempt is closed with its
-- outcome.
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
                         %(delays)s::float8[], %(errors)s::text[])
        AS d(id, attempt, status, delay, error)
), moved AS (
    UPDATE execution e
    SET status = d.status,
        worker = CASE WHEN d.status = 'requested' THEN NULL ELSE e.worker END,
        executor = CASE WHEN d.status = 'requested' THEN NULL ELSE e.executor END,
        started = CASE WHEN d.status = 'requested' THEN NULL ELSE e.started END,
        ended = CASE WHEN d.status = 'requested' THEN NULL ELSE now() END,
        not_before = CASE WHEN d.delay IS NULL THEN NULL ELSE now() + make_interval(secs => d.delay) END,
        result = CASE WHEN d.status = 'requested' THEN e.result
                      ELSE jsonb_build_object('succeeded', false, 'error', d.error, 'failed_by', %(by)s::text) END
    FROM d
    WHERE e.id = d.id AND e.attempt = d.attempt AND e.status = ANY(%(from_statuses)s::text[])
      AND (%(worker)s::bigint IS NULL OR e.worker = %(worker)s::bigint)
    RETURNING e.id, e.attempt, e.status
), closed AS (
    UPDATE execution_attempt t SET ended = now(), outcome = %(outcome)s, error = d.error
    FROM moved JOIN d ON d.id = moved.id
    WHERE t.execution = moved.id AND t.attempt = moved.attempt
)
SELECT id, status FROM moved;

-- name: overdue_scheduled
-- Scheduled executions that did not start within their schedule-to-start timeout
-- (the action's own, else the configured default), with how many times that
-- already happened to them. Not one prefetched on a worker whose every slot runs an
-- execution (worker.prefetch, worker_slots_full): it waits for a slot of a worker that
-- is taking work, which claims it in the very transaction that frees the slot; the
-- monitor is for a worker that never picks up work.
SELECT e.id, e.attempt, e.worker, w.name AS worker_name,
       (SELECT count(*) FROM execution_attempt t
        WHERE t.execution = e.id AND t.outcome IN ('not_picked_up', 'expired'))::int AS missed
FROM execution e JOIN action a ON a.ref = e.action_ref LEFT JOIN worker w ON w.id = e.worker
WHERE e.status = 'scheduled'
  AND e.scheduled < now() - make_interval(
        secs => coalesce((a.metadata ->> 'scheduled_timeout')::float8, %(default_timeout)s))
  AND NOT worker_slots_full(e.worker)
ORDER BY e.id
FOR UPDATE OF e SKIP LOCKED;

-- name: cordon_worker
SELECT id, name, status, cordoned FROM cordon_worker(%(name)s, %(cordoned)s);

-- name: drain_worker
SELECT id, name, status, cordoned, handed_back FROM drain_worker(%(name)s);