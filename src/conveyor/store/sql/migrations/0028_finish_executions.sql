-- finish_executions(worker, ids, attempts, statuses, outcomes, delays, results, errors): the
-- worker's result write (issue #14), moved from the `finish` query into a function so that
-- its plan is the one wanted whatever the statistics say.
--
-- running -> completed|failed|timeout, or back to requested when the retry policy asks
-- (after a backoff); fenced by (execution, worker, attempt): a write from an attempt that is
-- no longer current changes nothing and is left out of the ids returned. An execution whose
-- cancellation was asked (canceling) ends cancelled, whatever the run's outcome: the result
-- is kept, the user's request stands.
--
-- Why a function with planner settings. The statistics never describe running rows: they
-- were taken when there were none, or when all had ended. Planned from them, the query (a
-- join of the results with the worker's live rows through execution_on_worker_idx, then an
-- UPDATE ... FROM) believed one row on each side and nested a scan of the worker's running
-- rows, or of the whole table, inside a loop over the results: 75 ms for a batch of 500 on a
-- table of 10,000 rows, growing with the square of the batch, where one primary-key probe per
-- result costs 12 ms (docs/performance.md, "The worker's result write"). Here the only plan
-- is that one: each result probes and locks its row by key (`status || ''` keeps the partial
-- index out of reach; the row is still checked as it is locked), and the update and the
-- attempt's record reach their rows by key too. The hash, merge, bitmap, sort and sequential
-- alternatives are priced out of this function's statements only; jit is off so that those
-- prices cannot make a 10 ms statement compile.
CREATE FUNCTION finish_executions(p_worker bigint, p_ids bigint[], p_attempts integer[], p_statuses text[],
                                  p_outcomes text[], p_delays float8[], p_results jsonb[], p_errors text[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(p_ids, p_attempts, p_statuses, p_outcomes, p_delays, p_results, p_errors)
            AS d(id, attempt, status, outcome, delay, result, error)
    ), finishing AS (
        SELECT done.*, x.cancel
        FROM done CROSS JOIN LATERAL (
            SELECT e.status = 'canceling' AS cancel FROM execution e
            WHERE e.id = done.id AND e.worker = p_worker AND e.attempt = done.attempt
              AND e.status || '' IN ('running', 'canceling')
            OFFSET 0  -- a probe per result, never flattened into a join
            FOR UPDATE
        ) x
    ), decided AS (
        SELECT f.id, f.attempt, f.result,
               CASE WHEN f.cancel THEN 'cancelled' ELSE f.status END AS status,
               CASE WHEN f.cancel THEN 'cancelled' ELSE f.outcome END AS outcome,
               CASE WHEN f.cancel THEN NULL ELSE f.delay END AS delay,
               CASE WHEN f.cancel THEN coalesce(f.error, 'cancelled') ELSE f.error END AS error
        FROM finishing f
    ), finished AS (
        UPDATE execution e
        SET status = d.status, result = d.result,
            ended = CASE WHEN d.status = 'requested' THEN NULL ELSE now() END,
            worker = CASE WHEN d.status = 'requested' THEN NULL ELSE e.worker END,
            executor = CASE WHEN d.status = 'requested' THEN NULL ELSE e.executor END,
            started = CASE WHEN d.status = 'requested' THEN NULL ELSE e.started END,
            not_before = CASE WHEN d.delay IS NULL THEN NULL ELSE now() + make_interval(secs => d.delay) END
        FROM decided d
        -- Only the key: each row was checked and locked in `finishing`, in this statement,
        -- and nothing else can change it before this transaction ends.
        WHERE e.id = d.id
        RETURNING e.id, e.attempt, d.outcome, d.error
    ), recorded AS (
        UPDATE execution_attempt t
        SET ended = now(), outcome = f.outcome, error = f.error
        FROM finished f WHERE t.execution = f.id AND t.attempt = f.attempt
    )
    SELECT f.id FROM finished f;
END
$$;
