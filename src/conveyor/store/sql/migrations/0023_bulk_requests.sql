-- Bulk requests (issue #14: request_executions of 100,000 executions in one call at
-- 50,000/s or more). Measured before this migration (2-core machine, shared): the SDK's
-- request_executions took 11.8 s for 100,000 rows, of which 7 s were the SDK's JSON Schema
-- check (a jsonschema validator built per row), 2.1 s the binding of a jsonb[] array of
-- 100,000 elements (its text form quotes every document; even the binary form costs
-- 2.4 s, one dumper call per element) and the rest the INSERT. And the batch function
-- did not check parameters at all: a caller of the SQL function could store a row the
-- SQL subset of JSON Schema refuses, which request_execution never lets through.
--
-- Here one function does the work for every form and every caller:
--   request_execution_batch(refs text[], parameters jsonb, not_before timestamptz[])
-- takes the parameters as ONE jsonb array (the SDK encodes the whole batch with one
-- json.dumps; the server parses one document -- measured 6-8x cheaper than a jsonb[] of
-- 100,000 elements, and 3-4x cheaper than COPY into a staging table, which pays a Python
-- dumper call per value), checks every row set-based, and inserts all of
-- them in one INSERT ... SELECT, so the statement triggers (admission, the 'requested'
-- wake) run once for the batch, as before. request_executions (0009, 0020) are now thin
-- SQL wrappers over it: one write path.
--
-- The per-row check is parameters_refused: the rows for which validate_parameters would
-- find a problem, exactly (a property test compares the two on generated schemas and
-- documents), found in one scan of the batch -- validate_parameters itself, a plpgsql loop
-- per key, cost 45-65 us a row, and a SQL function with sub-selects is not inlined by the
-- planner, so a per-row function call costs about as much. Facts about each schema are
-- computed once per action and batch (a large schema is stored compressed; each -> on it
-- per row would decompress it again), and a refused row is only then given to
-- validate_parameters, for its
-- messages: the first refused row (in request order) raises CVA02 naming its action and
-- its position, and nothing is stored.

