-- compatible-from: 31
-- A workflow's cancel reaches its whole tree in the cancel's own transaction (issue #25,
-- point 2). Before, cancel_workflow only marked the workflow and queued its 'cancel'
-- event; its advancement then cancelled its direct children with the default policy
-- (cancel_execution -> allow_finish), one level per executor pass: sub-workflows kept
-- dispatching, and a self-recursive workflow cancelled with cancel_running grew from
-- 18,000 to 265,720 executions, its root 'canceling' for 21 minutes.
-- An expand migration: the same functions with the same signatures, and one new one;
-- the previous release's processes call them unchanged.

-- The descendants of a cancelled workflow execution, every depth, set-based (a recursive
-- walk of execution.parent, execution_parent_idx), in one call:
--   * not started (requested, scheduling, scheduled, an inquiry pending): cancelled now --
--     nothing new starts, whatever the policy;
--   * sub-workflows running or paused: canceling, with a 'cancel' event of the same policy
--     (their own advancement ends them once no child of theirs runs; the event makes it
--     drop anything it would have dispatched, even for events already pending);
--   * actions running: canceling (their worker stops them) under cancel_running; left to
--     finish under allow_finish;
--   * under cancel_running, sub-workflows already canceling get a cancel_running event
--     (a cancel that escalates an earlier allow_finish).
-- A walk does not go below an ended execution: an ended workflow has no running child
-- that its own end did not already cancel.
-- Races with the executors are closed by lock order, never by timing. First the state
-- rows of every workflow of the tree are locked (KEY SHARE, id order): an advancement in
-- flight holds its row FOR UPDATE, so this waits for it to commit, and any later one waits
-- for the cancel to commit (then it reads the 'cancel' event). Only then are the
-- executions moved, by a statement whose snapshot sees every child those advancements
-- made. A sub-workflow started meanwhile (start_workflows, not yet locked here) is moved by
-- that statement, and the walk repeats until a round moves nothing and finds no new
-- workflow: no child can be requested under the tree after the cancel commits.
-- Returns how many executions it moved.
CREATE FUNCTION cancel_descendants(p_id bigint, p_policy text) RETURNS integer
LANGUAGE plpgsql SET search_path = conveyor AS $$
DECLARE
    known integer := 0;
    found bigint[];
    canceling bigint[];
    cancelled bigint[];
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

        WITH RECURSIVE tree AS (
            SELECT c.id, c.status FROM execution c WHERE c.parent = p_id
            UNION ALL
            SELECT c.id, c.status FROM tree t JOIN execution c ON c.parent = t.id
            WHERE t.status NOT IN ('completed', 'failed', 'timeout', 'cancelled', 'abandoned')
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
            FROM tree
            WHERE e.id = tree.id
              AND (e.status IN ('requested', 'scheduling', 'scheduled', 'pending')
                   OR (e.status IN ('running', 'paused')
                       AND (p_policy = 'cancel_running'
                            OR EXISTS (SELECT 1 FROM action a
                                       WHERE a.ref = e.action_ref AND a.runner_type = 'workflow'))))
            RETURNING e.id, e.status
        )
        SELECT array_agg(moved.id) FILTER (WHERE moved.status = 'canceling'),
               array_agg(moved.id) FILTER (WHERE moved.status = 'cancelled')
        INTO canceling, cancelled FROM moved;

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
        -- The rows locked stay (KEY SHARE forbids their deletion): the same count is the same set.
        EXIT WHEN canceling IS NULL AND cancelled IS NULL AND cardinality(found) = known;
        known := cardinality(found);
    END LOOP;
    RETURN total;
END
$$;

-- As in 0013, but a cancel reaches the workflow's whole tree (cancel_descendants). An
-- already canceling workflow is walked again only when the cancel escalates to
-- cancel_running: an advancement's own cancels of its children (which come with the
-- default policy) then cost nothing.
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
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id;
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

-- The wake-up trigger of execution joins a statement's transition tables (after_rows,
-- before_rows), which have no statistics: planned as a nested loop, a statement moving n
-- executions cost n^2 comparisons -- 3.4 s of a 3,280-execution tree's cancel, 30 s at
-- 9,841 (measured). A hash join costs the same for the usual handful of rows.
ALTER FUNCTION execution_wake_changed() SET enable_nestloop = off;
