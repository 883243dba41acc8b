-- name: dash_worker_runs
-- The Workers page (issue #15): what each worker runs now -- its scheduled, running and
-- canceling executions, the first %(limit)s of each by id (the partial index
-- execution_on_worker_idx serves each worker's LIMIT; the whole count is list_workers'
-- load). Age: since it started, else since it was dispatched (database clock).
SELECT w.id AS worker, r.id, r.action_ref, r.status, r.attempt, r.started,
       extract(epoch FROM now() - coalesce(r.started, r.scheduled))::float8 AS age
FROM worker w
CROSS JOIN LATERAL (
    SELECT e.id, e.action_ref, e.status, e.attempt, e.started, e.scheduled
    FROM execution e
    WHERE e.worker = w.id AND e.status = ANY(on_worker_statuses())
    ORDER BY e.id
    LIMIT %(limit)s
) r
ORDER BY w.id, r.id;

-- name: dash_worker_offers
-- What each worker offers: the Python action refs it registered (its runtimes are in
-- list_workers).
SELECT id, actions FROM worker;