-- A declared property's value against its facts (see property_facts): the checks
-- validate_parameters makes per key (type, enum, minimum/maximum for numbers,
-- minLength/maxLength for strings), TRUE when none finds a problem. One CASE, no
-- sub-select, no SET clause: the planner inlines it. STABLE, not IMMUTABLE, because
-- jsonb_build_array is (an IMMUTABLE function whose body is not is never inlined).
CREATE FUNCTION property_ok(types text[], enum jsonb, minimum text, maximum text,
                            min_length text, max_length text, val jsonb) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN types IS NOT NULL AND NOT (
                jsonb_typeof(val) = ANY (types)
                OR ('integer' = ANY (types) AND jsonb_typeof(val) = 'number'
                    AND val::text::numeric = trunc(val::text::numeric)))
            THEN false
        WHEN enum IS NOT NULL AND NOT enum @> jsonb_build_array(val) THEN false
        WHEN jsonb_typeof(val) = 'number' THEN
            NOT coalesce(val::text::numeric < minimum::numeric, false)
            AND NOT coalesce(val::text::numeric > maximum::numeric, false)
        WHEN jsonb_typeof(val) = 'string' THEN
            NOT coalesce(length(val #>> '{}') < min_length::int, false)
            AND NOT coalesce(length(val #>> '{}') > max_length::int, false)
        ELSE true
    END
$$;

-- What validate_parameters reads of each declared property (NULL: no such check).
CREATE TYPE property_fact AS (
    key text, types text[], enum jsonb, minimum text, maximum text, min_length text, max_length text
);

CREATE FUNCTION property_facts(schema jsonb) RETURNS SETOF property_fact
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT kv.key,
           CASE jsonb_typeof(kv.value -> 'type')
               WHEN 'string' THEN ARRAY[kv.value ->> 'type']
               WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(kv.value -> 'type'))
           END,
           CASE WHEN kv.value ? 'enum' THEN kv.value -> 'enum' END,
           CASE WHEN kv.value ? 'minimum' THEN kv.value ->> 'minimum' END,
           CASE WHEN kv.value ? 'maximum' THEN kv.value ->> 'maximum' END,
           CASE WHEN kv.value ? 'minLength' THEN kv.value ->> 'minLength' END,
           CASE WHEN kv.value ? 'maxLength' THEN kv.value ->> 'maxLength' END
    FROM jsonb_each(CASE WHEN jsonb_typeof(schema -> 'properties') = 'object'
                         THEN schema -> 'properties' ELSE '{}' END) kv
$$;

-- The rows of a batch (refs[i], the i-th element of parameters; JSON null is {}) whose
-- parameters validate_parameters would refuse, with their action's schema. Rows of an
-- unknown action are not among them (request_execution_batch refuses those first).
-- Per row, in one scan: not an object; a required key missing (one ?& operator); a key
-- not declared (the row minus the declared keys, one - operator) where additional
-- properties are not allowed and no patternProperties pattern matches it; a declared
-- key with a check (type, enum, bounds) whose value fails it -- only the properties that
-- have a check are visited, not every key of the row.
CREATE FUNCTION parameters_refused(refs text[], parameters jsonb)
RETURNS TABLE (i bigint, ref text, params jsonb, schema jsonb)
LANGUAGE sql STABLE SET search_path FROM CURRENT
-- The planner cannot tell how many rows a batch has; its guesses push the cost past
-- jit_above_cost, and compiling took 5.7 s of a 20,000-row batch's 9.9 s (measured).
SET jit = off AS $$
    WITH facts AS MATERIALIZED (
        SELECT a.ref, a.parameters_schema AS schema,
               ARRAY(SELECT jsonb_array_elements_text(coalesce(a.parameters_schema -> 'required', '[]')))
                   AS required,
               coalesce(a.parameters_schema -> 'additionalProperties' = 'false'::jsonb, false) AS closed,
               ARRAY(SELECT jsonb_object_keys(coalesce(a.parameters_schema -> 'patternProperties', '{}')))
                   AS patterns,
               ARRAY(SELECT p.key FROM property_facts(a.parameters_schema) p) AS declared,
               ARRAY(SELECT p FROM property_facts(a.parameters_schema) p
                     WHERE num_nonnulls(p.types, p.enum, p.minimum, p.maximum, p.min_length, p.max_length) > 0)
                   AS checked
        FROM action a
        WHERE a.ref IN (SELECT DISTINCT r FROM unnest(refs) r)
    )
    SELECT u.i, u.r, u.p, f.schema
    FROM (SELECT u.i, u.r, coalesce(nullif(u.p, 'null'::jsonb), '{}'::jsonb) AS p
          FROM ROWS FROM (unnest(refs), jsonb_array_elements(parameters)) WITH ORDINALITY AS u (r, p, i)) u
    JOIN facts f ON f.ref = u.r
    WHERE CASE
        WHEN jsonb_typeof(u.p) <> 'object' THEN true
        WHEN NOT u.p ?& f.required THEN true
        WHEN f.closed AND (u.p - f.declared) <> '{}'::jsonb AND EXISTS (
                SELECT 1 FROM jsonb_object_keys(u.p - f.declared) k
                WHERE NOT EXISTS (SELECT 1 FROM unnest(f.patterns) pat WHERE k ~ pat))
            THEN true
        WHEN cardinality(f.checked) > 0 THEN EXISTS (
                SELECT 1 FROM unnest(f.checked) c
                WHERE u.p ? c.key
                  AND NOT property_ok(c.types, c.enum, c.minimum, c.maximum, c.min_length, c.max_length,
                                      u.p -> c.key))
        ELSE false
    END
$$;

-- The batch request: refs[i] with the i-th element of the jsonb array parameters (a JSON
-- null is {}), held until not_before[i] when given and still ahead (a time already past,
-- or NULL, is no delay). Returns the new ids in request order (ids are drawn in that
-- order). Refusals: CVA01 for an unknown action, CVA02 for the first row whose
-- parameters fail the SQL subset of JSON Schema; either way nothing is stored.
CREATE FUNCTION request_execution_batch(refs text[], parameters jsonb, not_before timestamptz[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path FROM CURRENT SET jit = off AS $$  -- jit: see parameters_refused
DECLARE
    n integer := coalesce(cardinality(refs), 0);
    bad record;
BEGIN
    IF jsonb_typeof(parameters) IS DISTINCT FROM 'array' OR jsonb_array_length(parameters) <> n
       OR (not_before IS NOT NULL AND cardinality(not_before) <> n) THEN
        RAISE EXCEPTION 'request_execution_batch: % refs, % parameters and % not_before times',
            n, CASE WHEN jsonb_typeof(parameters) = 'array' THEN jsonb_array_length(parameters) END,
            cardinality(not_before)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    -- The first unknown action, in request order (each distinct ref looked up once).
    SELECT u.r, u.i INTO bad
    FROM (SELECT r, min(i) AS i FROM unnest(refs) WITH ORDINALITY AS u (r, i) GROUP BY r) u
    WHERE NOT EXISTS (SELECT 1 FROM action a WHERE a.ref = u.r)
    ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown action %', quote_literal(bad.r)
            USING ERRCODE = 'CVA01', HINT = 'no worker has registered this action',
                  DETAIL = format('request %s of %s', bad.i, n);
    END IF;
    -- The first refused row, in request order, with validate_parameters' words.
    SELECT r.i, r.ref, validate_parameters(r.schema, r.params) AS problems INTO bad
    FROM parameters_refused(refs, parameters) r ORDER BY r.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid parameters for %: request % of %: %', bad.ref, bad.i, n,
            -- (empty only if the two checks disagreed, which the property test rules out:
            -- a row one of them refuses is not stored)
            coalesce(nullif(array_to_string(bad.problems, '; '), ''), 'refused by the batch check')
            USING ERRCODE = 'CVA02';
    END IF;
    -- One INSERT for all rows (the statement triggers -- admission, the 'requested' wake
    -- -- run once), in request order so the ids are drawn in that order.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO execution (action_ref, parameters, not_before)
        SELECT u.r, coalesce(nullif(u.p, 'null'::jsonb), '{}'::jsonb), CASE WHEN u.nb > now() THEN u.nb END
        FROM ROWS FROM (unnest(refs), jsonb_array_elements(parameters), unnest(not_before))
             WITH ORDINALITY AS u (r, p, nb, i)
        ORDER BY u.i
        RETURNING id
    )
    SELECT ins.id FROM inserted ins ORDER BY ins.id;
END
$$;

-- The array forms of 0009 and 0020, kept for SQL callers: wrappers over the one above.
CREATE OR REPLACE FUNCTION request_executions(refs text[], parameters jsonb[]) RETURNS SETOF bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT request_execution_batch(refs, coalesce(to_jsonb(parameters), '[]'), NULL)
$$;

CREATE OR REPLACE FUNCTION request_executions(refs text[], parameters jsonb[], not_before timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF cardinality(refs) <> cardinality(parameters) OR cardinality(refs) <> cardinality(not_before) THEN
        RAISE EXCEPTION 'request_executions: % refs, % parameters and % not_before times',
            cardinality(refs), cardinality(parameters), cardinality(not_before)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY SELECT request_execution_batch(refs, coalesce(to_jsonb(parameters), '[]'), not_before);
END
$$;
