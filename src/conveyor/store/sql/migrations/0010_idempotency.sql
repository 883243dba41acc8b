-- Idempotency keys for requests. A client that retries a request whose answer it never got
-- (a timeout, a 503, a dropped connection) sends the same key again and gets the same
-- execution instead of a second one:
--   SELECT conveyor.request_execution('core.echo', '{"message": "hi"}', idempotency_key => 'order-42');
-- A key is global to the installation (use a UUID or a key of your own domain), kept at
-- least executor.idempotency_key_retention (24 h) after its first use, then purged by the
-- executors; a key reused for a different request (action, parameters or parent) is
-- refused with SQLSTATE CVA03 (the API's 409) rather than silently answered with an
-- execution the caller did not ask for.
CREATE TABLE execution_idempotency (
    key       text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    -- Deferred: the key is claimed (inserted) before its execution exists, so that of
    -- two concurrent requests with one key exactly one goes on to create the execution.
    execution bigint NOT NULL REFERENCES execution (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    created   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX execution_idempotency_created_idx ON execution_idempotency (created);
CREATE INDEX execution_idempotency_execution_idx ON execution_idempotency (execution);

-- The request itself, telling whether it was a repeat (the API answers 201 or 200).
-- Without a key: as before. With one: the execution of that key if it exists (checked to
-- be the same request), else the key is claimed with ON CONFLICT DO NOTHING, which waits
-- for a concurrent transaction holding the same key: if that one commits, its execution is
-- the answer; if it rolls back, this one claims the key. (Under REPEATABLE READ a key
-- committed after the caller's snapshot is a serialization failure: retry the transaction.)
CREATE FUNCTION request_execution_once(action_ref text, parameters jsonb, parent bigint, idempotency_key text,
                                       OUT execution_id bigint, OUT repeated boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    params jsonb := coalesce(request_execution_once.parameters, '{}');
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
            -- (The executors are woken by the insert trigger of 0009.)
            INSERT INTO execution (id, action_ref, parameters, parent)
            VALUES (execution_id, request_execution_once.action_ref, params, request_execution_once.parent);
            repeated := false;
            RETURN;
        END IF;
        -- A concurrent request with this key committed first: the next turn answers with
        -- its execution (a fresh snapshot per statement sees it).
    END LOOP;
END
$$;

-- The SQL API keeps its name and its calls (two or three arguments work as before); the
-- key is a fourth, optional one. Dropped and created rather than overloaded: two
-- functions with defaults would make the short calls ambiguous.
DROP FUNCTION request_execution(text, jsonb, bigint);
CREATE FUNCTION request_execution(action_ref text, parameters jsonb DEFAULT '{}', parent bigint DEFAULT NULL,
                                  idempotency_key text DEFAULT NULL) RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT execution_id FROM request_execution_once($1, $2, $3, $4)
$$;
