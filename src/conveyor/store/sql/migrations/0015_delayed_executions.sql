-- Delayed executions (issue #13): a request may say when it may run at the earliest.
-- The execution waits in 'requested' with execution.not_before set (the claim queries
-- already skip such rows, as for retries with a delay) and the executors wake at the
-- earliest not_before rather than at their next poll (next_not_before).
--   SELECT conveyor.request_execution('core.echo', '{}', not_before => now() + interval '30 seconds');
-- A time already past means "now". The idempotency check ignores not_before: a retried
-- `--in 30s` computes a different time and must still find its first execution.

DROP FUNCTION request_execution(text, jsonb, bigint, text);
DROP FUNCTION request_execution_once(text, jsonb, bigint, text);

-- As in 0010, plus not_before (optional: four-argument calls work as before).
CREATE FUNCTION request_execution_once(action_ref text, parameters jsonb, parent bigint, idempotency_key text,
                                       not_before timestamptz DEFAULT NULL,
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
            INSERT INTO execution (id, action_ref, parameters, parent, not_before)
            VALUES (execution_id, request_execution_once.action_ref, params, request_execution_once.parent,
                    delay_until);
            repeated := false;
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION request_execution(action_ref text, parameters jsonb DEFAULT '{}', parent bigint DEFAULT NULL,
                                  idempotency_key text DEFAULT NULL, not_before timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT execution_id FROM request_execution_once($1, $2, $3, $4, $5)
$$;

-- What the executors' scheduling loop asks when idle: how long until the earliest
-- delayed request (or retry) becomes claimable. Kept small: only waiting rows.
CREATE INDEX execution_not_before_idx ON execution (not_before)
    WHERE status = 'requested' AND not_before IS NOT NULL;
