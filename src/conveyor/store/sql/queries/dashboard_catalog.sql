-- The dashboard's /policies and /actions pages (issue #15). Read only; every query is
-- bounded: the admission tables hold what runs or waits now (not the history), and the
-- execution table is read through ranges of its (action_ref, created) index.

-- name: dash_policy_slots
-- The executions holding a slot now, per policy and group, in the order they got it.
-- Bounded by %(limit)s: concurrency x groups may be large with a per-parameter grouping.
SELECT s.policy, s.group_key, s.execution, s.acquired, e.action_ref, e.status
FROM execution_admission_slot s
JOIN execution e ON e.id = s.execution
ORDER BY s.policy, s.group_key, s.seq
LIMIT %(limit)s;

-- name: dash_policy_queue
-- The queue order: per group (at most %(groups)s groups), its first %(per_group)s waiting
-- executions with their 1-based position (1: admitted next) and ``waiting``, the
-- group's whole count (the page says how many more there are). The first rows of a
-- group are a range of the (policy, group_key, seq) unique index.
SELECT g.policy, g.group_key, g.waiting, w.execution, w.position, w.enqueued, e.action_ref
FROM (
    SELECT q.policy, q.group_key, count(*)::int AS waiting
    FROM execution_admission_queue q
    GROUP BY q.policy, q.group_key
    ORDER BY q.policy, q.group_key
    LIMIT %(groups)s
) g
CROSS JOIN LATERAL (
    SELECT q.execution, q.enqueued, (row_number() OVER (ORDER BY q.seq))::int AS position
    FROM execution_admission_queue q
    WHERE q.policy = g.policy AND q.group_key = g.group_key
    ORDER BY q.seq
    LIMIT %(per_group)s
) w
JOIN execution e ON e.id = w.execution
ORDER BY g.policy, g.group_key, w.position;

-- name: dash_action_counts
-- Executions of each action requested in the last hour (database clock), by status: one
-- range of the (action_ref, created) index per action, never the older history.
SELECT a.ref, e.status, count(*)::int AS n
FROM action a
JOIN LATERAL (
    SELECT x.status FROM execution x
    WHERE x.action_ref = a.ref AND x.created > now() - interval '1 hour'
) e ON true
GROUP BY a.ref, e.status
ORDER BY a.ref, e.status;

-- name: dash_action_hour
-- One action's executions requested in the last hour, by status.
SELECT e.status, count(*)::int AS n
FROM execution e
WHERE e.action_ref = %(ref)s AND e.created > now() - interval '1 hour'
GROUP BY e.status
ORDER BY e.status;

-- name: dash_action_recent
-- One action's newest %(limit)s executions (a backward range of the (action_ref, created)
-- index): status, duration, and the head of the error.
SELECT e.id, e.status, e.created, e.started, e.ended,
       left(e.result ->> 'error', 200) AS error
FROM execution e
WHERE e.action_ref = %(ref)s
ORDER BY e.created DESC
LIMIT %(limit)s;
