-- compatible-from: 32
-- A cancel takes a workflow's rows in the order its advancement does (issue #25, point 2,
-- follow-up): the workflow's state row (workflow_execution) first, then its execution row.
-- An advancement holds the state row FOR UPDATE and, when it ends the workflow, then updates
-- its execution; cancel_execution and cancel_workflow locked the execution row first, then
-- met the state row (the 'cancel' event's foreign key), so a cancel racing the end of that
-- same workflow deadlocked, and PostgreSQL aborted one side after deadlock_timeout -- the
-- user's cancel, as often as not. The tree walk (cancel_descendants) had the same cycle
-- with a sub-workflow that started while it walked and whose first advancement ended it:
-- it moved the sub-workflow's execution, then waited for its state row.
-- Now each takes the state row KEY SHARE before the execution row: the cancel waits for an
-- advancement in flight (then reads what it did) and a later advancement waits for the
-- cancel. A residual cycle the order cannot exclude (a sub-workflow started by a
-- transaction that commits while the walk's update waits for its execution row) is retried
-- whole by the verb's callers (verbs.retried, database.verb_retries).
-- An expand migration: the same functions with the same signatures.

CREATE OR REPLACE FUNCTION cancel_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text, worker bigint)
LANGUAGE plpgsql SET search_path = conveyor AS $$
#variable_conflict use_column
BEGIN
    -- (0033) A workflow's state row before its execution row: the advancement's order.
    PERFORM 1 FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    -- NO KEY UPDATE: see 0008 (a promotion's key-share lock on this row).
    PERFORM 1 FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- >>> WORKFLOW BLOCK (migration 0013) >>>
    -- A started workflow (running, paused, canceling) is cancelled through its events,
    -- with the default policy (cancel_workflow takes another one).
    IF EXISTS (SELECT 1 FROM workflow_execution w JOIN execution e ON e.id = w.execution
               WHERE w.execution = p_id AND e.status IN ('running', 'paused', 'canceling')) THEN
        RETURN QUERY SELECT * FROM cancel_workflow(p_id, p_by, 'allow_finish');
        RETURN;
    END IF;
    -- <<< WORKFLOW BLOCK <<<
    RETURN QUERY
    WITH target AS (
        SELECT e.id, e.status, e.worker, e.attempt FROM execution e WHERE e.id = p_id
    ), moved AS (
        UPDATE execution e
        SET status = CASE WHEN target.status = 'running' THEN 'canceling' ELSE 'cancelled' END,
            ended = CASE WHEN target.status = 'running' THEN NULL ELSE now() END,
            not_before = NULL,
            cancelled_by = p_by,
            result = CASE WHEN target.status = 'running' THEN e.result
                          ELSE jsonb_build_object('succeeded', false, 'error', 'cancelled by ' || p_by,
                                                  'failed_by', 'api') END
        FROM target
        -- (0014) 'pending': an inquiry waiting for its answer is cancelled at once.
        WHERE e.id = target.id AND target.status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending')
        RETURNING e.id, e.status, e.worker, e.attempt, target.status AS was
    ), closed AS (
        UPDATE execution_attempt t SET ended = now(), outcome = 'cancelled', error = 'cancelled by ' || p_by
        FROM moved WHERE moved.was = 'scheduled' AND t.execution = moved.id AND t.attempt = moved.attempt
    )
    SELECT target.id, target.status,
           coalesce(moved.status, CASE WHEN target.status = 'canceling' THEN 'canceling' END),
           coalesce(moved.worker, target.worker)
    FROM target LEFT JOIN moved ON moved.id = target.id;
    -- == (0014) Inquiries: the inquiry of an execution cancelled while pending is
    -- cancelled with it, in this transaction (locks: execution, then inquiry, as
    -- respond_inquiry and expire_inquiries take them). ==
    UPDATE inquiry i SET status = 'cancelled', updated = now()
    FROM execution e
    WHERE i.execution = p_id AND i.status = 'pending' AND e.id = i.execution AND e.status = 'cancelled';
END
$$;

CREATE OR REPLACE FUNCTION cancel_workflow(p_id bigint, p_by text, p_policy text DEFAULT 'allow_finish')
RETURNS TABLE (id bigint, was text, now text, worker bigint)
LANGUAGE plpgsql SET search_path = conveyor AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    IF p_policy IS NULL OR p_policy NOT IN ('allow_finish', 'cancel_running') THEN
        RAISE EXCEPTION 'unknown cancel policy % (allow_finish or cancel_running)', quote_literal(p_policy)
            USING ERRCODE = 'CVA02';
    END IF;
    -- (0033) The state row before the execution row, as the advancement takes them; KEY
    -- SHARE waits for an advancement in flight (FOR UPDATE) and makes the next one wait.
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wf_id IS NULL OR current NOT IN ('running', 'paused', 'canceling') THEN
        RETURN QUERY SELECT * FROM cancel_execution(p_id, p_by);
        RETURN;
    END IF;
    IF current <> 'canceling' THEN
        UPDATE execution e SET status = 'canceling', cancelled_by = p_by WHERE e.id = p_id AND e.status = current;
    END IF;
    IF current <> 'canceling' OR p_policy = 'cancel_running' THEN
        INSERT INTO workflow_event (workflow_execution, kind, payload)
        VALUES (wf_id, 'cancel', jsonb_build_object('policy', p_policy, 'by', p_by));
        PERFORM cancel_descendants(p_id, p_policy);
    END IF;
    RETURN QUERY SELECT p_id, current, 'canceling'::text, NULL::bigint;
END
$$;

-- As in 0032, with one more rule of lock order: an execution of the tree is moved only once
-- this cancel holds the state rows of its workflow (if it is one) and of its parent workflow
-- (the caller holds the root's). A state row that the walk's update sees but its lock
-- statement did not (a sub-workflow started in between) is locked by the next round, and
-- only then is that execution moved: the cancel never holds an execution row while it waits
-- for the state row of the advancement that would update it.
CREATE OR REPLACE FUNCTION cancel_descendants(p_id bigint, p_policy text) RETURNS integer
LANGUAGE plpgsql SET search_path = conveyor AS $$
DECLARE
    known integer := 0;
    found bigint[];
    held bigint[] := '{}';
    canceling bigint[];
    cancelled bigint[];
    unlocked bigint;
    total integer := 0;
BEGIN
    LOOP
        WITH RECURSIVE tree AS (
            SELECT c.id, c.status FROM execution c WHERE c.parent = p_id
            UNION ALL
            SELECT c.id, c.status FROM tree t JOIN execution c ON c.parent = t.id
            WHERE t.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned')
        ), rows AS (
            SELECT w.id FROM workflow_execution w JOIN tree t ON w.execution = t.id
            ORDER BY w.id
            FOR KEY SHARE OF w
        )
        SELECT coalesce(array_agg(rows.id), '{}') INTO found FROM rows;
        -- Every state row locked so far (the locks stay until commit).
        SELECT coalesce(array_agg(DISTINCT h.id), '{}') INTO held FROM unnest(held || found) AS h(id);

        WITH RECURSIVE tree AS (
            SELECT c.id, c.status, w.id AS wid, NULL::bigint AS pwid
            FROM execution c LEFT JOIN workflow_execution w ON w.execution = c.id
            WHERE c.parent = p_id
            UNION ALL
            SELECT c.id, c.status, w.id, t.wid
            FROM tree t JOIN execution c ON c.parent = t.id LEFT JOIN workflow_execution w ON w.execution = c.id
            WHERE t.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned')
        ), locked AS (
            SELECT h.id FROM unnest(held) AS h(id)
        ), ready AS (
            SELECT t.id FROM tree t
            WHERE (t.wid IS NULL OR t.wid IN (SELECT locked.id FROM locked))
              AND (t.pwid IS NULL OR t.pwid IN (SELECT locked.id FROM locked))
        ), moved AS (
            -- Guarded on the row's own status (not the walk's): a row a scheduler or
            -- start_workflows changed meanwhile is re-read and judged as it is now.
            UPDATE execution e
            SET status = CASE WHEN e.status IN ('running', 'paused') THEN 'canceling' ELSE 'cancelled' END,
                ended = CASE WHEN e.status IN ('running', 'paused') THEN NULL ELSE now() END,
                not_before = NULL,
                cancelled_by = 'workflow execution ' || e.parent,
                result = CASE WHEN e.status IN ('running', 'paused') THEN e.result
                              ELSE jsonb_build_object('succeeded', false,
                                                      'error', 'cancelled by workflow execution ' || e.parent,
                                                      'failed_by', 'api') END
            FROM ready
            WHERE e.id = ready.id
              AND (e.status IN ('requested', 'scheduling', 'scheduled', 'pending')
                   OR (e.status IN ('running', 'paused')
                       AND (p_policy = 'cancel_running'
                            OR EXISTS (SELECT 1 FROM action a
                                       WHERE a.ref = e.action_ref AND a.runner_type = 'workflow'))))
            RETURNING e.id, e.status
        )
        SELECT array_agg(moved.id) FILTER (WHERE moved.status = 'canceling'),
               array_agg(moved.id) FILTER (WHERE moved.status = 'cancelled'),
               (SELECT count(*) FROM tree t WHERE t.wid IS NOT NULL AND t.wid NOT IN (SELECT locked.id FROM locked))
        INTO canceling, cancelled, unlocked FROM moved;

        IF cancelled IS NOT NULL THEN
            -- As cancel_execution: a dispatched attempt ends cancelled, a pending inquiry too.
            UPDATE execution_attempt t SET ended = now(), outcome = 'cancelled',
                error = 'cancelled by workflow execution ' || e.parent
            FROM unnest(cancelled) AS m(id) JOIN execution e ON e.id = m.id
            WHERE t.execution = e.id AND t.attempt = e.attempt AND t.ended IS NULL;
            UPDATE inquiry i SET status = 'cancelled', updated = now()
            FROM unnest(cancelled) AS m(id)
            WHERE i.execution = m.id AND i.status = 'pending';
        END IF;

        -- (Arrays are joined as sets, never probed with = ANY: a tree may hold 100,000 rows.)
        INSERT INTO workflow_event (workflow_execution, kind, payload)
        SELECT w.id, 'cancel', jsonb_build_object('policy', p_policy, 'by', 'workflow execution ' || e.parent)
        FROM workflow_execution w JOIN execution e ON e.id = w.execution
        WHERE w.execution IN (SELECT m.id FROM unnest(canceling) AS m(id))
           OR (p_policy = 'cancel_running' AND e.status = 'canceling' AND w.cancel_policy <> 'cancel_running'
               AND w.id IN (SELECT f.id FROM unnest(found) AS f(id))
               AND NOT EXISTS (SELECT 1 FROM workflow_event ev
                               WHERE ev.workflow_execution = w.id AND ev.kind = 'cancel'
                                 AND ev.payload ->> 'policy' = 'cancel_running'))
        ORDER BY w.id;

        total := total + coalesce(cardinality(canceling), 0) + coalesce(cardinality(cancelled), 0);
        -- The rows locked stay (KEY SHARE forbids their deletion): the same count is the same
        -- set. A state row seen but not yet locked makes another round (it is locked there).
        EXIT WHEN canceling IS NULL AND cancelled IS NULL AND coalesce(unlocked, 0) = 0
                  AND cardinality(found) = known;
        known := cardinality(found);
    END LOOP;
    RETURN total;
END
$$;
