-- requested_candidates(refs, lim): the oldest `lim` requested executions of the actions
-- `refs` that may be claimed now (not delayed, not held by an admission queue), oldest
-- first, read and not locked. The executor's two claims lock what it returns
-- (claim_requested, pick_executor_run; issue #14).
--
-- Why a function with planner settings. Both claims run every scheduling round, so each
-- must cost the few rows it takes, whatever the backlog. The statistics say nothing useful
-- about `requested` rows: they are a few at the last ANALYZE and thousands a moment later
-- (a burst of requests, autovacuum not yet around), or a handful among ten million finished
-- rows (a burst never reaches autovacuum's threshold there). Planned from those statistics,
-- the same query walked, hashed or sorted the whole backlog every round in one case or the
-- other (3.6 ms a round behind 3,000 requests on a fresh table; 9 s a round behind 20,000 on
-- a 10M-row history, nested loops planned for one row). Here the only plan without a sort is
-- the one wanted: for each action, the oldest `lim` through execution_requested_action_idx
-- in index order (the range in place of `action_ref = r.ref` keeps the index's order
-- usable), then the oldest `lim` of those. Disabling sorts and the hash, merge and bitmap
-- alternatives only prices them out of this function's statement; jit is off because those
-- prices would otherwise cross jit_above_cost and compile a 50 µs query.
CREATE FUNCTION requested_candidates(refs text[], lim integer) RETURNS bigint[]
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN ARRAY(
        SELECT c.id FROM unnest(refs) AS r(ref) CROSS JOIN LATERAL (
            SELECT e.id FROM execution e
            WHERE e.status = 'requested' AND e.action_ref >= r.ref AND e.action_ref <= r.ref
              AND (e.not_before IS NULL OR e.not_before <= now())
              AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
            ORDER BY e.action_ref, e.id
            LIMIT lim
        ) c
        ORDER BY c.id
        LIMIT lim);
END
$$;
