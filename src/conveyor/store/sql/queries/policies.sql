-- name: list_policies
-- Every admission policy with what it holds and keeps waiting now (derived from the
-- admission tables, for display only).
SELECT p.target, p.scope, p.concurrency, p.parameters, p.method, p.source, p.created, p.updated,
       (SELECT count(*) FROM execution_admission_slot s WHERE s.policy = p.target)::int AS held,
       (SELECT count(*) FROM execution_admission_queue q WHERE q.policy = p.target)::int AS waiting
FROM admission_policy p
ORDER BY CASE p.scope WHEN 'action' THEN 0 WHEN 'pack' THEN 1 ELSE 2 END, p.target;

-- name: get_policy
SELECT p.target, p.scope, p.concurrency, p.parameters, p.method, p.source, p.created, p.updated,
       (SELECT count(*) FROM execution_admission_slot s WHERE s.policy = p.target)::int AS held,
       (SELECT count(*) FROM execution_admission_queue q WHERE q.policy = p.target)::int AS waiting
FROM admission_policy p
WHERE p.target = %(target)s;

-- name: set_policy
-- Create or replace an operator policy (it then wins over the action's metadata): the
-- SQL function of migration 0009.
SELECT target FROM set_admission_policy(%(target)s, %(concurrency)s, %(parameters)s, %(method)s);

-- name: delete_policy
-- The SQL function of migration 0009 (CVN03: none; CVC02: from the action's definition).
SELECT target, source, released, restored FROM delete_admission_policy(%(target)s);

-- name: admission_of
-- Where one execution stands in admission: holding a slot, or waiting (with how many
-- requests of its group are ahead of it).
SELECT 'holding' AS state, s.policy, s.group_key, s.seq, s.acquired AS since, 0 AS ahead
FROM execution_admission_slot s WHERE s.execution = %(id)s
UNION ALL
SELECT 'waiting', q.policy, q.group_key, q.seq, q.enqueued,
       (SELECT count(*) FROM execution_admission_queue o
        WHERE o.policy = q.policy AND o.group_key = q.group_key AND o.seq < q.seq)::int
FROM execution_admission_queue q WHERE q.execution = %(id)s;

-- name: admission_gauges
-- Slots held and executions waiting, per policy (zeros included).
SELECT p.target AS policy,
       (SELECT count(*) FROM execution_admission_slot s WHERE s.policy = p.target)::int AS held,
       (SELECT count(*) FROM execution_admission_queue q WHERE q.policy = p.target)::int AS waiting,
       coalesce((SELECT greatest(extract(epoch FROM now() - min(q.enqueued)), 0)
                 FROM execution_admission_queue q WHERE q.policy = p.target), 0)::float8 AS oldest_wait
FROM admission_policy p
ORDER BY p.target;

-- name: admission_repair
-- Promote every group with a free slot and someone waiting. Admission is kept by the
-- triggers; this only mends what they cannot see (a slot row deleted by hand, a
-- policy's limit raised while its trigger was disabled). Run by the executors' upkeep.
SELECT coalesce(sum(n), 0)::int AS admitted FROM (
    SELECT admission_lock(g.policy, g.group_key), admission_promote(g.policy, g.group_key) AS n
    FROM (
        SELECT DISTINCT q.policy, q.group_key FROM execution_admission_queue q
        JOIN admission_policy p ON p.target = q.policy
        WHERE (SELECT count(*) FROM execution_admission_slot s
               WHERE s.policy = q.policy AND s.group_key = q.group_key) < p.concurrency
        ORDER BY q.policy, q.group_key
    ) g
) promoted;

-- name: admission_cleanup
-- Forget groups idle for an hour (no slot, nobody waiting): one row per distinct value
-- of a grouping parameter would otherwise pile up. Safe against a concurrent request:
-- admission_lock bumps `touched` before any slot or queue row is added, and this DELETE
-- re-checks `touched` on the row version it waited for.
DELETE FROM execution_admission_group g
WHERE g.touched < now() - interval '1 hour'
  AND NOT EXISTS (SELECT 1 FROM execution_admission_slot s WHERE s.policy = g.policy AND s.group_key = g.group_key)
  AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.policy = g.policy AND q.group_key = g.group_key);
