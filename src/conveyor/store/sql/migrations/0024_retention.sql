-- History and retention (issue #14): the cost of an execution stays flat however much
-- finished history the tables hold, and the history does not grow forever.
--
-- Retention: purge_executions() is the one write path that deletes finished executions
-- (the executors' retention duty and `conveyor executions purge` both call it). It takes
-- at most `batch` top-level executions (parent IS NULL) in a finished status, whose last
-- change (`updated`: the end, for a finished row, which nothing changes afterwards) is
-- older than `older_than`, skipping rows another transaction holds, and deletes each with
-- its whole tree of workflow children -- never a child alone, so a workflow's history is
-- whole or gone. A tree is left alone (purge_blocked) while any of it is not finished,
-- while a dead letter about it is unresolved, or while an unfinished workflow still
-- refers to it (a rerun's copied dispatches and rerun_of). What refers to an execution
-- follows it: attempts, idempotency keys, inquiries and their responses, workflow state
-- (tasks, dispatches, events) by their ON DELETE CASCADE foreign keys; dead letters,
-- outbox rows and enforcements (no foreign key) explicitly here. Schedule slots keep the
-- id of the execution they fired (their own history; schedule_running() joins, so a
-- purged execution reads as not running, which it was not).

-- Deleting an execution probes these for referrers; without an index each probe scans.
CREATE INDEX enforcement_execution_idx ON enforcement (execution) WHERE execution IS NOT NULL;
CREATE INDEX workflow_execution_rerun_of_idx ON workflow_execution (rerun_of) WHERE rerun_of IS NOT NULL;

-- The finished statuses a purge may be given (NULL: all of them); anything else refused.
CREATE FUNCTION purge_statuses(statuses text[]) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    finished CONSTANT text[] := ARRAY['completed', 'failed', 'timeout', 'cancelled', 'abandoned'];
    bad text;
BEGIN
    IF statuses IS NULL THEN
        RETURN finished;
    END IF;
    SELECT string_agg(coalesce(s, 'NULL'), ', ') INTO bad FROM unnest(statuses) s WHERE s IS NULL OR s <> ALL(finished);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'only finished executions can be purged (completed, failed, timeout, cancelled, abandoned), not %', bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN statuses;
END
$$;

CREATE FUNCTION purge_cutoff(older_than interval) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must be a duration of zero or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN now() - older_than;
END
$$;

-- Whether the tree under a finished top-level execution must stay (see above).
CREATE FUNCTION purge_blocked(root bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    WITH RECURSIVE tree(id) AS (
        SELECT root
        UNION ALL
        SELECT c.id FROM execution c JOIN tree t ON c.parent = t.id
    )
    SELECT EXISTS (SELECT 1 FROM tree t JOIN execution e ON e.id = t.id
                   WHERE e.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned'))
        OR EXISTS (SELECT 1 FROM tree t JOIN dead_letter d ON d.execution = t.id WHERE d.resolution IS NULL)
        OR EXISTS (SELECT 1 FROM tree t
                   JOIN workflow_task_dispatch d ON d.execution = t.id
                   JOIN workflow_execution w ON w.id = d.workflow_execution
                   JOIN execution we ON we.id = w.execution
                   WHERE we.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned'))
        OR EXISTS (SELECT 1 FROM tree t
                   JOIN workflow_execution w ON w.execution = t.id
                   JOIN workflow_execution r ON r.rerun_of = w.id
                   JOIN execution re ON re.id = r.execution
                   WHERE re.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned'))
$$;

-- How many top-level executions a purge with these arguments would take (trees count as
-- one; blocked ones included): the CLI's --dry-run and its progress bar's total.
CREATE FUNCTION purgeable_executions(older_than interval, statuses text[] DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT count(*) FROM execution e
    WHERE e.status = ANY(purge_statuses(statuses)) AND e.updated < purge_cutoff(older_than) AND e.parent IS NULL
$$;

-- Delete at most `batch` finished top-level executions older than `older_than` (and their
-- trees, and what follows them); returns the number of executions deleted (children
-- included). 0 means nothing (more) is purgeable now.
CREATE FUNCTION purge_executions(older_than interval, statuses text[] DEFAULT NULL, batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    wanted text[] := purge_statuses(statuses);
    cutoff timestamptz := purge_cutoff(older_than);
    roots bigint[];
    doomed bigint[];
    n bigint;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be 1 or more, not %', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (status, updated) index: the oldest finished rows of each wanted status.
    SELECT array_agg(r.id) INTO roots FROM (
        SELECT e.id FROM execution e
        WHERE e.status = ANY(wanted) AND e.updated < cutoff AND e.parent IS NULL
          AND NOT purge_blocked(e.id)
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    ) r;
    IF roots IS NULL THEN
        RETURN 0;
    END IF;
    WITH RECURSIVE tree(id) AS (
        SELECT unnest(roots)
        UNION ALL
        SELECT c.id FROM execution c JOIN tree t ON c.parent = t.id
    )
    SELECT array_agg(id) INTO doomed FROM tree;
    DELETE FROM dead_letter WHERE execution = ANY(doomed);
    DELETE FROM outbox WHERE execution = ANY(doomed);
    DELETE FROM enforcement WHERE execution = ANY(doomed);
    DELETE FROM execution WHERE id = ANY(doomed);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
