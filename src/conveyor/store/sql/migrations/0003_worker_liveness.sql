-- Worker liveness and recovery (issue: nothing stuck, nothing lost, in seconds).

-- Each worker's own staleness bound (its heartbeat_interval x multiplier), so the
-- executors judge it by the worker's configuration, not their own.
ALTER TABLE worker ADD COLUMN stale_after double precision NOT NULL DEFAULT 30 CHECK (stale_after > 0);
-- Cordoned workers keep running what they have but get nothing new.
ALTER TABLE worker ADD COLUMN cordoned boolean NOT NULL DEFAULT false;
-- pg_postmaster_start_time() when the worker took its liveness lock. A lock missing
-- while this still equals the server's start time means the worker's session died
-- (the process, or its host, is gone); after a server restart every lock is missing
-- and only heartbeat staleness can tell.
ALTER TABLE worker ADD COLUMN lock_epoch timestamptz;
-- When an executor first found the lock missing. The worker has lock_grace seconds
-- (its own setting) to take it again -- its session may have been dropped while the
-- process lives (pg_terminate_backend, idle_session_timeout, a proxy reset) -- before
-- it is declared dead.
ALTER TABLE worker ADD COLUMN lock_lost_at timestamptz;
ALTER TABLE worker ADD COLUMN lock_grace double precision NOT NULL DEFAULT 0.25 CHECK (lock_grace >= 0);

-- Retry backoff: a requested execution is not claimed before this time.
ALTER TABLE execution ADD COLUMN not_before timestamptz;

-- The liveness lock: session-level, on the worker's dedicated connection, keyed by
-- (schema, worker id) so two installations in one database never collide.
CREATE FUNCTION worker_lock_class() RETURNS integer
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT hashtext(current_schema() || '.worker') & 2147483647
$$;

CREATE FUNCTION acquire_worker_lock(worker_id bigint) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_try_advisory_lock(worker_lock_class(), worker_id::integer)
$$;

CREATE FUNCTION worker_lock_held(worker_id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = worker_lock_class()::oid
          AND l.objid = worker_id::oid
    )
$$;
