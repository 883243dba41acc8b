-- name: execution_gauges
-- Executions not finished yet, by status and action, for every known action and every
-- non-terminal status (zeros included, so a series falls to 0 instead of vanishing).
-- Terminal statuses are left out: their counts only grow and would scan the whole table.
WITH counts AS (
    SELECT status, action_ref, count(*)::int AS n
    FROM execution
    WHERE status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling')
    GROUP BY status, action_ref
)
SELECT s.status, a.ref AS action, coalesce(c.n, 0) AS count
FROM action a
CROSS JOIN unnest(ARRAY['requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'canceling']) AS s(status)
LEFT JOIN counts c ON c.status = s.status AND c.action_ref = a.ref
ORDER BY a.ref, s.status;

-- name: worker_gauges
-- Action workers by status, plus stale: active but with a heartbeat older than the
-- worker's own stale_after (database clock) -- dead, not yet swept.
SELECT count(*) FILTER (WHERE status = 'active')::int AS active,
       count(*) FILTER (WHERE status = 'draining')::int AS draining,
       count(*) FILTER (WHERE status = 'inactive')::int AS inactive,
       count(*) FILTER (WHERE status = 'active' AND (last_heartbeat IS NULL
                        OR last_heartbeat < now() - make_interval(secs => stale_after)))::int AS stale
FROM worker
WHERE worker_role = 'action';

-- name: worker_heartbeat_ages
-- Seconds since the last heartbeat of every action worker not marked inactive.
SELECT name, greatest(extract(epoch FROM now() - last_heartbeat), 0)::float8 AS age
FROM worker
WHERE worker_role = 'action' AND status IN ('active', 'draining') AND last_heartbeat IS NOT NULL
ORDER BY name;

-- name: backlog_ages
-- Age in seconds (0 when there is none) of the oldest execution dispatched but not
-- started (since it was scheduled), and of the oldest one waiting to be placed (since
-- it was requested or its backoff ended; those still waiting out a backoff or waiting
-- for admission are left out: conveyor_admission_oldest_wait_seconds covers the latter).
-- As for the schedule-to-start monitor (overdue_scheduled), not one waiting in the prefetch
-- of a worker whose every slot runs an execution: that worker is taking work.
SELECT coalesce((SELECT greatest(extract(epoch FROM now() - min(e.scheduled)), 0)::float8
                 FROM execution e
                 WHERE e.status = 'scheduled' AND NOT worker_slots_full(e.worker)), 0) AS scheduled_oldest,
       coalesce((SELECT greatest(extract(epoch FROM now() - min(greatest(e.created, e.not_before))), 0)::float8
                 FROM execution e
                 WHERE e.status = 'requested' AND (e.not_before IS NULL OR e.not_before <= now())
                   AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)),
                0) AS requested_oldest;

-- name: automation_gauges
-- Events waiting for their rules (event_pending) and the age of the oldest; schedules
-- paused and active; schedules overdue: active with a next_fire more than 1 s past (the
-- executors fire a slot when it is due: a growing count means none is firing them).
-- Database clock; 0 when none.
SELECT (SELECT count(*) FROM event_pending)::int AS events_pending,
       coalesce((SELECT greatest(extract(epoch FROM now() - min(since)), 0)::float8 FROM event_pending), 0)
           AS events_pending_oldest,
       (SELECT count(*) FROM schedule WHERE paused)::int AS schedules_paused,
       (SELECT count(*) FROM schedule WHERE NOT paused)::int AS schedules_active,
       (SELECT count(*) FROM schedule
        WHERE NOT paused AND next_fire IS NOT NULL AND next_fire < now() - interval '1 second')::int
           AS schedules_overdue;
