-- Inquiries: core.ask asks people a question and its execution waits, `pending`, holding
-- no worker slot, until enough of them answered (or its ttl ran out, or it was cancelled).
-- The seed's phase 4: one inquiry per execution (uq_inquiry_execution), created with
-- create-or-get, and "inquiry created" announced only when it was actually created.
--
-- The verbs, each one SQL function that the SDK, the API and the CLI call:
--   ask_inquiries(ids, executor)   the executor's: claimed core.ask executions
--                                  (scheduling) -> pending, each with its inquiry
--   respond_inquiry(id, responder, role, data)
--                                  an answer (validated against the inquiry's schema by
--                                  the caller: conveyor.verbs.check_answer); says what
--                                  happened: answered, recorded, or why it was refused
--   expire_inquiries()             the executor's duty: past their deadline, fail
--                                  (timeout) or answer with the default
--   cancel_execution(id, by)       (restated) also cancels a pending inquiry
-- Locks are taken execution first, then inquiry, by every one of them.

-- == Who asked ==
-- The requester of an execution: the API's token name, the CLI's user, an SDK caller's
-- requested_by. Callers say it with `SET LOCAL conveyor.requested_by = '...'` (or
-- set_config) in the requesting transaction, so every way of inserting an execution --
-- request_execution, request_executions, request_execution_once, an operator's INSERT --
-- records it without a new parameter; unset: NULL (nobody in particular). An inquiry in a
-- workflow takes its root execution's requester (see ask_inquiries).
ALTER TABLE execution ADD COLUMN requested_by text;
ALTER TABLE execution ALTER COLUMN requested_by SET DEFAULT nullif(current_setting('conveyor.requested_by', true), '');

-- == The inquiry ==
CREATE TABLE inquiry (
    id               bigserial PRIMARY KEY,
    execution        bigint NOT NULL REFERENCES execution (id) ON DELETE CASCADE,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'responded', 'timeout', 'cancelled')),
    prompt           text NOT NULL,
    -- The JSON Schema an answer must satisfy (checked by the caller of respond_inquiry).
    schema           jsonb NOT NULL DEFAULT '{}',
    -- Who may answer: token names, and roles (viewer, operator, admin: that role or a
    -- higher one). Empty: anyone with the operator role or higher.
    assignees        text[] NOT NULL DEFAULT '{}',
    -- Distinct responders needed; the answer that reaches the quorum is the response.
    quorum           integer NOT NULL DEFAULT 1 CHECK (quorum >= 1),
    forbid_requester boolean NOT NULL DEFAULT false,
    requester        text,
    ttl              double precision CHECK (ttl > 0),
    -- now() + ttl when asked (database clock); NULL: waits for ever.
    deadline         timestamptz,
    -- "fail" (the execution ends timeout) or {"default": <answer>} (answered with it).
    on_timeout       jsonb NOT NULL DEFAULT '"fail"'
                     CHECK (on_timeout = '"fail"' OR (jsonb_typeof(on_timeout) = 'object' AND on_timeout ? 'default')),
    response         jsonb,
    responded        timestamptz,
    created          timestamptz NOT NULL DEFAULT now(),
    updated          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uq_inquiry_execution UNIQUE (execution)
);
CREATE INDEX inquiry_pending_deadline_idx ON inquiry (deadline) WHERE status = 'pending';
CREATE INDEX inquiry_status_idx ON inquiry (status, id);

-- Every answer, kept (who, when, what, with which role): the audit. One per responder.
CREATE TABLE inquiry_response (
    id        bigserial PRIMARY KEY,
    inquiry   bigint NOT NULL REFERENCES inquiry (id) ON DELETE CASCADE,
    responder text NOT NULL,
    role      text,
    data      jsonb NOT NULL,
    created   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uq_inquiry_response_responder UNIQUE (inquiry, responder)
);

