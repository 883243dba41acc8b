-- What the CLI, the REST API, the SDK and the dashboard read and call for workflows
-- (definitions, a workflow execution's task tree) -- docs/workflows-usage.md.

-- name: workflow_known_actions
-- The refs a definition's tasks may name: every action, except workflows whose every
-- version was deleted (their action row stays while executions reference it).
SELECT a.ref FROM action a
WHERE a.runner_type <> 'workflow'
   OR EXISTS (SELECT 1 FROM workflow_definition d WHERE d.ref = a.ref AND d.deleted IS NULL);

-- name: register_workflow
-- The one verb of registration (migration 0013): a new version; CVC03 when the ref is
-- another runner type's action.
SELECT register_workflow(%(ref)s, %(definition)s, %(source)s, %(description)s, %(parameters_schema)s) AS version;

-- name: delete_workflow
-- Every version marked deleted; versions: how many (0: no such workflow).
SELECT delete_workflow(%(ref)s) AS versions;

-- name: list_workflows
-- Each workflow not deleted, its latest version, how many versions and tasks it has.
SELECT DISTINCT ON (d.ref) d.ref, d.version, d.description, d.created AS registered,
       jsonb_array_length(coalesce(d.definition -> 'tasks', '[]')) AS tasks,
       (SELECT count(*) FROM workflow_definition v WHERE v.ref = d.ref AND v.deleted IS NULL) AS versions
FROM workflow_definition d
WHERE d.deleted IS NULL
ORDER BY d.ref, d.version DESC;

-- name: get_workflow
-- One version of a workflow not deleted: the given one, or (version NULL) the latest.
SELECT d.ref, d.version, d.description, d.definition, d.source, d.created AS registered
FROM workflow_definition d
WHERE d.ref = %(ref)s AND d.deleted IS NULL AND (%(version)s::integer IS NULL OR d.version = %(version)s::integer)
ORDER BY d.version DESC
LIMIT 1;

-- name: workflow_versions
-- A workflow's versions not deleted, oldest first, with how many executions run each now.
SELECT d.version, d.created AS registered, d.description,
       (SELECT count(*) FROM workflow_execution w
        WHERE w.workflow_ref = d.ref AND w.version = d.version
          AND w.status IN ('running', 'paused', 'canceling')) AS running
FROM workflow_definition d
WHERE d.ref = %(ref)s AND d.deleted IS NULL
ORDER BY d.version;

-- name: workflow_of_execution
-- A workflow execution's state and the definition version it runs (even if deleted
-- since); no row for an execution that is not a started workflow.
SELECT w.id, w.execution, w.workflow_ref, w.version, w.status, w.output, w.errors, w.depth, w.cancel_policy,
       r.execution AS rerun_of, w.created, w.updated, d.definition
FROM workflow_execution w
JOIN workflow_definition d ON d.ref = w.workflow_ref AND d.version = w.version
LEFT JOIN workflow_execution r ON r.id = w.rerun_of
WHERE w.execution = %(id)s;

-- name: workflow_tree
-- A workflow execution's task instances (oldest first), each with its child chains --
-- at most %(items)s of them, by item index; children_total and counts (by dispatch
-- status) cover them all -- and each child's status, attempt and a summary of its result
-- (its error, else its returned data, else the result; 120 characters). A running task
-- whose running children all wait for an answer (core.ask) shows as pending.
SELECT t.task_name AS task, t.iteration,
       CASE WHEN t.status = 'running' AND EXISTS (
                SELECT 1 FROM workflow_task_dispatch d JOIN execution e ON e.id = d.execution
                WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                  AND d.iteration = t.iteration AND d.status = 'running' AND e.status = 'pending')
            AND NOT EXISTS (
                SELECT 1 FROM workflow_task_dispatch d JOIN execution e ON e.id = d.execution
                WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                  AND d.iteration = t.iteration AND d.status = 'running' AND e.status <> 'pending')
            THEN 'pending' ELSE t.status END AS status,
       t.items_total, t.error, t.created, t.ended,
       coalesce((
           SELECT jsonb_agg(to_jsonb(c) ORDER BY c."index" NULLS FIRST)
           FROM (
               SELECT d.task_index AS "index", d.status, d.retry, d.execution, e.status AS execution_status,
                      e.attempt, e.action_ref,
                      left(CASE WHEN e.id IS NULL THEN d.result::text
                                WHEN e.result ->> 'error' IS NOT NULL THEN e.result ->> 'error'
                                WHEN jsonb_typeof(e.result) = 'object' AND e.result ? 'data'
                                    THEN (e.result -> 'data')::text
                                ELSE e.result::text END, 120) AS result
               FROM workflow_task_dispatch d LEFT JOIN execution e ON e.id = d.execution
               WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                 AND d.iteration = t.iteration
               ORDER BY d.task_index NULLS FIRST
               LIMIT %(items)s
           ) c
       ), '[]') AS children,
       (SELECT count(*) FROM workflow_task_dispatch d
        WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
          AND d.iteration = t.iteration) AS children_total,
       coalesce((
           SELECT jsonb_object_agg(s.status, s.n) FROM (
               SELECT d.status, count(*) AS n FROM workflow_task_dispatch d
               WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                 AND d.iteration = t.iteration
               GROUP BY d.status
           ) s
       ), '{}') AS counts
