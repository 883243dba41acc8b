-- worker_slots_full(worker): every slot of the worker runs an execution (running or
-- canceling, against its capacity). With worker.prefetch (issue #14) executions wait
-- `scheduled` on a worker beyond its slots; one waiting behind a full worker has been
-- taken by a worker that is taking work (it claims it in the very transaction that frees
-- a slot), so the dispatch expiry, the schedule-to-start monitor and the oldest-scheduled
-- gauge leave it alone. One definition for the three of them. False for no worker.
CREATE FUNCTION worker_slots_full(worker_id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce((SELECT count(*) FROM execution r
                     WHERE r.worker = worker_id AND r.status IN ('running', 'canceling'))
                    >= (SELECT w.capacity FROM worker w WHERE w.id = worker_id), false)
$$;
