-- Events' doors (issue #13): what the SDK, REST API and CLI of triggers, events and
-- enforcements need beyond 0016 -- the batch request with delays.

-- request_executions (0009) with a not_before per row, for batches of delayed executions
-- (the SDK's request_executions(..., not_before=/delay=)). A time already past is no delay
-- (NULL, as request_execution_once stores it); the arrays must be of one length.
CREATE FUNCTION request_executions(refs text[], parameters jsonb[], not_before timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF cardinality(refs) <> cardinality(parameters) OR cardinality(refs) <> cardinality(not_before) THEN
        RAISE EXCEPTION 'request_executions: % refs, % parameters and % not_before times',
            cardinality(refs), cardinality(parameters), cardinality(not_before)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO execution (action_ref, parameters, not_before)
        SELECT r, coalesce(p, '{}'), CASE WHEN nb > now() THEN nb END
        FROM unnest(refs, parameters, not_before) AS u (r, p, nb)
        RETURNING id
    )
    SELECT i.id FROM inserted i ORDER BY i.id;
END
$$;
