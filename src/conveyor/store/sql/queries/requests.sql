-- name: request_many
-- Batch enqueue of executions already validated by the caller (the SDK validates
-- with full JSON Schema first): the SQL function of migration 0009.
SELECT id FROM request_executions(%(refs)s::text[], %(parameters)s::jsonb[]) AS id;

-- name: request_execution
-- One request, from the SDK, the CLI and the API alike: the SQL function of migration
-- 0010 (idempotency key, repeated or not); a delay counts from the database's clock.
SELECT execution_id, repeated
FROM request_execution_once(%(ref)s, %(parameters)s, NULL, %(key)s,
                            coalesce(%(not_before)s::timestamptz, now() + %(delay)s::interval));

-- name: request_execution_batch
-- A batch's statement (migration 0023): the parameters as ONE JSON array (one document for
-- the server to parse: 6-8x cheaper than a jsonb[], see docs/performance.md), the ids in
-- request order; a not_before (or delay from now) holds every row until then.
SELECT id FROM (SELECT %(refs)b::text[] AS refs,
                       coalesce(%(not_before)s::timestamptz, now() + %(delay)s::interval) AS t) a,
     LATERAL request_execution_batch(a.refs, %(parameters)b::text::jsonb,
                                     CASE WHEN a.t IS NOT NULL THEN array_fill(a.t, ARRAY[cardinality(a.refs)]) END) AS id;

-- name: action_schemas
-- The parameter schemas of the actions a request names (the full JSON Schema check).
SELECT ref, parameters_schema FROM action WHERE ref = ANY(%(refs)s::text[]);