FROM workflow_task t
WHERE t.workflow_execution = (SELECT w.id FROM workflow_execution w WHERE w.execution = %(id)s)
ORDER BY t.created, t.iteration, t.task_name;

-- name: workflow_task_states
-- Each task's latest instance (the dashboard's graph colours): status, iteration, for a
-- `with` task how many items ended, and the child execution of a task without items. A
-- running task whose running children all wait for an answer (core.ask) shows as pending.
SELECT DISTINCT ON (t.task_name) t.task_name AS task, t.iteration,
       CASE WHEN t.status = 'running' AND EXISTS (
                SELECT 1 FROM workflow_task_dispatch d JOIN execution e ON e.id = d.execution
                WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                  AND d.iteration = t.iteration AND d.status = 'running' AND e.status = 'pending')
            AND NOT EXISTS (
                SELECT 1 FROM workflow_task_dispatch d JOIN execution e ON e.id = d.execution
                WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
                  AND d.iteration = t.iteration AND d.status = 'running' AND e.status <> 'pending')
            THEN 'pending' ELSE t.status END AS status,
       t.items_total,
       (SELECT count(*) FROM workflow_task_dispatch d
        WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
          AND d.iteration = t.iteration AND d.status <> 'running') AS items_done,
       (SELECT d.execution FROM workflow_task_dispatch d
        WHERE d.workflow_execution = t.workflow_execution AND d.task_name = t.task_name
          AND d.iteration = t.iteration AND d.task_index IS NULL) AS child
FROM workflow_task t
WHERE t.workflow_execution = (SELECT w.id FROM workflow_execution w WHERE w.execution = %(id)s)
ORDER BY t.task_name, t.iteration DESC;

-- name: execution_children
-- The executions a workflow execution requested (execution.parent), oldest first, as
-- api_list_executions' summaries; keyset pagination on id.
SELECT e.id, e.action_ref, e.status, e.worker, w.name AS worker_name,
       e.executor, e.parent, e.enforcement, e.attempt, e.created, e.updated, e.scheduled,
       e.started, e.ended,
       left(e.parameters::text, 201) AS parameters_head, pg_column_size(e.parameters) AS parameters_size,
       CASE WHEN jsonb_typeof(e.result) = 'object' THEN e.result - '{stdout,stderr,data}'::text[] END
           AS result_summary,
       pg_column_size(e.result) AS result_size
FROM execution e LEFT JOIN worker w ON w.id = e.worker
WHERE e.parent = %(id)s AND (%(after)s::bigint IS NULL OR e.id > %(after)s)
ORDER BY e.id
LIMIT %(limit)s;

-- name: pause_execution
-- The verb (migration 0013): no row, no such execution; now NULL, not a running workflow.
SELECT id, was, now FROM pause_execution(%(id)s, %(by)s);

-- name: resume_execution
-- The verb (migration 0013): no row, no such execution; now NULL, not a paused workflow.
SELECT id, was, now FROM resume_execution(%(id)s, %(by)s);

-- name: rerun_execution
-- The verb (migration 0013): the new execution's id; CVN04 not a workflow execution,
-- CVC04 not ended badly.
SELECT rerun_execution(%(id)s, %(from_failed)s, %(by)s) AS id;

-- name: cancel_workflow
-- cancel_execution with a policy for a started workflow (allow_finish, cancel_running);
-- same answer as cancel_execution.
SELECT id, was, now, worker FROM cancel_workflow(%(id)s, %(by)s, %(policy)s);
