-- Cancelling becomes one call. It must lock the row in a statement of its own and change
-- it in the next: an UPDATE's CTEs see only their statement's snapshot, so a cancel that
-- waited on a dispatch re-read the row as scheduled but could not see the attempt that
-- dispatch created, and left it open. As two named queries (lock, then cancel) every
-- caller had to remember the first; inside a function (each statement with a snapshot of
-- its own) none can forget it, and SQL callers get it too:
--   SELECT * FROM conveyor.cancel_execution(42, 'me');
-- Not started yet -> cancelled at once (a scheduled attempt is closed); running ->
-- canceling, finished as cancelled by its worker (or by recovery if the worker is gone);
-- canceling -> the same answer again, nothing changed; anything else -> left as it is,
-- reported with now = NULL. No row: no such execution.
CREATE FUNCTION cancel_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text, worker bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    -- NO KEY UPDATE, like the UPDATE that follows: a promotion admitting this execution
    -- takes a key-share lock on it (the slot's foreign key) while holding its group's
    -- lock, which this cancel's release then waits for; FOR UPDATE would deadlock with it.
    PERFORM 1 FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH target AS (
        SELECT e.id, e.status, e.worker, e.attempt FROM execution e WHERE e.id = p_id
    ), moved AS (
        UPDATE execution e
        SET status = CASE WHEN target.status = 'running' THEN 'canceling' ELSE 'cancelled' END,
            ended = CASE WHEN target.status = 'running' THEN NULL ELSE now() END,
            not_before = NULL,
            result = CASE WHEN target.status = 'running' THEN e.result
                          ELSE jsonb_build_object('succeeded', false, 'error', 'cancelled by ' || p_by,
                                                  'failed_by', 'api') END
        FROM target
        WHERE e.id = target.id AND target.status IN ('requested', 'scheduling', 'scheduled', 'running')
        RETURNING e.id, e.status, e.worker, e.attempt, target.status AS was
    ), closed AS (
        UPDATE execution_attempt t SET ended = now(), outcome = 'cancelled', error = 'cancelled by ' || p_by
        FROM moved WHERE moved.was = 'scheduled' AND t.execution = moved.id AND t.attempt = moved.attempt
    )
    SELECT target.id, target.status,
           coalesce(moved.status, CASE WHEN target.status = 'canceling' THEN 'canceling' END),
           coalesce(moved.worker, target.worker)
    FROM target LEFT JOIN moved ON moved.id = target.id;
END
$$;
