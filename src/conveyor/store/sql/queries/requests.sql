-- name: request_many
-- Batch enqueue of executions already validated by the caller (the SDK validates
-- with full JSON Schema first): the SQL function of migration 0009.
SELECT id FROM request_executions(%(refs)s::text[], %(parameters)s::jsonb[]) AS id;
