-- Conveyor schema, version 1. Applied with search_path set to the target schema,
-- so every name below lands in that schema. Immutable once released: change the
-- schema with a new numbered file.

CREATE TABLE worker (
    id             bigserial PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    worker_role    text NOT NULL DEFAULT 'action'
                   CHECK (worker_role IN ('action', 'sensor', 'notifier')),
    status         text NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'draining', 'inactive')),
    runtimes       text[] NOT NULL DEFAULT '{}',
    -- Refs of the actions this worker has code for (Python actions need it; subprocess
    -- actions run on any worker that offers their runtime).
    actions        text[] NOT NULL DEFAULT '{}',
    capabilities   jsonb NOT NULL DEFAULT '{}',
    capacity       integer NOT NULL DEFAULT 10 CHECK (capacity > 0),
    host           text,
    pid            integer,
    version        text,
    last_heartbeat timestamptz,
    created        timestamptz NOT NULL DEFAULT now(),
    updated        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_status_heartbeat_idx ON worker (status, last_heartbeat);

CREATE TABLE action (
    ref               text PRIMARY KEY CHECK (ref ~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$'),
    pack              text NOT NULL,
    name              text NOT NULL,
    description       text NOT NULL DEFAULT '',
    runner_type       text NOT NULL CHECK (runner_type IN ('python', 'subprocess')),
    runtime           text NOT NULL,
    parameters_schema jsonb NOT NULL DEFAULT '{"type": "object"}',
    -- Runner settings (argv, shell, output format, timeouts): enough for any worker
    -- offering the runtime to run a subprocess action from this row alone.
    metadata          jsonb NOT NULL DEFAULT '{}',
    created           timestamptz NOT NULL DEFAULT now(),
    updated           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE execution (
    id          bigserial PRIMARY KEY,
    action_ref  text NOT NULL REFERENCES action (ref),
    parameters  jsonb NOT NULL DEFAULT '{}',
    status      text NOT NULL DEFAULT 'requested'
                CHECK (status IN ('requested', 'scheduling', 'scheduled', 'running', 'completed',
                                  'failed', 'canceling', 'cancelled', 'timeout', 'abandoned')),
    result      jsonb,
    -- SET NULL: the seeds' runbook deletes old inactive workers; history keeps the
    -- worker's name in execution_attempt.
    worker      bigint REFERENCES worker (id) ON DELETE SET NULL,
    executor    text,
    parent      bigint REFERENCES execution (id) ON DELETE SET NULL,
    enforcement bigint,
    attempt     integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    created     timestamptz NOT NULL DEFAULT now(),
    updated     timestamptz NOT NULL DEFAULT now(),
    scheduled   timestamptz,
    started     timestamptz,
    ended       timestamptz
);
CREATE INDEX execution_requested_idx ON execution (id) WHERE status = 'requested';
CREATE INDEX execution_on_worker_idx ON execution (worker, id)
    WHERE status IN ('scheduled', 'running', 'canceling');
CREATE INDEX execution_status_updated_idx ON execution (status, updated);
CREATE INDEX execution_created_idx ON execution (created);
CREATE INDEX execution_action_idx ON execution (action_ref, created);
CREATE INDEX execution_parent_idx ON execution (parent) WHERE parent IS NOT NULL;

-- One row per dispatch of an execution to a worker: the fencing token (execution,
-- attempt) and its history.
CREATE TABLE execution_attempt (
    execution   bigint NOT NULL REFERENCES execution (id) ON DELETE CASCADE,
    attempt     integer NOT NULL CHECK (attempt > 0),
    worker      bigint REFERENCES worker (id) ON DELETE SET NULL,
    worker_name text NOT NULL,
    scheduled   timestamptz NOT NULL DEFAULT now(),
    started     timestamptz,
    ended       timestamptz,
    outcome     text,
    error       text,
    PRIMARY KEY (execution, attempt)
);
CREATE INDEX execution_attempt_worker_idx ON execution_attempt (worker) WHERE worker IS NOT NULL;

-- The transition graph (same edges as conveyor.domain.status.TRANSITIONS).
CREATE TABLE execution_transition (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO execution_transition (from_status, to_status) VALUES
    ('requested', 'scheduling'), ('requested', 'cancelled'),
    ('scheduling', 'scheduled'), ('scheduling', 'requested'), ('scheduling', 'failed'),
    ('scheduling', 'cancelled'),
    ('scheduled', 'running'), ('scheduled', 'requested'), ('scheduled', 'failed'),
    ('scheduled', 'cancelled'),
    ('running', 'completed'), ('running', 'failed'), ('running', 'timeout'),
    ('running', 'canceling'), ('running', 'requested'), ('running', 'abandoned'),
    ('canceling', 'cancelled'), ('canceling', 'abandoned');

-- Every status change is checked against the graph, whatever issued it, and every
-- row change is stamped with the database clock.
CREATE FUNCTION execution_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'requested' THEN
            RAISE EXCEPTION 'an execution starts in requested, not %', NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.created := now();
    ELSIF NEW.status IS DISTINCT FROM OLD.status AND NOT EXISTS (
        SELECT 1 FROM execution_transition t
        WHERE t.from_status = OLD.status AND t.to_status = NEW.status
    ) THEN
        RAISE EXCEPTION 'illegal execution transition % -> % (execution %)', OLD.status, NEW.status, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER execution_guard BEFORE INSERT OR UPDATE ON execution
    FOR EACH ROW EXECUTE FUNCTION execution_guard();

CREATE FUNCTION touch_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER worker_touch BEFORE UPDATE ON worker FOR EACH ROW EXECUTE FUNCTION touch_updated();
CREATE TRIGGER action_touch BEFORE UPDATE ON action FOR EACH ROW EXECUTE FUNCTION touch_updated();

-- A subset of JSON Schema checked in SQL, so that request_execution() refuses bad
-- parameters inside the caller's transaction in any language. Covers type,
-- required, properties (one level), enum, additionalProperties=false,
-- minimum/maximum and minLength/maxLength. The executor validates again with a
-- full JSON Schema implementation before dispatch, failing the execution with
-- the validator's message, so nothing the subset misses runs.
CREATE FUNCTION json_type_matches(value jsonb, expected text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE expected
        WHEN 'integer' THEN jsonb_typeof(value) = 'number' AND value::text::numeric = trunc(value::text::numeric)
        WHEN 'number' THEN jsonb_typeof(value) = 'number'
        ELSE jsonb_typeof(value) = expected
    END
$$;

CREATE FUNCTION validate_parameters(schema jsonb, params jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    problems text[] := '{}';
    key text;
    prop jsonb;
    val jsonb;
    types jsonb;
BEGIN
    IF jsonb_typeof(params) <> 'object' THEN
        RETURN ARRAY['parameters must be a JSON object'];
    END IF;
    FOR key IN SELECT jsonb_array_elements_text(coalesce(schema -> 'required', '[]')) LOOP
        IF NOT params ? key THEN
            problems := problems || format('%s is required', key);
        END IF;
    END LOOP;
    FOR key, val IN SELECT * FROM jsonb_each(params) LOOP
        prop := schema -> 'properties' -> key;
        IF prop IS NULL THEN
            IF schema -> 'additionalProperties' = 'false'::jsonb THEN
                problems := problems || format('%s is not a parameter of this action', key);
            END IF;
            CONTINUE;
        END IF;
        types := CASE jsonb_typeof(prop -> 'type')
            WHEN 'string' THEN jsonb_build_array(prop -> 'type')
            WHEN 'array' THEN prop -> 'type'
            ELSE NULL END;
        IF types IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(types) t WHERE json_type_matches(val, t)
        ) THEN
            problems := problems || format('%s must be of type %s, got %s', key,
                array_to_string(ARRAY(SELECT jsonb_array_elements_text(types)), ' or '), val::text);
            CONTINUE;
        END IF;
        IF prop ? 'enum' AND NOT (prop -> 'enum') @> jsonb_build_array(val) THEN
            problems := problems || format('%s must be one of %s, got %s', key, prop ->> 'enum', val::text);
        END IF;
        IF jsonb_typeof(val) = 'number' THEN
            IF prop ? 'minimum' AND val::text::numeric < (prop ->> 'minimum')::numeric THEN
                problems := problems || format('%s must be >= %s, got %s', key, prop ->> 'minimum', val::text);
            END IF;
            IF prop ? 'maximum' AND val::text::numeric > (prop ->> 'maximum')::numeric THEN
                problems := problems || format('%s must be <= %s, got %s', key, prop ->> 'maximum', val::text);
            END IF;
        END IF;
        IF jsonb_typeof(val) = 'string' THEN
            IF prop ? 'minLength' AND length(val #>> '{}') < (prop ->> 'minLength')::int THEN
                problems := problems || format('%s must be at least %s characters', key, prop ->> 'minLength');
            END IF;
            IF prop ? 'maxLength' AND length(val #>> '{}') > (prop ->> 'maxLength')::int THEN
                problems := problems || format('%s must be at most %s characters', key, prop ->> 'maxLength');
            END IF;
        END IF;
    END LOOP;
    RETURN problems;
END
$$;

-- The SQL API: request an execution inside the caller's transaction. The
-- execution exists if and only if that transaction commits; the wake-up for the
-- executors is sent by the same commit.
CREATE FUNCTION request_execution(action_ref text, parameters jsonb DEFAULT '{}',
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
    PERFORM pg_notify(current_schema() || '.requested', '');
    RETURN new_id;
END
$$;
