-- name: pick_executor_run
-- The requested executions the executor runs itself -- workflows (runner type workflow)
-- and core.ask (inquiry) -- locked for this claim (claim_executor_run then claims them),
-- whatever the workers' free capacity, oldest first, skipping rows another replica holds
-- and those an admission policy's queue holds back. Runs every round, so it must cost next
-- to nothing when none are requested, however long the backlog of worker-run executions:
-- a SELECT (no UPDATE: the execution statement triggers fire only when there is something
-- to claim), one probe of execution_requested_action_idx per such action, planned as
-- claim_requested's (requested_candidates, migration 0026: planned from the statistics it
-- walked the whole backlog in id order, 5 ms a round behind 20,000 core.noop).
SELECT e.id FROM execution e
WHERE e.id = ANY((SELECT requested_candidates(ARRAY(
          SELECT a.ref FROM action a WHERE a.runner_type IN ('workflow', 'inquiry')
      ), %(limit)s))::bigint[])
  AND e.status || '' = 'requested'
  AND (e.not_before IS NULL OR e.not_before <= now())
  AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
ORDER BY e.id
FOR UPDATE OF e SKIP LOCKED;

-- name: claim_executor_run
-- The executions pick_executor_run locked, claimed for this executor (requested ->
-- scheduling). Same columns as claim_requested.
UPDATE execution e
SET status = 'scheduling', executor = %(executor)s
FROM action a
WHERE e.id = ANY(%(ids)s::bigint[]) AND e.status = 'requested' AND a.ref = e.action_ref
RETURNING e.id, e.action_ref, e.parameters, a.runner_type, a.runtime,
          a.parameters_schema, a.updated AS action_updated,
          extract(epoch FROM now() - e.created)::float8 AS age,
          '{}'::bigint[] AS avoid;

-- name: ask_inquiries
-- The claimed core.ask executions -> pending, each with its inquiry (create-or-get;
-- migration 0014's ask_inquiries).
SELECT execution, inquiry, created FROM ask_inquiries(%(ids)s::bigint[], %(executor)s);

-- name: respond_inquiry
-- One answer (checked against the schema by the caller): what happened (migration 0014).
SELECT outcome, inquiry, execution, status, responders
FROM respond_inquiry(%(id)s, %(responder)s, %(role)s, %(data)s);

-- name: expire_inquiries
-- Inquiries past their deadline: timeout, or answered with their default (migration 0014).
SELECT inquiry, execution, outcome FROM expire_inquiries();

-- name: list_inquiries
-- Newest first, keyset paging on id; optional status filter. ``responders``: who answered
-- so far (the audit's names).
SELECT i.id, i.execution, i.status, i.prompt, i.schema, i.assignees, i.quorum, i.forbid_requester,
       i.requester, i.ttl, i.deadline, i.on_timeout, i.response, i.responded, i.created, i.updated,
       e.parent,
       ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = i.id ORDER BY r.id) AS responders
FROM inquiry i JOIN execution e ON e.id = i.execution
WHERE (%(status)s::text IS NULL OR i.status = %(status)s)
  AND (%(before)s::bigint IS NULL OR i.id < %(before)s)
ORDER BY i.id DESC
LIMIT %(limit)s;

-- name: get_inquiry
-- One inquiry with its asking execution's status and parent.
SELECT i.id, i.execution, i.status, i.prompt, i.schema, i.assignees, i.quorum, i.forbid_requester,
       i.requester, i.ttl, i.deadline, i.on_timeout, i.response, i.responded, i.created, i.updated,
       e.parent, e.status AS execution_status,
       ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = i.id ORDER BY r.id) AS responders
FROM inquiry i JOIN execution e ON e.id = i.execution
WHERE i.id = %(id)s;

-- name: inquiry_of_execution
-- The inquiry an execution (core.ask) asked, if any: its id and status.
SELECT id, status FROM inquiry WHERE execution = %(id)s;

-- name: inquiry_responses
-- The audit of one inquiry: every answer, oldest first.
SELECT responder, role, data, created FROM inquiry_response WHERE inquiry = %(id)s ORDER BY id;

-- name: inquiry_schema
-- The schema an answer to this inquiry must satisfy (no row: no such inquiry).
SELECT schema FROM inquiry WHERE id = %(id)s;

-- name: set_requested_by
-- Who requests the executions of this transaction (execution.requested_by's default).
SELECT set_config('conveyor.requested_by', %(by)s, true);
