-- name: chart_finished_by_minute
-- The dashboard's throughput and failures charts: executions that finished in each minute
-- of the last hour (60 buckets, the current minute last; database clock), completed and
-- failed (failed, timeout, abandoned; cancelled ones are an operator's doing, not shown).
-- A finished row is not updated again, so `updated` bounds `ended` from below: the scan
-- is a range of the (status, updated) index per status, whatever the history's size.
WITH finished AS (
    SELECT date_trunc('minute', ended) AS minute, status
    FROM execution
    WHERE status IN ('completed', 'failed', 'timeout', 'abandoned')
      AND updated >= date_trunc('minute', now()) - interval '59 minutes'
      AND ended >= date_trunc('minute', now()) - interval '59 minutes'
)
SELECT m.minute, now() AS at,
       count(f.status) FILTER (WHERE f.status = 'completed')::int AS completed,
       count(f.status) FILTER (WHERE f.status <> 'completed')::int AS failed
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()),
                     interval '1 minute') AS m(minute)
LEFT JOIN finished f ON f.minute = m.minute
GROUP BY m.minute
ORDER BY m.minute;

-- name: chart_latency_by_minute
-- The dashboard's request-to-start latency chart: p50 and p95 of (first attempt's start
-- minus request), in seconds, of the executions whose first attempt started in each
-- minute of the last hour (as the overview's card, dashboard_rates). `updated` is at or
-- after that start, so the (status, updated) index bounds the scan by time. The attempt
-- is looked up by its primary key for each of those rows: a LATERAL with LIMIT is not
-- flattened into a join, which the planner may otherwise run as a hash join over every
-- attempt ever made (it did on a small table).
WITH starts AS (
    SELECT date_trunc('minute', t.started) AS minute,
           extract(epoch FROM t.started - e.created)::float8 AS latency
    FROM execution e
    CROSS JOIN LATERAL (
        SELECT a.started FROM execution_attempt a WHERE a.execution = e.id AND a.attempt = 1 LIMIT 1
    ) t
    WHERE e.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling',
                       'completed', 'failed', 'timeout', 'cancelled', 'abandoned')
      AND e.updated >= date_trunc('minute', now()) - interval '59 minutes'
      AND t.started >= date_trunc('minute', now()) - interval '59 minutes'
)
SELECT m.minute, count(s.latency)::int AS samples,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.latency)::float8 AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s.latency)::float8 AS p95
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()),
                     interval '1 minute') AS m(minute)
LEFT JOIN starts s ON s.minute = m.minute
GROUP BY m.minute
ORDER BY m.minute;

-- name: chart_queue_depth
-- The dashboard's queue depth chart: executions waiting, per action, now: requested (not
-- yet dispatched, delayed ones included) and scheduled (dispatched, not yet claimed by a
-- worker); the deepest %(limit)s actions. Only live rows are read (the status ranges of
-- the (status, updated) index), so the finished history costs nothing.
SELECT action_ref,
       count(*) FILTER (WHERE status = 'requested')::int AS requested,
       count(*) FILTER (WHERE status = 'scheduled')::int AS scheduled
FROM execution
WHERE status IN ('requested', 'scheduled')
GROUP BY action_ref
ORDER BY count(*) DESC, action_ref
LIMIT %(limit)s;
