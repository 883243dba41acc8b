-- Events, triggers, rules and enforcements (issue #13): the tables every door writes to.
-- An event is an immutable row; it waits in event_pending until the executors have
-- evaluated the rules on its trigger; each (rule, event) pair makes at most one
-- enforcement (uq_enforcement_rule_event, as the seeds' phase 4 says) and each
-- enforcement at most one top-level execution (uq_execution_enforcement). Webhooks and
-- schedules (one schedule_slot row per slot) are here too: the tables every door writes
-- to. How rules are evaluated, webhooks registered and slots fired: the migrations after.

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

-- Rules are registered by ref (created or updated; the Python callers validate the
-- criteria and templates first and list every problem). Deleting a rule keeps its
-- enforcements (rule_ref); disabling it records 'rule_disabled' where it would have fired.
CREATE FUNCTION register_rule(ref text, trigger text, criteria jsonb, action_ref text, parameters jsonb,
                              enabled boolean DEFAULT true, description text DEFAULT NULL,
                              definition jsonb DEFAULT NULL, OUT rule_id bigint, OUT created boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF NOT EXISTS (SELECT 1 FROM trigger t WHERE t.name = register_rule.trigger) THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(register_rule.trigger)
            USING ERRCODE = 'CVE01', HINT = 'register it first (conveyor triggers register)';
    END IF;
    -- xmax = 0: the row was inserted, not updated by ON CONFLICT.
    INSERT INTO rule AS r (ref, trigger, criteria, action_ref, parameters, enabled, description, definition)
    VALUES (register_rule.ref, register_rule.trigger, coalesce(register_rule.criteria, '{}'),
            register_rule.action_ref, coalesce(register_rule.parameters, '{}'), coalesce(register_rule.enabled, true),
            register_rule.description, register_rule.definition)
    ON CONFLICT (ref) DO UPDATE
        SET trigger = excluded.trigger, criteria = excluded.criteria, action_ref = excluded.action_ref,
            parameters = excluded.parameters, enabled = excluded.enabled, description = excluded.description,
            definition = excluded.definition, updated = now()
    RETURNING r.id, (r.xmax = 0) INTO rule_id, created;
END
$$;

CREATE FUNCTION delete_rule(ref text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM rule r WHERE r.ref = delete_rule.ref;
    RETURN FOUND;
END
$$;

-- Answers the rule's new state; no row: no such rule.
CREATE FUNCTION set_rule_enabled(ref text, enabled boolean) RETURNS TABLE (rule_id bigint, was boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH old AS (SELECT r.id, r.enabled FROM rule r WHERE r.ref = set_rule_enabled.ref FOR UPDATE)
    UPDATE rule r SET enabled = set_rule_enabled.enabled, updated = now()
    FROM old WHERE r.id = old.id
    RETURNING r.id, old.enabled;
END
$$;

-- Webhooks: POST /api/v1/webhooks/{name} emits an event on `trigger` (a 'webhook'
-- trigger) once the request is authenticated: 'bearer' (token_hash: the SHA-256 hex of
-- the token, as api_token keeps them), 'hmac' (secret: the shared secret, kept in clear
-- because verifying a signature needs it; signature_header/signature_prefix: GitHub's
-- X-Hub-Signature-256 and 'sha256=' by default, any other header for other senders) or
-- 'none'. A sender's retry carries the same idempotency_header value: one event.
CREATE TABLE webhook (
    name text PRIMARY KEY CHECK (length(name) <= 255 AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'),
    trigger text NOT NULL UNIQUE REFERENCES trigger (name),
    auth text NOT NULL CHECK (auth IN ('none', 'bearer', 'hmac')),
    token_hash text,
    secret text,
    signature_header text NOT NULL DEFAULT 'X-Hub-Signature-256' CHECK (length(signature_header) BETWEEN 1 AND 255),
    signature_prefix text NOT NULL DEFAULT 'sha256=' CHECK (length(signature_prefix) <= 64),
    idempotency_header text NOT NULL DEFAULT 'Idempotency-Key' CHECK (length(idempotency_header) BETWEEN 1 AND 255),
    max_body_bytes integer NOT NULL DEFAULT 1048576 CHECK (max_body_bytes BETWEEN 1 AND 67108864),
    enabled boolean NOT NULL DEFAULT true,
    description text,
    created timestamptz NOT NULL DEFAULT now(),
    updated timestamptz NOT NULL DEFAULT now(),
    CHECK ((auth = 'bearer') = (token_hash IS NOT NULL)),
    CHECK ((auth = 'hmac') = (secret IS NOT NULL))
);

-- Schedules: each slot fires exactly once across all replicas -- one schedule_slot row per
-- (schedule, slot), written in the transaction that requests its execution (or emits its
-- event). kind 'cron' (cron: 5 or 6 fields, read in `timezone`), 'interval' (every,
-- anchored at `starts`) or 'date' (at: once). A slot requests `action_ref` with
-- `parameters`; a schedule without an action emits an event on its `trigger` (type = kind)
-- for rules instead. next_fire is the next slot not yet fired (NULL: none left), computed
-- from the database clock by the executors (croniter) whenever a slot fires or the
-- schedule changes. Catch-up after an outage: 'skip' (only slots still due), 'latest'
-- (the newest missed slot within catchup_window), 'all' (every missed slot within it);
-- older ones are recorded as 'missed'. Overlap with a previous run still going: 'allow',
-- 'skip', 'buffer_one' (at most one slot waits, then fires), 'cancel_previous'.
CREATE TABLE schedule (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (length(name) <= 255 AND name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'),
    kind text NOT NULL CHECK (kind IN ('cron', 'interval', 'date')),
    cron text CHECK (length(cron) <= 255),
    timezone text NOT NULL DEFAULT 'UTC' CHECK (length(timezone) <= 64),
    every interval,
    at timestamptz,
    starts timestamptz,
    ends timestamptz,
    action_ref text,
    parameters jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(parameters) = 'object'),
    trigger text REFERENCES trigger (name),
    catchup text NOT NULL DEFAULT 'latest' CHECK (catchup IN ('skip', 'latest', 'all')),
    catchup_window interval NOT NULL DEFAULT '1 hour' CHECK (catchup_window >= interval '0'),
    overlap text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one', 'cancel_previous')),
    paused boolean NOT NULL DEFAULT false,
    next_fire timestamptz,
    last_slot timestamptz,
    description text,
    created timestamptz NOT NULL DEFAULT now(),
    updated timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'cron') = (cron IS NOT NULL)),
    CHECK ((kind = 'interval') = (every IS NOT NULL)),
    CHECK (every IS NULL OR every >= interval '1 second'),
    CHECK ((kind = 'date') = (at IS NOT NULL)),
    CHECK (action_ref IS NOT NULL OR trigger IS NOT NULL)
);
CREATE INDEX schedule_next_fire_idx ON schedule (next_fire) WHERE NOT paused AND next_fire IS NOT NULL;

-- One row per slot: how it was fired (origin) and what came of it (outcome): 'requested'
-- (execution), 'emitted' (event), 'skipped' (overlap policy skip), 'missed' (outside the
-- catch-up window or policy), 'buffered' (waits for the previous run: buffer_one; becomes
-- 'requested' when it fires), 'request_error' (the request was refused; error says why).
-- fired - slot is the schedule's lag.
CREATE TABLE schedule_slot (
    schedule bigint NOT NULL REFERENCES schedule (id) ON DELETE CASCADE,
    slot timestamptz NOT NULL,
    origin text NOT NULL DEFAULT 'scheduled' CHECK (origin IN ('scheduled', 'catchup', 'manual', 'backfill')),
    outcome text NOT NULL CHECK (outcome IN ('requested', 'emitted', 'skipped', 'missed', 'buffered', 'request_error')),
    execution bigint,
    event bigint REFERENCES event (id) ON DELETE SET NULL,
    error text,
    fired timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, slot)
);
CREATE INDEX schedule_slot_fired_idx ON schedule_slot (fired);
CREATE INDEX schedule_slot_execution_idx ON schedule_slot (execution) WHERE execution IS NOT NULL;
CREATE INDEX schedule_slot_buffered_idx ON schedule_slot (schedule) WHERE outcome = 'buffered';

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
