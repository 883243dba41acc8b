-- Workflows: definitions (versioned), the state of each workflow execution in tables an
-- operator can query, and the events that advance it.
--
-- The exactly-once argument (docs/architecture.md, "Workflow advancement"):
--   * A child's terminal transition inserts its workflow_event in the same transaction
--     (a row trigger on execution): the event exists iff the child's end committed.
--   * The executor advances one workflow in ONE transaction that holds its advisory lock
--     and its workflow_execution row (FOR UPDATE), reads the events, applies the
--     conductor's decision and deletes the events it consumed: the reaction commits with
--     the deletion or not at all, so an event is applied once, and a crash before commit
--     leaves it for the next replica (woken by the poll).
--   * Children are deduplicated by workflow_task_dispatch's unique key (task, item index,
--     iteration) and its retry number: a second decision for the same child chain and
--     retry finds the row and creates nothing.

-- == Definitions ======================================================================

-- A registration is a new version: a running workflow keeps the version it started with
-- (workflow_execution.version), so a definition row is never changed, only marked deleted.
CREATE TABLE workflow_definition (
    ref         text NOT NULL REFERENCES action (ref) ON DELETE CASCADE,
    version     integer NOT NULL CHECK (version > 0),
    definition  jsonb NOT NULL,          -- WorkflowSpec.to_json()
    source      text NOT NULL DEFAULT '', -- as written (YAML), for `workflows show`
    description text NOT NULL DEFAULT '',
    created     timestamptz NOT NULL DEFAULT now(),
    deleted     timestamptz,
    PRIMARY KEY (ref, version)
);

-- Register (or re-register) a workflow: its action row (runner type 'workflow', run by
-- the executor: runtime 'conveyor') and a new definition version, which new executions
-- start on. Returns the version. Refused (CVC03) when the ref names an action of another
-- runner type: a workflow must not silently replace a worker's action.
CREATE FUNCTION register_workflow(p_ref text, p_definition jsonb, p_source text DEFAULT '',
                                  p_description text DEFAULT '',
                                  p_parameters_schema jsonb DEFAULT '{"type": "object"}') RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    other text;
    v integer;
BEGIN
    SELECT a.runner_type INTO other FROM action a WHERE a.ref = p_ref FOR UPDATE;
    IF FOUND AND other <> 'workflow' THEN
        RAISE EXCEPTION 'action % exists with runner type %: a workflow cannot replace it', p_ref, other
            USING ERRCODE = 'CVC03';
    END IF;
    -- The upsert locks the action row: concurrent registrations of one ref take turns,
    -- and the next statement (a new snapshot) sees the version the previous one added.
    INSERT INTO action AS a (ref, pack, name, description, runner_type, runtime, parameters_schema)
    VALUES (p_ref, split_part(p_ref, '.', 1), substr(p_ref, length(split_part(p_ref, '.', 1)) + 2),
            coalesce(p_description, ''), 'workflow', 'conveyor', coalesce(p_parameters_schema, '{"type": "object"}'))
    ON CONFLICT (ref) DO UPDATE
    SET description = EXCLUDED.description, parameters_schema = EXCLUDED.parameters_schema,
        runner_type = 'workflow', runtime = 'conveyor';
    SELECT coalesce(max(d.version), 0) + 1 INTO v FROM workflow_definition d WHERE d.ref = p_ref;
    INSERT INTO workflow_definition (ref, version, definition, source, description)
    VALUES (p_ref, v, p_definition, coalesce(p_source, ''), coalesce(p_description, ''));
    RETURN v;
END
$$;

-- Delete a workflow: every version is marked deleted (running executions keep theirs and
-- finish). Its action row goes too when no execution references it; otherwise (history
-- keeps the foreign key) it stays, and new requests of it are failed at start with
-- "workflow X was deleted" (start_workflows). Registering it again revives it.
-- Returns the number of versions marked; 0: no such workflow (or deleted already).
CREATE FUNCTION delete_workflow(p_ref text) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    n integer;
BEGIN
    UPDATE workflow_definition d SET deleted = now() WHERE d.ref = p_ref AND d.deleted IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 AND NOT EXISTS (SELECT 1 FROM execution e WHERE e.action_ref = p_ref) THEN
        DELETE FROM action a WHERE a.ref = p_ref AND a.runner_type = 'workflow';
    END IF;
    RETURN n;
END
$$;

-- == State ============================================================================

