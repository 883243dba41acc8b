-- name: request_many
-- Batch enqueue of executions already validated by the caller (the SDK validates
-- with full JSON Schema first); unknown actions fail on the foreign key.
WITH inserted AS (
    INSERT INTO execution (action_ref, parameters)
    SELECT * FROM unnest(%(refs)s::text[], %(parameters)s::jsonb[])
    RETURNING id
)
SELECT id FROM inserted ORDER BY id;
