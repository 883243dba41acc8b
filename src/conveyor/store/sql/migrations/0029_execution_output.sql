-- Live output (issue #15): what a running execution prints, stored in chunks while it runs,
-- so that `conveyor executions tail`, the API's output stream and the dashboard show it as
-- it comes, and a worker that dies leaves what it had sent.
--
-- A chunk is bytes as the action wrote them (a command's stdout or stderr, a Python action's
-- ctx.log() lines): the readers decide how to show them (UTF-8 text, or base64 for what is
-- not), so no byte an action produces can break the write or be stored as something else.
-- The worker cuts chunks on UTF-8 character boundaries where the stream is UTF-8. The same
-- caps bound them as the result's stdout and stderr: a stream's chunks hold at most the
-- bytes its result keeps. `id` orders an execution's chunks across its attempts and is the
-- cursor a reader resumes from (the SSE event id).
CREATE TABLE execution_output (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution bigint NOT NULL REFERENCES execution (id) ON DELETE CASCADE,
    attempt   integer NOT NULL,
    stream    text NOT NULL CHECK (stream IN ('stdout', 'stderr', 'log')),
    data      bytea NOT NULL CHECK (length(data) > 0),
    created   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX execution_output_execution_idx ON execution_output (execution, id);

-- append_output(worker, executions, attempts, streams, chunks): the worker's write of the
-- chunks its runs printed since its last flush, one statement for all of them. Fenced like
-- every write of a run, on (execution, worker, attempt) and a live status: a chunk from an
-- attempt that is no longer current (its worker was declared lost, the execution was
-- recovered and re-run) is dropped, not shown beside the new attempt's output. Returns the
-- executions written, and wakes their readers (NOTIFY <schema>.output, sent by the commit).
CREATE FUNCTION append_output(p_worker bigint, p_executions bigint[], p_attempts integer[], p_streams text[],
                              p_chunks bytea[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    written bigint[];
BEGIN
    WITH chunk AS (
        SELECT c.execution, c.attempt, c.stream, c.data, c.n
        FROM unnest(p_executions, p_attempts, p_streams, p_chunks) WITH ORDINALITY AS c (execution, attempt, stream, data, n)
    ), current_runs AS (
        -- One key probe per execution (a few per flush), share-locked so that the result
        -- write cannot move it on between the check and the insert.
        SELECT DISTINCT ON (c.execution, c.attempt) c.execution, c.attempt
        FROM chunk c JOIN LATERAL (
            SELECT 1 FROM execution e
            WHERE e.id = c.execution AND e.worker = p_worker AND e.attempt = c.attempt
              AND e.status IN ('running', 'canceling')
            FOR SHARE
        ) live ON true
    ), stored AS (
        INSERT INTO execution_output (execution, attempt, stream, data)
        SELECT c.execution, c.attempt, c.stream, c.data
        FROM chunk c JOIN current_runs r USING (execution, attempt)
        ORDER BY c.n
        RETURNING execution
    )
    SELECT array_agg(DISTINCT s.execution) INTO written FROM stored s;
    IF written IS NOT NULL THEN
        -- The ids, or '' (read everything you follow) when they would not fit a payload.
        PERFORM pg_notify(current_schema() || '.output',
                          CASE WHEN cardinality(written) <= 400 THEN array_to_string(written, ',') ELSE '' END);
    END IF;
    RETURN QUERY SELECT unnest(coalesce(written, '{}'));
END
$$;