-- == The action ==
INSERT INTO action (ref, pack, name, description, runner_type, runtime, parameters_schema)
VALUES ('core.ask', 'core', 'ask',
        'Ask people a question and wait for their answer (an inquiry): pending until answered, '
        'its result is {"response": <answer>, "responders": [...]}.',
        'inquiry', 'conveyor',
        '{"type": "object",
          "properties": {
            "prompt": {"type": "string", "minLength": 1, "description": "the question"},
            "schema": {"type": "object", "description": "JSON Schema of the answer (default: any JSON)"},
            "assignees": {"type": "array", "items": {"type": "string", "minLength": 1},
                          "description": "token names and/or roles (viewer, operator, admin) who may answer; none: any operator"},
            "ttl": {"type": "number", "exclusiveMinimum": 0, "maximum": 31536000,
                    "description": "seconds to wait for the answer (default: for ever)"},
            "on_timeout": {"oneOf": [{"const": "fail"},
                                     {"type": "object", "properties": {"default": {}}, "required": ["default"],
                                      "additionalProperties": false}],
                           "description": "after the ttl: fail (the execution ends timeout), or {\"default\": answer}"},
            "quorum": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1,
                       "description": "distinct responders needed"},
            "forbid_requester": {"type": "boolean", "default": false,
                                 "description": "the execution''s requester may not answer"}
          },
          "required": ["prompt"],
          "additionalProperties": false}')
ON CONFLICT (ref) DO UPDATE
SET pack = EXCLUDED.pack, name = EXCLUDED.name, description = EXCLUDED.description,
    runner_type = EXCLUDED.runner_type, runtime = EXCLUDED.runtime,
    parameters_schema = EXCLUDED.parameters_schema, metadata = '{}';

-- == Announcing new inquiries ==
-- Statement trigger: the rows an INSERT actually inserted (ON CONFLICT DO NOTHING leaves
-- the duplicates out of the transition table), so a repeated ask announces nothing.
CREATE FUNCTION inquiry_wake_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    asked bigint[];
BEGIN
    SELECT array_agg(execution ORDER BY execution) INTO asked FROM inserted;
    IF asked IS NOT NULL THEN
        PERFORM wake('inquiry', asked);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER inquiry_wake_inserted AFTER INSERT ON inquiry
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION inquiry_wake_inserted();

-- A role's rank (NULL: not a role name), for "that role or a higher one".
CREATE FUNCTION inquiry_role_rank(p_role text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_role WHEN 'viewer' THEN 1 WHEN 'operator' THEN 2 WHEN 'admin' THEN 3 END
$$;

-- The requester an inquiry names: its execution's, or for a child (a workflow's task)
-- the root execution's -- the person who started the workflow. Bounded: a parent chain
-- deeper than 100 (not made by Conveyor) stops there.
CREATE FUNCTION root_requester(p_execution bigint) RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    WITH RECURSIVE up AS (
        SELECT e.id, e.parent, e.requested_by, 0 AS depth FROM execution e WHERE e.id = p_execution
        UNION ALL
        SELECT p.id, p.parent, p.requested_by, up.depth + 1
        FROM up JOIN execution p ON p.id = up.parent
        WHERE up.depth < 100
    )
    SELECT requested_by FROM up ORDER BY depth DESC LIMIT 1
$$;

