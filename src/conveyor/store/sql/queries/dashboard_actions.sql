-- name: dash_admission_waiting
-- The executions of a list page that wait in admission (issue #15): the policy and group
-- holding each, the policy's limit, and how many of its group are ahead of it (a range of
-- the queue's (policy, group_key, seq) key). One query per page, for the ids shown.
SELECT q.execution, q.policy, q.group_key, q.enqueued, p.concurrency,
       (SELECT count(*) FROM execution_admission_queue o
        WHERE o.policy = q.policy AND o.group_key = q.group_key AND o.seq < q.seq)::int AS ahead
FROM execution_admission_queue q LEFT JOIN admission_policy p ON p.target = q.policy
WHERE q.execution = ANY(%(ids)s::bigint[]);
