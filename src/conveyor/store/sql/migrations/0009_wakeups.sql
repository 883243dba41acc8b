-- Committed transitions wake their listeners themselves. Until now every caller that
-- changed an execution also had to publish the matching wake-up by hand (some 35 calls,
-- a NOTIFY on one transport and an outbox row on the other), and they drifted: a cancel
-- from the SDK rang a channel a RabbitMQ worker does not listen to. Now statement
-- triggers on execution and worker derive the wake-ups from the rows a statement
-- changed and hand them to one function, wake(), which knows the transport in use. A
-- wake-up exists if and only if the change commits, whoever made it -- the executor, a
-- worker, the API, or an operator's own SQL.

-- Which transport carries the wake-ups: written by every executor and worker at start
-- (all processes of one installation must use the same transport). NULL until the first
-- one starts: PostgreSQL's NOTIFY then.
CREATE TABLE transport_route (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    transport text CHECK (transport IN ('postgres', 'rabbitmq')),
    updated   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO transport_route DEFAULT VALUES;

-- A row when it changed the route: the transport it replaced (NULL: none declared yet),
-- so a process can warn when it switches an installation's transport; none when unchanged.
CREATE FUNCTION set_transport_route(p_transport text) RETURNS TABLE (was text)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH old AS (SELECT transport FROM transport_route FOR UPDATE)
    UPDATE transport_route r SET transport = p_transport, updated = now()
    FROM old WHERE r.singleton AND old.transport IS DISTINCT FROM p_transport
    RETURNING old.transport
$$;

-- NOTIFY payloads are capped at 8000 bytes: a longer id list goes without a payload
-- and the waiters re-read their rows.
CREATE FUNCTION wake_payload(ids bigint[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(p) > 7900 THEN '' ELSE p END
    FROM (SELECT coalesce(array_to_string(ids, ','), '') AS p) s
$$;

-- The one place a wake-up is published. Topics:
--   requested   executions wait to be scheduled (executors; NOTIFY on both transports,
--               which is where RabbitMQ executors also hear requests made in SQL)
--   completed   executions ended (payload: their ids): the SDK's waits, the API's
--               stream, and on RabbitMQ the execution.completed message
--   capacity    workers freed slots or joined (payload: the workers)
--   dispatched  executions were placed on workers: a NOTIFY per worker, or on RabbitMQ
--               one execution.scheduled message per dispatch, naming (execution,
--               attempt, worker, scheduled) for the dead-letter handler's checks
--   worker      workers have something to look at (a cancel of execution_ids): a NOTIFY per
--               worker, or on RabbitMQ a message to its queue naming the execution (the
--               worker's queue is its only doorbell there: a LISTEN connection per worker
--               would be woken by every NOTIFY of the database)
CREATE FUNCTION wake(topic text, execution_ids bigint[] DEFAULT '{}', worker_ids bigint[] DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    route text;
    w bigint;
BEGIN
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
    ELSE
        RAISE EXCEPTION 'unknown wake-up topic %', topic;
    END IF;
END
$$;

-- Whatever writes the outbox (wake(), a replay, the reconciler) wakes the relays.
CREATE FUNCTION outbox_wake() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_wake AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_wake();

-- New executions wake the executors.
CREATE FUNCTION execution_wake_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE status = 'requested') THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER execution_wake_inserted AFTER INSERT ON execution
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION execution_wake_inserted();

-- Changed executions: what entered requested wakes the executors, what was placed wakes
-- its workers, what ended wakes its waiters, what left a worker's slot frees capacity,
-- and a cancel wakes the worker running it.
CREATE FUNCTION execution_wake_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    requested boolean;
    ended bigint[];
    freed bigint[];
    placed bigint[];
    placed_on bigint[];
    cancelling bigint[];
    cancelled_on bigint[];
BEGIN
    -- Half of all statements are claims (-> scheduling) and starts (-> running), which wake
    -- nobody: one pass over the new rows says so without the join below (this trigger is on
    -- the hot path; wake() removes duplicate workers, so the arrays are not made distinct).
    IF NOT EXISTS (SELECT 1 FROM after_rows a WHERE a.status NOT IN ('scheduling', 'running')) THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(bool_or(a.status = 'requested' AND b.status <> 'requested'), false),
           array_agg(a.id) FILTER (
               WHERE a.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
                 AND b.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')),
           array_agg(b.worker) FILTER (
               WHERE b.worker IS NOT NULL AND b.status IN ('scheduled', 'running', 'canceling')
                 AND (a.status NOT IN ('scheduled', 'running', 'canceling') OR a.worker IS DISTINCT FROM b.worker)),
           array_agg(a.id) FILTER (
               WHERE a.status = 'scheduled' AND a.worker IS NOT NULL
                 AND (b.status <> 'scheduled' OR b.attempt <> a.attempt)),
           array_agg(a.worker) FILTER (
               WHERE a.status = 'scheduled' AND a.worker IS NOT NULL
                 AND (b.status <> 'scheduled' OR b.attempt <> a.attempt)),
           array_agg(a.id) FILTER (
               WHERE a.status = 'canceling' AND b.status <> 'canceling' AND a.worker IS NOT NULL),
           array_agg(a.worker) FILTER (
               WHERE a.status = 'canceling' AND b.status <> 'canceling' AND a.worker IS NOT NULL)
    INTO requested, ended, freed, placed, placed_on, cancelling, cancelled_on
    FROM after_rows a JOIN before_rows b USING (id);
    IF requested THEN
        PERFORM wake('requested');
    END IF;
    IF placed IS NOT NULL THEN
        PERFORM wake('dispatched', placed, placed_on);
    END IF;
    IF ended IS NOT NULL THEN
        PERFORM wake('completed', ended);
    END IF;
    IF freed IS NOT NULL THEN
        PERFORM wake('capacity', '{}', freed);
    END IF;
    IF cancelling IS NOT NULL THEN
        PERFORM wake('worker', cancelling, cancelled_on);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER execution_wake_changed AFTER UPDATE ON execution
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION execution_wake_changed();

-- A worker that joins, comes back (a new process: pid), is uncordoned or grows offers
-- capacity. (Row
-- triggers with WHEN: the heartbeat updates every worker row every few seconds and must
-- not pay for a statement trigger.)
CREATE FUNCTION worker_wake() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM wake('capacity', '{}', ARRAY[NEW.id]);
    RETURN NULL;
END
$$;
CREATE TRIGGER worker_wake_inserted AFTER INSERT ON worker
    FOR EACH ROW WHEN (NEW.status = 'active' AND NOT NEW.cordoned) EXECUTE FUNCTION worker_wake();
CREATE TRIGGER worker_wake_changed AFTER UPDATE OF status, cordoned, capacity, pid ON worker
    FOR EACH ROW WHEN (NEW.status = 'active' AND NOT NEW.cordoned
                       AND (OLD.status, OLD.cordoned, OLD.capacity, OLD.pid)
                           IS DISTINCT FROM (NEW.status, NEW.cordoned, NEW.capacity, NEW.pid))
    EXECUTE FUNCTION worker_wake();

-- == The verbs: one SQL function each, called by the SDK, the API and the CLI alike ==
-- (their wake-ups come from the triggers above, not from the callers).

-- Who asked for a cancel, kept on the execution (a running one ends cancelled later,
-- by its worker, which does not know who asked).
ALTER TABLE execution ADD COLUMN cancelled_by text;

-- Requests: the same, minus the hand-made NOTIFY (the insert trigger wakes).
CREATE OR REPLACE FUNCTION request_execution(action_ref text, parameters jsonb DEFAULT '{}',
                                             parent bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    action_schema jsonb;
    problems text[];
    new_id bigint;
BEGIN
    SELECT a.parameters_schema INTO action_schema FROM action a WHERE a.ref = request_execution.action_ref;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown action %', quote_literal(request_execution.action_ref)
            USING ERRCODE = 'CVA01', HINT = 'no worker has registered this action';
    END IF;
    problems := validate_parameters(action_schema, coalesce(request_execution.parameters, '{}'));
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION 'invalid parameters for %: %', request_execution.action_ref,
            array_to_string(problems, '; ')
            USING ERRCODE = 'CVA02';
    END IF;
    INSERT INTO execution (action_ref, parameters, parent)
    VALUES (request_execution.action_ref, coalesce(request_execution.parameters, '{}'),
            request_execution.parent)
    RETURNING id INTO new_id;
    RETURN new_id;
END
$$;

-- Many requests in one statement, for callers that validated the parameters with full
-- JSON Schema (the SDK's request_executions); an unknown action fails on the foreign key.
CREATE FUNCTION request_executions(refs text[], parameters jsonb[]) RETURNS SETOF bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH inserted AS (
        INSERT INTO execution (action_ref, parameters)
        SELECT * FROM unnest(refs, parameters)
        RETURNING id
    )
    SELECT id FROM inserted ORDER BY id
$$;

-- Cancel: as in 0008, and now records who asked (cancelled_by) in every case.
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

-- Scheduled work that will not start where it is goes back to requested: on one worker
-- (p_worker: its shutdown, or a drain) or, with NULL, on any worker that is gone. Not an
-- attempt: the dispatch never started, so its attempt number and row are withdrawn.
-- Returns the withdrawn attempts and the workers' names (for logs).
CREATE FUNCTION hand_back_scheduled(p_worker bigint)
RETURNS TABLE (id bigint, worker bigint, attempt integer, worker_name text)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH back AS (
        SELECT e.id, e.attempt, e.worker, w.name AS worker_name
        FROM execution e LEFT JOIN worker w ON w.id = e.worker
        WHERE e.status = 'scheduled'
          AND (e.worker = p_worker OR (p_worker IS NULL AND (w.id IS NULL OR w.status = 'inactive')))
        ORDER BY e.id
        FOR UPDATE OF e SKIP LOCKED
    ), withdrawn AS (
        DELETE FROM execution_attempt t USING back WHERE t.execution = back.id AND t.attempt = back.attempt
    )
    UPDATE execution e
    SET status = 'requested', worker = NULL, executor = NULL, attempt = e.attempt - 1,
        scheduled = NULL, started = NULL
    FROM back
    WHERE e.id = back.id AND e.status = 'scheduled' AND e.attempt = back.attempt
    RETURNING e.id, back.worker, back.attempt, back.worker_name
$$;

-- Cordon (true) or uncordon (false) a worker by name: a cordoned worker keeps what it
-- runs but is given nothing new. No row: no such worker.
CREATE FUNCTION cordon_worker(p_name text, p_cordoned boolean)
RETURNS TABLE (id bigint, name text, status text, cordoned boolean)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE worker w SET cordoned = p_cordoned WHERE w.name = p_name
    RETURNING w.id, w.name, w.status, w.cordoned
$$;

-- Drain: cordon, then hand its not-yet-started work to other workers; what it runs
-- finishes there. The placement lock first, so no dispatch to it can slip in after.
CREATE FUNCTION drain_worker(p_name text)
RETURNS TABLE (id bigint, name text, status text, cordoned boolean, handed_back integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    w record;
    n integer;
BEGIN
    SELECT * INTO w FROM cordon_worker(p_name, true);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || '.assign', 0));
    SELECT count(*) INTO n FROM hand_back_scheduled(w.id);
    RETURN QUERY SELECT w.id, w.name, w.status, w.cordoned, n;
END
$$;

-- Admission policies (operator's): create or replace; the admission_policy trigger
-- admits whoever a higher limit now allows. The caller checked the spec (the same check
-- for SDK, API and CLI: conveyor.verbs.policy_spec); the table's CHECKs guard the rest.
CREATE FUNCTION set_admission_policy(p_target text, p_concurrency integer, p_parameters text[], p_method text)
RETURNS SETOF admission_policy
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO admission_policy AS p (target, concurrency, parameters, method, source)
    VALUES (p_target, p_concurrency, p_parameters, p_method, 'operator')
    ON CONFLICT (target) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, parameters = EXCLUDED.parameters,
        method = EXCLUDED.method, source = 'operator'
    RETURNING p.*
$$;

-- Delete a policy; its slots and waiting lines go with it (cascade) and the waiters
-- become schedulable. Deleting an operator's override of an action's own policy puts
-- that one back (restored); deleting the policy an action's definition declares is
-- refused (CVC02): it would last only until the next registration.
-- Errors: CVN03 no such policy.
CREATE FUNCTION delete_admission_policy(p_target text)
RETURNS TABLE (target text, source text, released integer, restored boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    current admission_policy;
    defined boolean;
    n integer;
BEGIN
    SELECT * INTO current FROM admission_policy p WHERE p.target = p_target FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no admission policy for %', quote_literal(p_target)
            USING ERRCODE = 'CVN03', HINT = 'see `conveyor policies list`';
    END IF;
    defined := EXISTS (SELECT 1 FROM action a
                       WHERE a.ref = p_target AND jsonb_typeof(a.metadata -> 'policy') = 'object');
    IF current.source = 'metadata' AND defined THEN
        RAISE EXCEPTION 'the policy for % comes from the action''s definition (policy=...): change the '
                        'definition, or override it with `conveyor policies set % --concurrency N`',
                        p_target, p_target
            USING ERRCODE = 'CVC02';
    END IF;
    SELECT count(*) INTO n FROM execution_admission_queue q WHERE q.policy = p_target;
    DELETE FROM admission_policy p WHERE p.target = p_target;
    IF defined THEN
        -- Assigning metadata fires admission_policy_from_metadata, which re-inserts it.
        UPDATE action a SET metadata = a.metadata WHERE a.ref = p_target;
    END IF;
    RETURN QUERY SELECT current.target, current.source, n, defined;
END
$$;

-- A dead-lettered message published again to where it was going (conveyor dead-letters
-- replay): through the outbox on RabbitMQ; on PostgreSQL the "message" is the row, so
-- replaying rings whoever reads it. Returns the transport it went through.
CREATE FUNCTION replay_message(p_routing_key text, p_message_type text, p_payload jsonb) RETURNS text
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    route text;
BEGIN
    SELECT coalesce(r.transport, 'postgres') INTO route FROM transport_route r;
    IF route = 'rabbitmq' THEN
        INSERT INTO outbox (exchange, routing_key, message_type, payload)
        VALUES ('executions', p_routing_key, p_message_type, p_payload);
    ELSIF p_routing_key LIKE 'execution.scheduled.worker.%' THEN
        PERFORM wake('worker', '{}', ARRAY[substr(p_routing_key, length('execution.scheduled.worker.') + 1)::bigint]);
    ELSIF p_routing_key = 'execution.completed' THEN
        PERFORM wake('completed', ARRAY(SELECT jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(p_payload -> 'execution_ids') = 'array' THEN p_payload -> 'execution_ids'
                 ELSE '[]' END)::bigint));
    ELSIF p_routing_key = 'worker.capacity' THEN
        PERFORM wake('capacity');
    ELSE
        PERFORM wake('requested');
    END IF;
    RETURN route;
END
$$;

-- The admission triggers wake through wake() too (0006/0007 NOTIFYed by hand; a refusal's
-- completed wake-up now comes from the UPDATE that cancels it). Bodies otherwise unchanged.

CREATE OR REPLACE FUNCTION admission_on_request() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    seq_no bigint;
    held integer;
    enqueued jsonb := '[]';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM admission_policy) THEN
        RETURN NULL;
    END IF;
    -- Group locks first, in key order (see execution_admission_group).
    FOR r IN SELECT DISTINCT p.target AS policy, admission_group_key(p.parameters, i.parameters) AS group_key
             FROM inserted i CROSS JOIN LATERAL admission_policy_for(i.action_ref) p
             ORDER BY 1, 2 LOOP
        PERFORM admission_lock(r.policy, r.group_key);
    END LOOP;
    FOR r IN SELECT i.id, p.target AS policy, p.method, p.concurrency, p.parameters,
                    admission_group_key(p.parameters, i.parameters) AS group_key
             FROM inserted i CROSS JOIN LATERAL admission_policy_for(i.action_ref) p
             ORDER BY i.id LOOP
        UPDATE execution_admission_group SET next_seq = next_seq + 1
        WHERE policy = r.policy AND group_key = r.group_key
        RETURNING next_seq INTO seq_no;
        IF r.method = 'enqueue' THEN
            INSERT INTO execution_admission_queue (execution, policy, group_key, seq)
            VALUES (r.id, r.policy, r.group_key, seq_no);
            enqueued := enqueued || jsonb_build_array(jsonb_build_array(r.policy, r.group_key));
        ELSE
            SELECT count(*) INTO held FROM execution_admission_slot
            WHERE policy = r.policy AND group_key = r.group_key;
            IF held < r.concurrency THEN
                INSERT INTO execution_admission_slot (execution, policy, group_key, seq)
                VALUES (r.id, r.policy, r.group_key, seq_no);
            ELSE
                UPDATE execution SET status = 'cancelled', ended = now(),
                    result = jsonb_build_object(
                        'succeeded', false, 'cancelled_by', 'admission', 'policy', r.policy,
                        'error', format('concurrency limit reached: policy %s allows %s at once%s',
                                        r.policy, r.concurrency,
                                        CASE WHEN cardinality(r.parameters) > 0
                                             THEN ' per ' || r.group_key::text ELSE '' END))
                WHERE id = r.id;
            END IF;
        END IF;
    END LOOP;
    FOR r IN SELECT DISTINCT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(enqueued) ORDER BY 1, 2 LOOP
        PERFORM admission_promote(r.policy, r.group_key);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION admission_on_change() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ended_ids bigint[];
    g record;
    freed jsonb;
    admitted integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM execution_admission_slot)
       AND NOT EXISTS (SELECT 1 FROM execution_admission_queue) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(a.id) INTO ended_ids
    FROM after_rows a JOIN before_rows b USING (id)
    WHERE a.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
      AND b.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned');
    IF ended_ids IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT DISTINCT policy, group_key FROM (
                 SELECT policy, group_key FROM execution_admission_slot WHERE execution = ANY(ended_ids)
                 UNION ALL
                 SELECT policy, group_key FROM execution_admission_queue WHERE execution = ANY(ended_ids)
             ) held ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
    END LOOP;
    DELETE FROM execution_admission_queue WHERE execution = ANY(ended_ids);
    WITH gone AS (
        DELETE FROM execution_admission_slot WHERE execution = ANY(ended_ids)
        RETURNING policy, group_key
    )
    SELECT jsonb_agg(DISTINCT jsonb_build_array(policy, group_key)) INTO freed FROM gone;
    IF freed IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(freed) ORDER BY 1, 2 LOOP
        PERFORM admission_lock(g.policy, g.group_key);  -- held already (above): no wait
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION admission_policy_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    g record;
    admitted integer := 0;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM wake('requested');
        RETURN NULL;
    END IF;
    FOR g IN SELECT policy, group_key FROM execution_admission_group
             WHERE policy = NEW.target ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;