-- One row per workflow execution: created-or-got when its execution starts (the unique
-- constraint is the seeds' phase 3 invariant: starting twice cannot create two states).
-- status is the conductor's view; the execution's own status follows it (running,
-- paused, canceling, then completed / failed / cancelled).
CREATE TABLE workflow_execution (
    id            bigserial PRIMARY KEY,
    execution     bigint NOT NULL REFERENCES execution (id) ON DELETE CASCADE,
    workflow_ref  text NOT NULL,
    version       integer NOT NULL,
    status        text NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'paused', 'canceling', 'succeeded', 'failed', 'cancelled')),
    context       jsonb NOT NULL DEFAULT '{}',
    output        jsonb,
    errors        jsonb NOT NULL DEFAULT '[]',
    depth         integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
    cancel_policy text NOT NULL DEFAULT 'allow_finish' CHECK (cancel_policy IN ('allow_finish', 'cancel_running')),
    -- The workflow's own timeout (definition "timeout"): a 'timeout' event when it passes.
    deadline      timestamptz,
    rerun_of      bigint REFERENCES workflow_execution (id) ON DELETE SET NULL,
    created       timestamptz NOT NULL DEFAULT now(),
    updated       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uq_workflow_execution_execution UNIQUE (execution),
    FOREIGN KEY (workflow_ref, version) REFERENCES workflow_definition (ref, version)
);
CREATE INDEX workflow_execution_deadline_idx ON workflow_execution (deadline) WHERE deadline IS NOT NULL;
CREATE TRIGGER workflow_execution_touch BEFORE UPDATE ON workflow_execution
    FOR EACH ROW EXECUTE FUNCTION touch_updated();

-- One row per task instance: iteration 0 the first time a task is entered, +1 each time
-- a cycle enters it again. arrivals: the inbound transitions that reached a join.
CREATE TABLE workflow_task (
    workflow_execution bigint NOT NULL REFERENCES workflow_execution (id) ON DELETE CASCADE,
    task_name          text NOT NULL,
    iteration          integer NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    status             text NOT NULL CHECK (status IN ('waiting', 'running', 'succeeded', 'failed', 'cancelled')),
    arrivals           text[] NOT NULL DEFAULT '{}',
    items_total        integer,
    -- A with task's list and limit, evaluated once when the instance started: later items
    -- are dispatched from it, whatever the context became meanwhile.
    items              jsonb,
    concurrency        integer,
    result             jsonb,
    error              text,
    created            timestamptz NOT NULL DEFAULT now(),
    updated            timestamptz NOT NULL DEFAULT now(),
    ended              timestamptz,
    PRIMARY KEY (workflow_execution, task_name, iteration)
);

-- One row per child chain: (task, iteration, item index). execution is the current
-- child; a retry replaces it and counts in retry. The unique index is the seeds' dispatch
-- dedupe (with iteration, for cycles): a duplicate decision cannot create a second child.
CREATE TABLE workflow_task_dispatch (
    id                 bigserial PRIMARY KEY,
    workflow_execution bigint NOT NULL REFERENCES workflow_execution (id) ON DELETE CASCADE,
    task_name          text NOT NULL,
    task_index         integer CHECK (task_index >= 0),
    iteration          integer NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    execution          bigint REFERENCES execution (id) ON DELETE SET NULL,
    retry              integer NOT NULL DEFAULT 0 CHECK (retry >= 0),
    status             text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    result             jsonb,
    -- The task's timeout for this child: a 'timeout' event when it passes still running.
    deadline           timestamptz,
    created            timestamptz NOT NULL DEFAULT now(),
    updated            timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX uq_workflow_task_dispatch
    ON workflow_task_dispatch (workflow_execution, task_name, coalesce(task_index, -1), iteration);
-- A child's end finds its dispatch by execution.
CREATE INDEX workflow_task_dispatch_execution_idx ON workflow_task_dispatch (execution);
CREATE INDEX workflow_task_dispatch_deadline_idx ON workflow_task_dispatch (deadline) WHERE deadline IS NOT NULL;

-- What happened since the workflow was last advanced, in order (id). Consumed (deleted)
-- by the advancement that applies it, in the same transaction.
CREATE TABLE workflow_event (
    id                 bigserial PRIMARY KEY,
    workflow_execution bigint NOT NULL REFERENCES workflow_execution (id) ON DELETE CASCADE,
    kind               text NOT NULL
                       CHECK (kind IN ('start', 'child_ended', 'cancel', 'pause', 'resume', 'timeout', 'rerun')),
    execution          bigint,  -- child_ended: the child
    payload            jsonb NOT NULL DEFAULT '{}',
    created            timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'child_ended') = (execution IS NOT NULL))
);
-- One event per child's end, whoever reports it twice.
CREATE UNIQUE INDEX uq_workflow_event_child ON workflow_event (execution) WHERE kind = 'child_ended';
CREATE INDEX workflow_event_workflow_idx ON workflow_event (workflow_execution, id);

