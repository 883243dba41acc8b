-- Which lifetime of the server a worker's liveness lock was taken in (issue #11, defect 2).
-- A missing lock means a dead worker only if the server has kept its locks since the lock
-- was taken. worker.lock_epoch used to be pg_postmaster_start_time(), which a restart
-- renews but a crash-restart does not: when one backend crashes, the postmaster kills
-- every session, reinitialises shared memory (every advisory lock is gone) and recovers,
-- under the same start time -- and the executors then took every worker for dead.
--
-- The epoch now lives in an UNLOGGED table: crash recovery empties it (a crash of a
-- backend, an immediate shutdown, a power cut), a clean restart keeps it but renews
-- pg_postmaster_start_time(), which it is stored with. The first worker to register in a
-- new lifetime stamps a new epoch (clock_timestamp()); the others read it. A lock taken
-- under another epoch -- or while none is stamped yet -- is not judged at all: the
-- heartbeat threshold decides, as after any restart.
CREATE UNLOGGED TABLE server_epoch (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    postmaster_start timestamptz NOT NULL,
    epoch timestamptz NOT NULL
);
-- The lifetime running now is the one the workers registered so far took their locks in
-- (their lock_epoch is pg_postmaster_start_time()): their locks keep counting.
INSERT INTO server_epoch (postmaster_start, epoch) VALUES (pg_postmaster_start_time(), pg_postmaster_start_time());

-- The current epoch; NULL when none is stamped in this lifetime of the server yet.
CREATE FUNCTION current_server_epoch() RETURNS timestamptz
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT epoch FROM server_epoch WHERE postmaster_start = pg_postmaster_start_time()
$$;

-- The current epoch, stamped first if there is none (a registering worker calls it).
-- Concurrent first registrations agree: one inserts, the others wait on its row and read it.
CREATE FUNCTION stamp_server_epoch() RETURNS timestamptz
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    found_epoch timestamptz := current_server_epoch();
BEGIN
    IF found_epoch IS NULL THEN
        INSERT INTO server_epoch (postmaster_start, epoch) VALUES (pg_postmaster_start_time(), clock_timestamp())
        ON CONFLICT (singleton) DO UPDATE SET postmaster_start = EXCLUDED.postmaster_start, epoch = EXCLUDED.epoch
            WHERE server_epoch.postmaster_start IS DISTINCT FROM EXCLUDED.postmaster_start;
        found_epoch := current_server_epoch();
    END IF;
    RETURN found_epoch;
END
$$;
