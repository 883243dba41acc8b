-- name: workflow_try_lock
-- Advancement is serialized per workflow: this transaction-scoped advisory lock, then
-- the row lock (workflow_lock). A replica that finds it taken skips the workflow: the
-- holder applies every event it reads, and one that arrives after its read is found by
-- its next pass (a full pass runs again at once) or by any replica's poll. Returns the
-- ids locked (taken in id order: two replicas' batches never wait on each other).
SELECT x.id FROM (SELECT DISTINCT id FROM unnest(%(ids)s::bigint[]) AS u(id) ORDER BY id) x
WHERE pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.workflow.' || x.id, 0));

-- name: workflow_pending_try_lock
-- The workflows with events to apply and workflow_try_lock in one statement, the first of
-- the transaction that advances them (a pass costs no read before it): the workflows with
-- events to apply (not those whose execution has not started yet: a rerun's state is made
-- before its execution is claimed, its 'rerun' event waits for start_workflows), oldest
-- event first, each with whether its advisory lock was taken here (not
-- locked: another replica is advancing it -- see workflow_try_lock).
WITH pending AS (
    SELECT ev.workflow_execution AS id
    FROM workflow_event ev
    JOIN workflow_execution w ON w.id = ev.workflow_execution
    JOIN execution e ON e.id = w.execution
    WHERE e.status NOT IN ('requested', 'scheduling', 'scheduled')
    GROUP BY ev.workflow_execution
    ORDER BY min(ev.id)
    LIMIT %(limit)s
)
SELECT p.id, pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.workflow.' || p.id, 0)) AS locked
FROM (SELECT id FROM pending ORDER BY id) p;

-- name: workflow_lock
-- The workflows' state rows, locked until commit, with their executions' status and
-- parameters (the 'start' event's) and their definitions' versions. row_version is the
-- row's xmin, which any update changes: the executor's cache of a workflow's task and
-- dispatch rows is valid while it matches, as every change of those rows (advancement,
-- verbs) updates this row in the same transaction.
SELECT w.id, w.execution, w.workflow_ref, w.version, w.status, w.context, w.errors, w.cancel_policy,
       w.xmin::text AS row_version, e.status AS execution_status, e.parameters, e.cancelled_by
FROM workflow_execution w JOIN execution e ON e.id = w.execution
WHERE w.id = ANY(%(ids)s::bigint[])
ORDER BY w.id
FOR UPDATE OF w;

-- name: workflow_definition
-- One version of a definition (immutable: cached by the executor).
SELECT definition FROM workflow_definition WHERE ref = %(ref)s AND version = %(version)s;

-- name: workflow_existing_actions
-- Which of these action refs exist (children of unknown actions fail their workflow).
SELECT ref FROM action WHERE ref = ANY(%(refs)s::text[]);

-- name: workflow_events
-- The workflows' events in order; a child's end with its dispatch (matched on the
-- child being the dispatch's current execution: an earlier child of a retried chain
-- matches nothing) and the child's status and result.
SELECT ev.id, ev.workflow_execution, ev.kind, ev.execution, ev.payload,
       d.task_name, d.iteration, d.task_index, c.status AS child_status, c.result AS child_result
FROM workflow_event ev
LEFT JOIN workflow_task_dispatch d ON d.workflow_execution = ev.workflow_execution AND d.execution = ev.execution
LEFT JOIN execution c ON c.id = ev.execution
WHERE ev.workflow_execution = ANY(%(ids)s::bigint[])
ORDER BY ev.workflow_execution, ev.id;

-- name: workflow_tasks
-- The workflows' task instances.
SELECT workflow_execution, task_name, iteration, status, arrivals, items_total, result, error, items, concurrency
FROM workflow_task WHERE workflow_execution = ANY(%(ids)s::bigint[]);

-- name: workflow_dispatches
-- The workflows' dispatch rows.
SELECT workflow_execution, task_name, iteration, task_index, execution, retry, status, result
FROM workflow_task_dispatch WHERE workflow_execution = ANY(%(ids)s::bigint[]);

-- name: workflow_upsert_tasks
-- The decisions' task instances, by key (wids: each row's workflow).
INSERT INTO workflow_task AS t (workflow_execution, task_name, iteration, status, arrivals, items_total, items,
                                concurrency, result, error, ended)
SELECT u.wid, u.task_name, u.iteration, u.status, ARRAY(SELECT jsonb_array_elements_text(u.arrivals)),
       u.items_total, u.items, u.concurrency, u.result, u.error,
       CASE WHEN u.status IN ('succeeded', 'failed', 'cancelled') THEN now() END
FROM unnest(%(wids)s::bigint[], %(names)s::text[], %(iterations)s::int[], %(statuses)s::text[], %(arrivals)s::jsonb[],
            %(items_totals)s::int[], %(items)s::jsonb[], %(concurrencies)s::int[], %(results)s::jsonb[],
            %(errors)s::text[])
     AS u(wid, task_name, iteration, status, arrivals, items_total, items, concurrency, result, error)
ON CONFLICT (workflow_execution, task_name, iteration) DO UPDATE
SET status = EXCLUDED.status, arrivals = EXCLUDED.arrivals, items_total = EXCLUDED.items_total,
    items = EXCLUDED.items, concurrency = EXCLUDED.concurrency, result = EXCLUDED.result, error = EXCLUDED.error,
    updated = now(),
    ended = CASE WHEN EXCLUDED.status IN ('succeeded', 'failed', 'cancelled') THEN coalesce(t.ended, now()) END;

-- name: workflow_upsert_dispatches
-- The decisions' dispatch rows (ended children: status and result), by key. A dispatch
-- that ended has no deadline left.
INSERT INTO workflow_task_dispatch AS d (workflow_execution, task_name, iteration, task_index, execution, retry,
                                         status, result)
SELECT u.* FROM unnest(%(wids)s::bigint[], %(names)s::text[], %(iterations)s::int[], %(indexes)s::int[], %(executions)s::bigint[],
                               %(retries)s::int[], %(statuses)s::text[], %(results)s::jsonb[])
     AS u(wid, task_name, iteration, task_index, execution, retry, status, result)
ON CONFLICT (workflow_execution, task_name, coalesce(task_index, -1), iteration) DO UPDATE
SET execution = coalesce(EXCLUDED.execution, d.execution), retry = EXCLUDED.retry, status = EXCLUDED.status,
    result = EXCLUDED.result, updated = now(),
    deadline = CASE WHEN EXCLUDED.status = 'running' THEN d.deadline END;

-- name: workflow_claim_dispatches
-- The dispatch rows of the children to request: inserted, or taken over for the next
-- retry of the chain. A row that already has a child for this retry number (or a later
-- one) is left alone and not returned: that child exists, none is made twice.
INSERT INTO workflow_task_dispatch AS d (workflow_execution, task_name, iteration, task_index, retry, status,
                                         deadline)
SELECT u.wid, u.task_name, u.iteration, u.task_index, u.retry, 'running',
       CASE WHEN u.timeout IS NOT NULL THEN now() + make_interval(secs => u.delay + u.timeout) END
FROM unnest(%(wids)s::bigint[], %(names)s::text[], %(iterations)s::int[], %(indexes)s::int[], %(retries)s::int[],
            %(delays)s::float8[], %(timeouts)s::float8[])
     AS u(wid, task_name, iteration, task_index, retry, delay, timeout)
ON CONFLICT (workflow_execution, task_name, coalesce(task_index, -1), iteration) DO UPDATE
SET retry = EXCLUDED.retry, execution = NULL, status = 'running', result = NULL, deadline = EXCLUDED.deadline,
    updated = now()
WHERE d.retry < EXCLUDED.retry OR d.execution IS NULL
RETURNING d.id, d.workflow_execution, d.task_name, d.iteration, d.task_index;

-- name: workflow_request_children
-- The children themselves (parent: their workflow's execution; a delay is a timer row:
-- not_before), each made the current execution of its dispatch. Actions that do not
-- exist are skipped: the caller compares counts and fails the workflow naming them.
WITH c AS (
    SELECT u.*, nextval(pg_get_serial_sequence('execution', 'id')) AS child
    FROM unnest(%(dispatches)s::bigint[], %(parents)s::bigint[], %(refs)s::text[], %(parameters)s::jsonb[],
                %(delays)s::float8[])
         AS u(dispatch, parent, action_ref, parameters, delay)
    JOIN action a ON a.ref = u.action_ref
), requested AS (
    INSERT INTO execution (id, action_ref, parameters, parent, not_before)
    SELECT c.child, c.action_ref, c.parameters, c.parent,
           CASE WHEN c.delay > 0 THEN now() + make_interval(secs => c.delay) END
    FROM c ORDER BY c.child
    RETURNING id
)
UPDATE workflow_task_dispatch d SET execution = c.child, updated = now()
FROM c JOIN requested r ON r.id = c.child
WHERE d.id = c.dispatch
RETURNING d.id, d.execution;

-- name: workflow_cancel_children
-- The decision's cancels (cancel_running, a task's timeout, a failed with-items task):
-- through cancel_execution, like any cancel (a sub-workflow cancels its own children).
SELECT c.* FROM unnest(%(ids)s::bigint[], %(bys)s::text[]) AS x(id, by), LATERAL cancel_execution(x.id, x.by) c;