-- == Wake-ups: topic 'workflow' =========================================================

-- wake() of 0009, with one more topic:
--   workflow   workflow executions have events to apply (executors' advancement); a
--              NOTIFY on both transports (RabbitMQ executors listen for it through the
--              PostgreSQL listener, as for requests made in SQL)
CREATE OR REPLACE FUNCTION wake(topic text, execution_ids bigint[] DEFAULT '{}', worker_ids bigint[] DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    route text;
    w bigint;
BEGIN
    IF topic = 'workflow' THEN
        PERFORM pg_notify(current_schema() || '.workflow', '');
        RETURN;
    END IF;
    SELECT r.transport INTO route FROM transport_route r;
    IF topic = 'requested' THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
    ELSIF topic = 'completed' THEN
        PERFORM pg_notify(current_schema() || '.completed', wake_payload(execution_ids));
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'execution.completed', 'execution.completed',
                    jsonb_build_object('execution_ids', to_jsonb(execution_ids)));
        END IF;
    ELSIF topic = 'capacity' THEN
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'worker.capacity', 'worker.capacity',
                    jsonb_build_object('worker_ids', to_jsonb(ARRAY(
                        SELECT DISTINCT x FROM unnest(worker_ids) x ORDER BY x))));
        ELSE
            PERFORM pg_notify(current_schema() || '.capacity', '');
        END IF;
    ELSIF topic = 'dispatched' THEN
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload, execution)
            SELECT 'executions', 'execution.scheduled.worker.' || e.worker, 'execution.scheduled',
                   jsonb_build_object('execution_id', e.id, 'attempt', e.attempt, 'worker_id', e.worker,
                                      'scheduled', e.scheduled),
                   e.id
            FROM execution e
            WHERE e.id = ANY(execution_ids) AND e.status = 'scheduled'
            ORDER BY e.id;
        ELSE
            FOR w IN SELECT DISTINCT x FROM unnest(worker_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
                PERFORM pg_notify(current_schema() || '.worker.' || w, '');
            END LOOP;
        END IF;
    ELSIF topic = 'worker' THEN
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            SELECT 'executions', 'execution.scheduled.worker.' || e.worker, 'execution.scheduled',
                   jsonb_build_object('execution_id', e.id, 'attempt', e.attempt, 'worker_id', e.worker,
                                      'scheduled', e.scheduled)
            FROM execution e
            WHERE e.id = ANY(execution_ids) AND e.worker IS NOT NULL
            ORDER BY e.id;
        ELSE
            FOR w IN SELECT DISTINCT x FROM unnest(worker_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
                PERFORM pg_notify(current_schema() || '.worker.' || w, '');
            END LOOP;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown wake-up topic %', topic;
    END IF;
END
$$;

-- A wake-up for the workflow whose event was just written: statement-level would be
-- cheaper per row, but these triggers fire only for workflow events (rare next to the
-- execution hot path), and NOTIFY collapses duplicates within a transaction.
CREATE FUNCTION workflow_event_wake() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM wake('workflow');
    RETURN NULL;
END
$$;
CREATE TRIGGER workflow_event_wake AFTER INSERT ON workflow_event
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_event_wake();

-- A child's end is its workflow's event, committed with it. A row trigger whose WHEN
-- clause is evaluated without calling the function: executions without a parent (the
-- hot path: every top-level execution) and non-terminal updates cost one comparison.
-- A parent that is not a workflow (no workflow_execution row) inserts nothing.
CREATE FUNCTION workflow_child_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO workflow_event (workflow_execution, kind, execution)
    SELECT w.id, 'child_ended', NEW.id FROM workflow_execution w WHERE w.execution = NEW.parent
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER workflow_child_ended AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (NEW.parent IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned'))
    EXECUTE FUNCTION workflow_child_ended();

-- == Start ==============================================================================

-- Start claimed workflow executions (scheduling -> running, no worker): create-or-get
-- their workflow_execution on the current definition version, with a 'start' event when
-- it was created here (a rerun creates its own, with a 'rerun' event). Nested deeper
-- than p_max_depth (workflow.max_depth: a workflow is depth 0, its sub-workflows 1, ...)
-- or deleted: failed with the reason. Guarded on status and claimant, like assign.
-- Returns each execution's new status and error.
CREATE FUNCTION start_workflows(ids bigint[], executor text, p_max_depth integer DEFAULT 10)
RETURNS TABLE (id bigint, status text, error text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    r record;
    d workflow_definition;
    depth integer;
    problem text;
    wf_id bigint;
BEGIN
    FOR r IN SELECT e.id, e.action_ref, e.parent, e.parameters FROM execution e
             WHERE e.id = ANY(ids) AND e.status = 'scheduling' AND e.executor = start_workflows.executor
             ORDER BY e.id FOR UPDATE LOOP
        problem := NULL;
        SELECT pw.depth + 1 INTO depth FROM workflow_execution pw WHERE pw.execution = r.parent;
        depth := coalesce(depth, 0);
        SELECT * INTO d FROM workflow_definition wd
        WHERE wd.ref = r.action_ref AND wd.deleted IS NULL ORDER BY wd.version DESC LIMIT 1;
        IF depth > p_max_depth THEN
            problem := format('workflow %s nested too deep: depth %s exceeds workflow.max_depth (%s)',
                              r.action_ref, depth, p_max_depth);
        ELSIF d.ref IS NULL AND NOT EXISTS (SELECT 1 FROM workflow_execution w WHERE w.execution = r.id) THEN
            problem := format('workflow %s was deleted (or never registered)', r.action_ref);
        END IF;
        IF problem IS NOT NULL THEN
            UPDATE execution e SET status = 'failed', ended = now(), not_before = NULL,
                result = jsonb_build_object('succeeded', false, 'error', problem, 'failed_by', 'scheduler')
            WHERE e.id = r.id AND e.status = 'scheduling';
            RETURN QUERY SELECT r.id, 'failed'::text, problem;
            CONTINUE;
        END IF;
        UPDATE execution e SET status = 'running', started = now(), not_before = NULL
        WHERE e.id = r.id AND e.status = 'scheduling';
        wf_id := NULL;
        IF NOT EXISTS (SELECT 1 FROM workflow_execution w WHERE w.execution = r.id) THEN
            INSERT INTO workflow_execution (execution, workflow_ref, version, depth, deadline)
            VALUES (r.id, d.ref, d.version, depth,
                    CASE WHEN jsonb_typeof(d.definition -> 'timeout') = 'number'
                         THEN now() + make_interval(secs => (d.definition ->> 'timeout')::float8) END)
            ON CONFLICT ON CONSTRAINT uq_workflow_execution_execution DO NOTHING
            RETURNING workflow_execution.id INTO wf_id;
        END IF;
        IF wf_id IS NOT NULL THEN
            INSERT INTO workflow_event (workflow_execution, kind) VALUES (wf_id, 'start');
        END IF;
        RETURN QUERY SELECT r.id, 'running'::text, NULL::text;
    END LOOP;
END
$$;

-- == Verbs ==============================================================================

-- Cancel a workflow execution with a policy: running or paused -> canceling, and a
-- 'cancel' event; the advancement then cancels its children (cancel_running) or lets
-- them finish (allow_finish, the default), and ends it cancelled once they settled. A
-- second cancel of a canceling workflow may harden the policy. Anything else (not a
-- workflow, not started yet, ended) is cancel_execution's ordinary case.
CREATE FUNCTION cancel_workflow(p_id bigint, p_by text, p_policy text DEFAULT 'allow_finish')
RETURNS TABLE (id bigint, was text, now text, worker bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    IF p_policy IS NULL OR p_policy NOT IN ('allow_finish', 'cancel_running') THEN
        RAISE EXCEPTION 'unknown cancel policy % (allow_finish or cancel_running)', quote_literal(p_policy)
            USING ERRCODE = 'CVA02';
    END IF;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id;
    IF wf_id IS NULL OR current NOT IN ('running', 'paused', 'canceling') THEN
        RETURN QUERY SELECT * FROM cancel_execution(p_id, p_by);
        RETURN;
    END IF;
    IF current <> 'canceling' THEN
        UPDATE execution e SET status = 'canceling', cancelled_by = p_by WHERE e.id = p_id AND e.status = current;
    END IF;
    IF current <> 'canceling' OR p_policy = 'cancel_running' THEN
        INSERT INTO workflow_event (workflow_execution, kind, payload)
        VALUES (wf_id, 'cancel', jsonb_build_object('policy', p_policy, 'by', p_by));
    END IF;
    RETURN QUERY SELECT p_id, current, 'canceling'::text, NULL::bigint;
END
$$;

-- Cancel: 0009's body, restated, with the workflow case in front of it.
CREATE OR REPLACE FUNCTION cancel_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text, worker bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    -- NO KEY UPDATE: see 0008 (a promotion's key-share lock on this row).
    PERFORM 1 FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- >>> WORKFLOW BLOCK (migration 0013) >>>
    -- A started workflow (running, paused, canceling) is cancelled through its events,
    -- with the default policy (cancel_workflow takes another one).
    IF EXISTS (SELECT 1 FROM workflow_execution w JOIN execution e ON e.id = w.execution
               WHERE w.execution = p_id AND e.status IN ('running', 'paused', 'canceling')) THEN
        RETURN QUERY SELECT * FROM cancel_workflow(p_id, p_by, 'allow_finish');
        RETURN;
    END IF;
    -- <<< WORKFLOW BLOCK <<<
    RETURN QUERY
    WITH target AS (
        SELECT e.id, e.status, e.worker, e.attempt FROM execution e WHERE e.id = p_id
    ), moved AS (
        UPDATE execution e
        SET status = CASE WHEN target.status = 'running' THEN 'canceling' ELSE 'cancelled' END,
            ended = CASE WHEN target.status = 'running' THEN NULL ELSE now() END,
            not_before = NULL,
            cancelled_by = p_by,
            result = CASE WHEN target.status = 'running' THEN e.result
                          ELSE jsonb_build_object('succeeded', false, 'error', 'cancelled by ' || p_by,
                                                  'failed_by', 'api') END
        FROM target
        WHERE e.id = target.id AND target.status IN ('requested', 'scheduling', 'scheduled', 'running')
        RETURNING e.id, e.status, e.worker, e.attempt, target.status AS was
    ), closed AS (
        UPDATE execution_attempt t SET ended = now(), outcome = 'cancelled', error = 'cancelled by ' || p_by
        FROM moved WHERE moved.was = 'scheduled' AND t.execution = moved.id AND t.attempt = moved.attempt
    )
    SELECT target.id, target.status,
           coalesce(moved.status, CASE WHEN target.status = 'canceling' THEN 'canceling' END),
           coalesce(moved.worker, target.worker)
    FROM target LEFT JOIN moved ON moved.id = target.id;
END
$$;

-- Pause a running workflow: no new task starts, children in flight finish. Returns the
-- execution's status before and after (now NULL: not a running workflow, nothing done).
CREATE FUNCTION pause_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id;
    IF wf_id IS NULL OR current <> 'running' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'paused' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'paused' WHERE e.id = p_id AND e.status = 'running';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'pause', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'paused'::text;
END
$$;

-- Resume a paused workflow. Same answer shape as pause_execution.
CREATE FUNCTION resume_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id;
    IF wf_id IS NULL OR current <> 'paused' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'running' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'running' WHERE e.id = p_id AND e.status = 'paused';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'resume', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'running'::text;
END
$$;

-- Rerun an ended workflow as a NEW execution of the same workflow and parameters.
-- from_failed: its workflow_execution is a copy of the old one (same definition version:
-- the copied task states belong to it) -- context, tasks, dispatches -- minus the failed
-- and cancelled task instances and their unfinished children, which a 'rerun' event
-- lists for the conductor to start again; what completed keeps its results. Otherwise a
-- plain new run of the current version. The old execution is left as it is.
-- Errors: CVN04 not a workflow execution; CVC04 not ended, or ended well (nothing to rerun).
CREATE FUNCTION rerun_execution(p_id bigint, p_from_failed boolean, p_by text)
RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    old execution;
    wf workflow_execution;
    new_id bigint;
    new_wf bigint;
    reset jsonb;
BEGIN
    SELECT * INTO old FROM execution e WHERE e.id = p_id;
    SELECT * INTO wf FROM workflow_execution w WHERE w.execution = p_id;
    IF old.id IS NULL OR wf.id IS NULL THEN
        RAISE EXCEPTION 'execution % is not a workflow execution', p_id USING ERRCODE = 'CVN04';
    END IF;
    IF old.status NOT IN ('failed', 'cancelled', 'timeout', 'abandoned') THEN
        RAISE EXCEPTION 'workflow execution % is %: only a failed or cancelled workflow can be rerun', p_id, old.status
            USING ERRCODE = 'CVC04';
    END IF;
    INSERT INTO execution (action_ref, parameters) VALUES (old.action_ref, old.parameters)
    RETURNING execution.id INTO new_id;
    IF NOT p_from_failed THEN
        RETURN new_id;  -- started like any request (start_workflows), rerun_of unset
    END IF;
    -- The state is copied whole, as the failed execution left it: the conductor's rerun
    -- (workflows/conductor.py) starts each failed task instance again as a new iteration
    -- and keeps what completed (and the succeeded instances' results). A cancelled
    -- instance, or one still running when a workflow timeout ended the workflow (its
    -- children were cancelled), is copied as failed: the rerun starts it again too.
    INSERT INTO workflow_execution (execution, workflow_ref, version, status, context, errors, depth, cancel_policy,
                                    rerun_of)
    VALUES (new_id, wf.workflow_ref, wf.version, 'running', wf.context, '[]', 0, 'allow_finish', wf.id)
    RETURNING workflow_execution.id INTO new_wf;
    SELECT coalesce(jsonb_agg(jsonb_build_array(t.task_name, t.iteration) ORDER BY t.task_name, t.iteration), '[]')
    INTO reset FROM workflow_task t
    WHERE t.workflow_execution = wf.id AND t.status IN ('failed', 'cancelled', 'running');
    INSERT INTO workflow_task (workflow_execution, task_name, iteration, status, arrivals, items_total, items,
                               concurrency, result, error, ended)
    SELECT new_wf, t.task_name, t.iteration,
           CASE WHEN t.status IN ('cancelled', 'running') THEN 'failed' ELSE t.status END,
           t.arrivals, t.items_total, t.items, t.concurrency, t.result, t.error, t.ended
    FROM workflow_task t
    WHERE t.workflow_execution = wf.id;
    INSERT INTO workflow_task_dispatch (workflow_execution, task_name, task_index, iteration, execution, retry,
                                       status, result)
    SELECT new_wf, d.task_name, d.task_index, d.iteration, d.execution, d.retry,
           CASE WHEN d.status = 'running' THEN 'cancelled' ELSE d.status END, d.result
    FROM workflow_task_dispatch d
    WHERE d.workflow_execution = wf.id;
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (new_wf, 'rerun', jsonb_build_object('tasks', reset, 'by', p_by, 'rerun_of', p_id));
    RETURN new_id;
END
$$;

-- Timeouts due (the reconciler, on every replica): a task's child still running past its
-- dispatch's deadline, or a workflow past its own, becomes a 'timeout' event. The
-- deadline is cleared in the same statement, so each fires once however many replicas
-- look. Returns how many events were written.
CREATE FUNCTION workflow_timeouts() RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    n integer;
    m integer;
BEGIN
    WITH due AS (
        SELECT d.id FROM workflow_task_dispatch d
        WHERE d.deadline <= now() AND d.status = 'running'
        ORDER BY d.id FOR UPDATE SKIP LOCKED
    ), cleared AS (
        UPDATE workflow_task_dispatch d SET deadline = NULL FROM due WHERE d.id = due.id
        RETURNING d.workflow_execution, d.task_name, d.iteration, d.task_index, d.execution
    )
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    SELECT c.workflow_execution, 'timeout',
           jsonb_build_object('task', c.task_name, 'iteration', c.iteration, 'index', c.task_index,
                              'execution', c.execution)
    FROM cleared c;
    GET DIAGNOSTICS n = ROW_COUNT;
    WITH due AS (
        SELECT w.id FROM workflow_execution w
        WHERE w.deadline <= now() AND w.status IN ('running', 'paused', 'canceling')
        ORDER BY w.id FOR UPDATE SKIP LOCKED
    ), cleared AS (
        UPDATE workflow_execution w SET deadline = NULL FROM due WHERE w.id = due.id RETURNING w.id
    )
    INSERT INTO workflow_event (workflow_execution, kind) SELECT c.id, 'timeout' FROM cleared c;
    GET DIAGNOSTICS m = ROW_COUNT;
    RETURN n + m;
END
$$;