-- == ask: the executor's claimed core.ask executions (scheduling, claimed by p_executor)
-- become pending, each with its inquiry. Create-or-get: an inquiry that exists already
-- is kept (ON CONFLICT DO NOTHING) and not announced again. The caller validated the
-- parameters (the action's JSON Schema, and that `schema` is one). Returns a row per
-- execution moved to pending: its inquiry and whether this call created it.
CREATE FUNCTION ask_inquiries(ids bigint[], executor text)
RETURNS TABLE (execution bigint, inquiry bigint, created boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH asking AS (
        SELECT e.id, e.parameters AS p FROM execution e
        WHERE e.id = ANY(ask_inquiries.ids) AND e.status = 'scheduling' AND e.executor = ask_inquiries.executor
        ORDER BY e.id
        FOR NO KEY UPDATE OF e
    ), inserted AS (
        INSERT INTO inquiry AS i (execution, prompt, schema, assignees, quorum, forbid_requester, requester,
                                  ttl, deadline, on_timeout)
        SELECT a.id, a.p ->> 'prompt', coalesce(a.p -> 'schema', '{}'),
               ARRAY(SELECT jsonb_array_elements_text(coalesce(a.p -> 'assignees', '[]'))),
               coalesce((a.p ->> 'quorum')::numeric::integer, 1),
               coalesce((a.p ->> 'forbid_requester')::boolean, false),
               root_requester(a.id),
               (a.p ->> 'ttl')::float8,
               now() + make_interval(secs => (a.p ->> 'ttl')::float8),
               coalesce(a.p -> 'on_timeout', '"fail"')
        FROM asking a ORDER BY a.id
        ON CONFLICT ON CONSTRAINT uq_inquiry_execution DO NOTHING
        RETURNING i.id, i.execution
    ), moved AS (
        UPDATE execution e SET status = 'pending', started = now(), not_before = NULL
        FROM asking WHERE e.id = asking.id AND e.status = 'scheduling'
        RETURNING e.id
    )
    SELECT m.id, coalesce(n.id, (SELECT i.id FROM inquiry i WHERE i.execution = m.id)), n.id IS NOT NULL
    FROM moved m LEFT JOIN inserted n ON n.execution = m.id
    ORDER BY m.id;
END
$$;

-- == respond: one answer from p_responder (a token's name, or the CLI's user) with
-- p_role (the token's role; the CLI's database credentials count as admin). The caller
-- checked p_data against the inquiry's schema (conveyor.verbs.check_answer). Outcomes:
--   answered             the quorum is reached: the inquiry is responded and its execution
--                        completed with {"response": p_data, "responders": [...]}
--   recorded             the answer counts; more distinct responders are needed
--   not_found            no such inquiry
--   not_pending          answered, timed out or cancelled already (of racing answers that
--                        complete it, exactly one is answered: the others find it so)
--   not_assignee         neither named nor of an assigned role (none assigned: operators)
--   requester_forbidden  forbid_requester, and this is who requested the execution
--   already_responded    this responder answered already (it needs someone else)
CREATE FUNCTION respond_inquiry(p_id bigint, p_responder text, p_role text, p_data jsonb)
RETURNS TABLE (outcome text, inquiry bigint, execution bigint, status text, responders text[])
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    eid bigint;
    q inquiry;
    execution_status text;
    who text[];
    answers jsonb;
BEGIN
    SELECT i.execution INTO eid FROM inquiry i WHERE i.id = p_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', p_id, NULL::bigint, NULL::text, NULL::text[];
        RETURN;
    END IF;
    -- Execution first, then inquiry: the order cancel_execution and expire_inquiries use.
    -- Concurrent answers queue here; each then sees what the one before it did.
    SELECT e.status INTO execution_status FROM execution e WHERE e.id = eid FOR NO KEY UPDATE;
    SELECT * INTO q FROM inquiry i WHERE i.id = p_id FOR UPDATE;
    who := ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = p_id ORDER BY r.id);
    IF q.status <> 'pending' OR execution_status IS DISTINCT FROM 'pending' THEN
        RETURN QUERY SELECT 'not_pending', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF NOT (p_responder = ANY(q.assignees)
            OR (cardinality(q.assignees) = 0 AND coalesce(inquiry_role_rank(p_role), 0) >= inquiry_role_rank('operator'))
            OR EXISTS (SELECT 1 FROM unnest(q.assignees) a
                       WHERE coalesce(inquiry_role_rank(p_role), 0) >= inquiry_role_rank(a))) THEN
        RETURN QUERY SELECT 'not_assignee', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF q.forbid_requester AND q.requester IS NOT NULL AND q.requester = p_responder THEN
        RETURN QUERY SELECT 'requester_forbidden', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF p_responder = ANY(who) THEN
        RETURN QUERY SELECT 'already_responded', p_id, eid, q.status, who;
        RETURN;
    END IF;
    INSERT INTO inquiry_response (inquiry, responder, role, data) VALUES (p_id, p_responder, p_role, p_data);
    who := who || p_responder;
    IF cardinality(who) < q.quorum THEN
        UPDATE inquiry i SET updated = now() WHERE i.id = p_id;
        RETURN QUERY SELECT 'recorded', p_id, eid, q.status, who;
        RETURN;
    END IF;
    SELECT jsonb_agg(jsonb_build_object('responder', r.responder, 'data', r.data) ORDER BY r.id) INTO answers
    FROM inquiry_response r WHERE r.inquiry = p_id;
    UPDATE inquiry i SET status = 'responded', response = p_data, responded = now(), updated = now()
    WHERE i.id = p_id AND i.status = 'pending';
    UPDATE execution e
    SET status = 'completed', ended = now(),
        result = jsonb_build_object('succeeded', true, 'response', p_data, 'responders', to_jsonb(who),
                                    'responses', answers)
    WHERE e.id = eid AND e.status = 'pending';
    RETURN QUERY SELECT 'answered', p_id, eid, 'responded'::text, who;
END
$$;

-- == expire: inquiries past their deadline (database clock). on_timeout "fail": the
-- execution ends timeout, the inquiry timeout; {"default": x}: answered with x by the
-- responder 'ttl' (audited like any answer). Also closes (cancelled) a pending inquiry
-- whose execution ended some other way (an operator's SQL): nothing could answer it.
-- Rows another transaction holds are skipped (the next run takes them): safe on every
-- executor replica at once. Returns what it did, a row per inquiry.
CREATE FUNCTION expire_inquiries(p_limit integer DEFAULT 1000)
RETURNS TABLE (inquiry bigint, execution bigint, outcome text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    d record;
    who text[];
    answers jsonb;
    fallback jsonb;
BEGIN
    FOR d IN SELECT i.id, i.execution, i.on_timeout, i.ttl, e.status AS execution_status
             FROM inquiry i JOIN execution e ON e.id = i.execution
             WHERE i.status = 'pending'
               AND (i.deadline <= now() OR e.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned'))
             ORDER BY i.id
             LIMIT p_limit
             FOR NO KEY UPDATE OF e SKIP LOCKED
             FOR UPDATE OF i SKIP LOCKED LOOP
        IF d.execution_status <> 'pending' THEN
            UPDATE inquiry i SET status = 'cancelled', updated = now() WHERE i.id = d.id;
            RETURN QUERY SELECT d.id, d.execution, 'closed'::text;
        ELSIF d.on_timeout = '"fail"' THEN
            UPDATE inquiry i SET status = 'timeout', updated = now() WHERE i.id = d.id;
            UPDATE execution e
            SET status = 'timeout', ended = now(),
                result = jsonb_build_object(
                    'succeeded', false, 'failed_by', 'inquiry',
                    'error', format('inquiry %s was not answered within its ttl of %s s', d.id, d.ttl))
            WHERE e.id = d.execution AND e.status = 'pending';
            RETURN QUERY SELECT d.id, d.execution, 'timeout'::text;
        ELSE
            fallback := d.on_timeout -> 'default';
            INSERT INTO inquiry_response (inquiry, responder, role, data)
            VALUES (d.id, 'ttl', NULL, fallback)
            ON CONFLICT ON CONSTRAINT uq_inquiry_response_responder DO NOTHING;
            who := ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = d.id ORDER BY r.id);
            SELECT jsonb_agg(jsonb_build_object('responder', r.responder, 'data', r.data) ORDER BY r.id)
            INTO answers FROM inquiry_response r WHERE r.inquiry = d.id;
            UPDATE inquiry i SET status = 'responded', response = fallback, responded = now(), updated = now()
            WHERE i.id = d.id;
            UPDATE execution e
            SET status = 'completed', ended = now(),
                result = jsonb_build_object('succeeded', true, 'response', fallback, 'responders', to_jsonb(who),
                                            'responses', answers, 'timed_out', true)
            WHERE e.id = d.execution AND e.status = 'pending';
            RETURN QUERY SELECT d.id, d.execution, 'default'::text;
        END IF;
    END LOOP;
END
$$;

-- wake(), restated from 0013 (0009's body and the workflow topic) with one topic more:
--   inquiry     inquiries were created (execution_ids: their asking executions): a NOTIFY
--               on <schema>.inquiry with the inquiry ids, and on RabbitMQ an
--               inquiry.created message naming them. Only for inquiries actually inserted
--               (the inquiry_wake_inserted trigger): asking twice announces once.
CREATE OR REPLACE FUNCTION wake(topic text, execution_ids bigint[] DEFAULT '{}', worker_ids bigint[] DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    route text;
    w bigint;
BEGIN
    SELECT r.transport INTO route FROM transport_route r;
    IF topic = 'workflow' THEN
        -- (0013) Workflow executions have events to apply.
        PERFORM pg_notify(current_schema() || '.workflow', '');
    ELSIF topic = 'requested' THEN
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
            -- The message says "look now", as every message does: the worker finds the
            -- cancel in its rows (a copy dead-lettered later is resolved stale).
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
    ELSIF topic = 'inquiry' THEN
        -- (0014) The inquiries of these asking executions were created.
        PERFORM pg_notify(current_schema() || '.inquiry', wake_payload(ARRAY(
            SELECT i.id FROM inquiry i WHERE i.execution = ANY(execution_ids) ORDER BY i.id)));
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'inquiry.created', 'inquiry.created',
                    jsonb_build_object('inquiry_ids', to_jsonb(ARRAY(
                                           SELECT i.id FROM inquiry i WHERE i.execution = ANY(execution_ids)
                                           ORDER BY i.id)),
                                       'execution_ids', to_jsonb(execution_ids)));
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown wake-up topic %', topic;
    END IF;
END
$$;


-- cancel_execution, restated from 0009: a pending execution (an inquiry waiting for its
-- answer) is cancelled at once, and its inquiry with it. The two changes are marked (0014); the workflow block of 0013 is kept.
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
        -- (0014) 'pending': an inquiry waiting for its answer is cancelled at once.
        WHERE e.id = target.id AND target.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending')
        RETURNING e.id, e.status, e.worker, e.attempt, target.status AS was
    ), closed AS (
        UPDATE execution_attempt t SET ended = now(), outcome = 'cancelled', error = 'cancelled by ' || p_by
        FROM moved WHERE moved.was = 'scheduled' AND t.execution = moved.id AND t.attempt = moved.attempt
    )
    SELECT target.id, target.status,
           coalesce(moved.status, CASE WHEN target.status = 'canceling' THEN 'canceling' END),
           coalesce(moved.worker, target.worker)
    FROM target LEFT JOIN moved ON moved.id = target.id;
    -- == (0014) Inquiries: the inquiry of an execution cancelled while pending is
    -- cancelled with it, in this transaction (locks: execution, then inquiry, as
    -- respond_inquiry and expire_inquiries take them). ==
    UPDATE inquiry i SET status = 'cancelled', updated = now()
    FROM execution e
    WHERE i.execution = p_id AND i.status = 'pending' AND e.id = i.execution AND e.status = 'cancelled';
END
$$;


-- The executor claims workflows and inquiries every round, whatever the workers' free
-- capacity (claim_executor_run): this index reaches the requested executions of those
-- few actions without scanning a backlog of worker-run ones.
CREATE INDEX execution_requested_action_idx ON execution (action_ref, id) WHERE status = 'requested';