-- name: workflow_update
-- The workflows' state after the decisions (row_version: see workflow_lock).
UPDATE workflow_execution w
SET status = u.status, context = u.context, output = u.output, errors = u.errors, cancel_policy = u.cancel_policy,
    deadline = CASE WHEN u.status IN ('succeeded', 'failed', 'cancelled') THEN NULL ELSE w.deadline END
FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(contexts)s::jsonb[], %(outputs)s::jsonb[],
            %(errors)s::jsonb[], %(cancel_policies)s::text[]) AS u(id, status, context, output, errors, cancel_policy)
WHERE w.id = u.id
RETURNING w.id, w.xmin::text AS row_version;

-- name: workflow_resume_execution
-- A paused workflow that ends goes through running (paused -> completed is no edge of
-- the graph: a workflow ends from running or canceling).
UPDATE execution SET status = 'running' WHERE id = ANY(%(executions)s::bigint[]) AND status = 'paused';

-- name: workflow_end_execution
-- The workflows' executions end with them, guarded on the statuses they can end from
-- (canceling can only become cancelled).
UPDATE execution e
SET status = CASE WHEN e.status = 'canceling' THEN 'cancelled' ELSE u.status END,
    ended = now(), not_before = NULL, result = u.result
FROM unnest(%(executions)s::bigint[], %(statuses)s::text[], %(results)s::jsonb[]) AS u(id, status, result)
WHERE e.id = u.id AND e.status IN ('running', 'canceling')
RETURNING e.id, e.status;

-- name: workflow_consume_events
-- The events this advancement applied: gone with its commit, not before.
DELETE FROM workflow_event WHERE id = ANY(%(ids)s::bigint[]);

-- name: workflow_running_children
-- Children still running (for failing a workflow whose advancement broke).
SELECT execution FROM workflow_task_dispatch
WHERE workflow_execution = %(id)s AND status = 'running' AND execution IS NOT NULL;

-- name: workflow_timeouts
-- Task and workflow deadlines passed: 'timeout' events (each fires once).
SELECT workflow_timeouts() AS events;

-- name: workflow_charge_trees
-- The advancement's new task instances and children, charged to their trees
-- (charge_workflow_trees, migration 0033): over a workflow.max_tree_* bound it raises
-- CVB01 and the whole advancement rolls back.
SELECT charge_workflow_trees(%(wids)s::bigint[], %(tasks)s::int[], %(executions)s::int[], %(max_tasks)s,
                             %(max_executions)s);
