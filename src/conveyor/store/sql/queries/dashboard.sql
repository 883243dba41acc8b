-- name: dashboard_rates
-- The dashboard's overview figures, on the database clock: executions finished in the
-- last minute (completed, and any terminal status), and the scheduling latency (first
-- attempt's start minus request) of executions whose first attempt started in the last
-- 5 minutes. A finished row is not updated again, so `updated` bounds `ended` and
-- `started` from below: the (status, updated) index keeps both scans small.
WITH finished AS (
    SELECT status FROM execution
    WHERE status = ANY(terminal_statuses())
      AND updated >= now() - interval '1 minute' AND ended >= now() - interval '1 minute'
), first_starts AS (
    SELECT extract(epoch FROM t.started - e.created)::float8 AS latency
    FROM execution e JOIN execution_attempt t ON t.execution = e.id AND t.attempt = 1
    WHERE e.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling',
                       'completed', 'failed', 'timeout', 'cancelled', 'abandoned')
      AND e.updated >= now() - interval '5 minutes' AND t.started >= now() - interval '5 minutes'
)
SELECT (SELECT count(*) FILTER (WHERE status = 'completed') FROM finished)::int AS completed_last_minute,
       (SELECT count(*) FROM finished)::int AS finished_last_minute,
       (SELECT count(*) FROM first_starts)::int AS latency_samples,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY latency) FROM first_starts)::float8 AS latency_p50,
       (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY latency) FROM first_starts)::float8 AS latency_p95;
