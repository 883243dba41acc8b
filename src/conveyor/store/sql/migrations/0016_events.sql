-- Events, triggers, rules and enforcements (issue #13): the tables every door writes to.
-- An event is an immutable row; it waits in event_pending until the executors have
-- evaluated the rules on its trigger; each (rule, event) pair makes at most one
-- enforcement (uq_enforcement_rule_event, as the seeds' phase 4 says) and each
-- enforcement at most one top-level execution (uq_execution_enforcement). The rule
-- evaluation, its SQL function and the surfaces are in the migrations after this one.

-- A trigger is a named source of events. Its type says who emits them: 'webhook' (POST
-- /api/v1/webhooks/{name}), 'cron', 'interval' and 'date' (a schedule), or 'custom'
-- (emit_event from the API, the SDK, SQL or the CLI). payload_schema (JSON Schema) is
-- checked on every event; NULL accepts any JSON.
CREATE TABLE trigger (
    name text PRIMARY KEY
        CHECK (length(name) <= 255 AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'),
    type text NOT NULL CHECK (type IN ('webhook', 'cron', 'interval', 'date', 'custom')),
    payload_schema jsonb CHECK (payload_schema IS NULL OR jsonb_typeof(payload_schema) = 'object'),
    description text,
    created timestamptz NOT NULL DEFAULT now(),
    updated timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE event (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger text NOT NULL REFERENCES trigger (name),
    payload jsonb NOT NULL DEFAULT '{}',
    -- Who emitted it: 'sql', 'api', 'sdk', 'cli', 'webhook', 'schedule', 'replay'.
    source text NOT NULL DEFAULT 'sql' CHECK (length(source) <= 255),
    received timestamptz NOT NULL DEFAULT now(),
    -- The sender's key (a webhook's Idempotency-Key or X-GitHub-Delivery, an SDK caller's):
    -- a retry with the same key is the same event.
    idempotency_key text CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 255),
    -- A replay is a new event (so its rules are evaluated again: new enforcements), naming
    -- the event it replays.
    replay_of bigint REFERENCES event (id) ON DELETE SET NULL
);
CREATE UNIQUE INDEX uq_event_trigger_idempotency_key ON event (trigger, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX event_trigger_received_idx ON event (trigger, received);
CREATE INDEX event_received_idx ON event (received);
CREATE INDEX event_replay_of_idx ON event (replay_of) WHERE replay_of IS NOT NULL;

-- Immutable: what was received is what the rules saw. (Deleting, for retention, is allowed;
-- the replay_of link is then cleared by its foreign key, the one update let through.)
CREATE FUNCTION event_immutable() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.trigger IS DISTINCT FROM OLD.trigger
       OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.source IS DISTINCT FROM OLD.source
       OR NEW.received IS DISTINCT FROM OLD.received
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR (NEW.replay_of IS NOT NULL AND NEW.replay_of IS DISTINCT FROM OLD.replay_of) THEN
        RAISE EXCEPTION 'event % is immutable', OLD.id USING ERRCODE = 'CVC05';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER event_immutable BEFORE UPDATE ON event FOR EACH ROW EXECUTE FUNCTION event_immutable();

-- Events whose rules have not been evaluated yet: the executors' work queue (FOR UPDATE
-- SKIP LOCKED). The row is deleted in the transaction that writes the enforcements.
CREATE TABLE event_pending (
    event bigint PRIMARY KEY REFERENCES event (id) ON DELETE CASCADE,
    since timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION event_pending_wake() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM wake('event');
    RETURN NULL;
END
$$;
CREATE TRIGGER event_pending_wake AFTER INSERT ON event_pending
    FOR EACH STATEMENT EXECUTE FUNCTION event_pending_wake();

-- A rule: when an event of `trigger` meets `criteria`, request `action_ref` (an action or
-- a workflow) with `parameters` rendered from the event. `definition` keeps what was
-- registered (YAML as JSON) for `rules get`.
CREATE TABLE rule (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ref text NOT NULL UNIQUE
        CHECK (length(ref) <= 255 AND ref ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'),
    trigger text NOT NULL REFERENCES trigger (name),
    criteria jsonb NOT NULL DEFAULT '{}',
    action_ref text NOT NULL,
    parameters jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(parameters) = 'object'),
    enabled boolean NOT NULL DEFAULT true,
    description text,
    definition jsonb,
    created timestamptz NOT NULL DEFAULT now(),
    updated timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rule_trigger_idx ON rule (trigger);

-- The decision for one (rule, event): requested (execution names what it requested),
-- template_error (the parameters did not render), request_error (the request was refused:
-- unknown action, invalid parameters), rule_disabled (the criteria matched a disabled rule).
CREATE TABLE enforcement (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule bigint REFERENCES rule (id) ON DELETE SET NULL,
    rule_ref text NOT NULL,  -- kept when the rule is deleted
    event bigint REFERENCES event (id) ON DELETE CASCADE,
    outcome text NOT NULL CHECK (outcome IN ('requested', 'template_error', 'request_error', 'rule_disabled')),
    execution bigint,
    parameters jsonb,
    error text,
    created timestamptz NOT NULL DEFAULT now(),
    CHECK ((outcome = 'requested') = (execution IS NOT NULL))
);
-- The seeds' phase 4: one event/rule pair produces at most one enforcement.
CREATE UNIQUE INDEX uq_enforcement_rule_event ON enforcement (rule, event) WHERE event IS NOT NULL;
CREATE INDEX enforcement_event_idx ON enforcement (event);
CREATE INDEX enforcement_created_idx ON enforcement (created);
CREATE INDEX enforcement_rule_created_idx ON enforcement (rule, created);

-- ... and an enforcement creates at most one top-level execution.
CREATE UNIQUE INDEX uq_execution_enforcement ON execution (enforcement)
    WHERE parent IS NULL AND enforcement IS NOT NULL;

-- request_execution(_once), restated from 0015 with the enforcement that requests it (the
-- one write path of rules and schedules: the unique index above is the backstop).
DROP FUNCTION request_execution(text, jsonb, bigint, text, timestamptz);
DROP FUNCTION request_execution_once(text, jsonb, bigint, text, timestamptz);

CREATE FUNCTION request_execution_once(action_ref text, parameters jsonb, parent bigint, idempotency_key text,
                                       not_before timestamptz DEFAULT NULL, enforcement bigint DEFAULT NULL,
                                       OUT execution_id bigint, OUT repeated boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    params jsonb := coalesce(request_execution_once.parameters, '{}');
    -- A time already past is no delay: NULL keeps such rows out of next_not_before's index.
    delay_until timestamptz := CASE WHEN request_execution_once.not_before > now()
                                    THEN request_execution_once.not_before END;
    action_schema jsonb;
    problems text[];
    earlier record;
    turns integer := 0;
BEGIN
    IF idempotency_key IS NOT NULL AND length(idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'an idempotency key must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        turns := turns + 1;
        IF turns > 3 THEN  -- a key that keeps appearing and vanishing (purged meanwhile): give up
            RAISE EXCEPTION 'idempotency key % is changing under this request; retry it', quote_literal(idempotency_key)
                USING ERRCODE = 'serialization_failure';
        END IF;
        IF idempotency_key IS NOT NULL THEN
            SELECT e.id, e.action_ref, e.parameters, e.parent INTO earlier
            FROM execution_idempotency k JOIN execution e ON e.id = k.execution
            WHERE k.key = idempotency_key;
            IF FOUND THEN
                IF earlier.action_ref IS DISTINCT FROM request_execution_once.action_ref
                   OR earlier.parameters IS DISTINCT FROM params
                   OR earlier.parent IS DISTINCT FROM request_execution_once.parent THEN
                    RAISE EXCEPTION 'idempotency key % was already used for another request (execution %)',
                        quote_literal(idempotency_key), earlier.id
                        USING ERRCODE = 'CVA03',
                              HINT = 'send a new key for a new request; a retry must repeat the request unchanged';
                END IF;
                execution_id := earlier.id;
                repeated := true;
                RETURN;
            END IF;
        END IF;
        IF problems IS NULL THEN  -- validated once, even when the loop comes round again
            SELECT a.parameters_schema INTO action_schema FROM action a
            WHERE a.ref = request_execution_once.action_ref;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown action %', quote_literal(request_execution_once.action_ref)
                    USING ERRCODE = 'CVA01', HINT = 'no worker has registered this action';
            END IF;
            problems := validate_parameters(action_schema, params);
            IF cardinality(problems) > 0 THEN
                RAISE EXCEPTION 'invalid parameters for %: %', request_execution_once.action_ref,
                    array_to_string(problems, '; ')
                    USING ERRCODE = 'CVA02';
            END IF;
        END IF;
        execution_id := nextval(pg_get_serial_sequence('execution', 'id'));
        IF idempotency_key IS NOT NULL THEN
            INSERT INTO execution_idempotency (key, execution) VALUES (idempotency_key, execution_id)
            ON CONFLICT (key) DO NOTHING;
        END IF;
        IF idempotency_key IS NULL OR FOUND THEN
            -- (The executors are woken by the insert trigger of 0009; they then wait for
            -- next_not_before.)
            INSERT INTO execution (id, action_ref, parameters, parent, not_before, enforcement)
            VALUES (execution_id, request_execution_once.action_ref, params, request_execution_once.parent,
                    delay_until, request_execution_once.enforcement);
            repeated := false;
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION request_execution(action_ref text, parameters jsonb DEFAULT '{}', parent bigint DEFAULT NULL,
                                  idempotency_key text DEFAULT NULL, not_before timestamptz DEFAULT NULL,
                                  enforcement bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT execution_id FROM request_execution_once($1, $2, $3, $4, $5, $6)
$$;

-- Triggers are registered (created or updated) by name; a trigger's type never changes.
-- Answers true when it was created, false when updated.
CREATE FUNCTION register_trigger(name text, type text DEFAULT 'custom', payload_schema jsonb DEFAULT NULL,
                                 description text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    was text;
BEGIN
    SELECT t.type INTO was FROM trigger t WHERE t.name = register_trigger.name FOR UPDATE;
    IF FOUND AND was <> register_trigger.type THEN
        RAISE EXCEPTION 'trigger % is a % trigger, not %', quote_literal(register_trigger.name), was,
            register_trigger.type
            USING ERRCODE = 'CVC05', HINT = 'a trigger keeps its type: delete it first, or use another name';
    END IF;
    INSERT INTO trigger AS t (name, type, payload_schema, description)
    VALUES (register_trigger.name, register_trigger.type, register_trigger.payload_schema,
            register_trigger.description)
    ON CONFLICT ON CONSTRAINT trigger_pkey DO UPDATE
        SET payload_schema = excluded.payload_schema, description = excluded.description, updated = now();
    RETURN was IS NULL;
END
$$;

-- Refused while rules (or webhooks, schedules) use it or events remember it.
CREATE FUNCTION delete_trigger(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM trigger t WHERE t.name = delete_trigger.name;
    RETURN FOUND;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'trigger % is still in use: by rules, webhooks, schedules or its events%',
        quote_literal(delete_trigger.name),
        coalesce(' (rules: ' || (SELECT string_agg(r.ref, ', ' ORDER BY r.ref) FROM rule r
                                 WHERE r.trigger = delete_trigger.name) || ')', '')
        USING ERRCODE = 'CVC05', HINT = 'delete what uses it first';
END
$$;

-- The one door for events: API, SDK (inside the caller's transaction), CLI, webhooks and
-- schedules all call it. The payload is checked against the trigger's schema (the subset
-- validate_parameters knows; the API and SDK check full JSON Schema first). A repeated
-- idempotency key answers the first event (repeated = true); the same key with another
-- payload is refused (CVE03), as for requests.
CREATE FUNCTION emit_event_once(trigger text, payload jsonb, source text DEFAULT 'sql',
                                idempotency_key text DEFAULT NULL,
                                OUT event_id bigint, OUT repeated boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    body jsonb := coalesce(emit_event_once.payload, '{}');
    schema jsonb;
    problems text[];
    earlier record;
    turns integer := 0;
BEGIN
    SELECT t.payload_schema INTO schema FROM trigger t WHERE t.name = emit_event_once.trigger;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(emit_event_once.trigger)
            USING ERRCODE = 'CVE01', HINT = 'register it first (conveyor triggers register)';
    END IF;
    IF schema IS NOT NULL THEN
        problems := validate_parameters(schema, body);
        IF cardinality(problems) > 0 THEN
            RAISE EXCEPTION 'invalid payload for trigger %: %', emit_event_once.trigger,
                replace(array_to_string(problems, '; '), 'parameters must', 'the payload must')
                USING ERRCODE = 'CVE02';
        END IF;
    END IF;
    LOOP
        turns := turns + 1;
        IF turns > 3 THEN
            RAISE EXCEPTION 'idempotency key % is changing under this event; retry it',
                quote_literal(idempotency_key) USING ERRCODE = 'serialization_failure';
        END IF;
        INSERT INTO event AS e (trigger, payload, source, idempotency_key)
        VALUES (emit_event_once.trigger, body, coalesce(emit_event_once.source, 'sql'),
                emit_event_once.idempotency_key)
        ON CONFLICT (trigger, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING e.id INTO event_id;
        IF FOUND THEN
            INSERT INTO event_pending (event) VALUES (event_id);
            repeated := false;
            RETURN;
        END IF;
        SELECT e.id, e.payload INTO earlier FROM event e
        WHERE e.trigger = emit_event_once.trigger AND e.idempotency_key = emit_event_once.idempotency_key;
        IF FOUND THEN
            IF earlier.payload IS DISTINCT FROM body THEN
                RAISE EXCEPTION 'idempotency key % was already used for another event (event %)',
                    quote_literal(idempotency_key), earlier.id
                    USING ERRCODE = 'CVE03',
                          HINT = 'a retry must repeat the event unchanged; send a new key for a new event';
            END IF;
            event_id := earlier.id;
            repeated := true;
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION emit_event(trigger text, payload jsonb DEFAULT '{}', source text DEFAULT 'sql',
                           idempotency_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT event_id FROM emit_event_once($1, $2, $3, $4)
$$;

-- Replays: new events with the original's trigger and payload, naming it (replay_of), so
-- the rules are evaluated again -- new enforcements, not duplicates of the first ones.
CREATE FUNCTION replay_event(event_id bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    replayed bigint;
BEGIN
    INSERT INTO event (trigger, payload, source, replay_of)
    SELECT e.trigger, e.payload, 'replay', e.id FROM event e WHERE e.id = replay_event.event_id
    RETURNING id INTO replayed;
    IF replayed IS NULL THEN
        RAISE EXCEPTION 'no event %', replay_event.event_id USING ERRCODE = 'CVN05';
    END IF;
    INSERT INTO event_pending (event) VALUES (replayed);
    RETURN replayed;
END
$$;

-- Every event of a trigger received in [since, until): one replay each, in order. Replays
-- themselves are not replayed again (they are copies of events in the window).
CREATE FUNCTION replay_events(trigger text, since timestamptz, until timestamptz DEFAULT now())
RETURNS TABLE (original bigint, replay bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM trigger t WHERE t.name = replay_events.trigger) THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(replay_events.trigger) USING ERRCODE = 'CVE01';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT e.id, e.trigger, e.payload FROM event e
        WHERE e.trigger = replay_events.trigger AND e.received >= since AND e.received < until
              AND e.replay_of IS NULL
        ORDER BY e.id
    ), made AS (
        INSERT INTO event (trigger, payload, source, replay_of)
        SELECT p.trigger, p.payload, 'replay', p.id FROM picked p ORDER BY p.id
        RETURNING id, replay_of
    ), queued AS (
        INSERT INTO event_pending (event) SELECT m.id FROM made m RETURNING event
    )
    SELECT m.replay_of, m.id FROM made m ORDER BY m.id;
END
$$;

-- wake(), restated from 0014 with two topics more:
--   event       events wait in event_pending for their rules: a NOTIFY on <schema>.event
--               (both transports: the executors hear it through their PostgreSQL listener).
--   schedule    a schedule was created or changed: a NOTIFY on <schema>.schedule, so the
--               executors recompute how long to sleep until the next slot.
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
    ELSIF topic = 'event' THEN
        -- (0016) Events wait for their rules (event_pending).
        PERFORM pg_notify(current_schema() || '.event', '');
    ELSIF topic = 'schedule' THEN
        -- (0016) A schedule was created or changed: its next fire time may be sooner.
        PERFORM pg_notify(current_schema() || '.schedule', '');
    ELSE
        RAISE EXCEPTION 'unknown wake-up topic %', topic;
    END IF;
END
$$;
