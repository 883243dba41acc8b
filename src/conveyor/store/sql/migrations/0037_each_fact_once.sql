-- compatible-from: 36
-- Each fact once (issue #26). The terminal statuses of an execution, spelled out in every
-- function and query that asks "has it ended?", are one function here, terminal_statuses(),
-- the SQL twin of conveyor.domain.status.TERMINAL (a test asserts the two are equal). It is
-- a plain IMMUTABLE SQL function without SET: the planner inlines it and folds it to the
-- constant array, so `status = ANY(terminal_statuses())` plans exactly as the IN list did
-- (the (status, updated) index's ScalarArrayOp scans included). The order is the one
-- messages list them in. Likewise the statuses in which an execution is on its worker, and
-- a worker's load (read by the scheduler's live_workers and the workers' list alike).
-- The functions below are the previous definitions with only the list replaced: the same
-- signatures and answers, so the code of version 36 runs unchanged on this schema.

CREATE FUNCTION terminal_statuses() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['completed', 'failed', 'timeout', 'cancelled', 'abandoned']
$$;

-- The statuses in which an execution is on its worker (conveyor.domain.status.ON_WORKER):
-- placed there and not yet ended. The partial index execution_on_worker_idx keeps its own
-- literal predicate (an index's predicate cannot call a function); this folds to the same
-- array, so the planner still proves the index usable.
CREATE FUNCTION on_worker_statuses() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['scheduled', 'running', 'canceling']
$$;

-- A worker's load: the executions on it (prefetched or running). Its free capacity is
-- capacity + prefetch - load, computed in one place, conveyor.domain.placement.Candidate,
-- from the rows live_workers and list_workers read with this function.
CREATE FUNCTION worker_load(worker_id bigint) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = conveyor AS $$
    SELECT count(*)::int FROM execution e
    WHERE e.worker = worker_load.worker_id AND e.status = ANY(on_worker_statuses())
$$;

CREATE OR REPLACE FUNCTION admission_on_change() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    ended_ids bigint[];
    g record;
    freed jsonb;
    admitted integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM execution_admission_slot)
       AND NOT EXISTS (SELECT 1 FROM execution_admission_queue) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(a.id) INTO ended_ids
    FROM after_rows a JOIN before_rows b USING (id)
    WHERE a.status = ANY(terminal_statuses())
      AND b.status <> ALL(terminal_statuses());
    IF ended_ids IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT DISTINCT policy, group_key FROM (
                 SELECT policy, group_key FROM execution_admission_slot WHERE execution = ANY(ended_ids)
                 UNION ALL
                 SELECT policy, group_key FROM execution_admission_queue WHERE execution = ANY(ended_ids)
             ) held ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
    END LOOP;
    DELETE FROM execution_admission_queue WHERE execution = ANY(ended_ids);
    WITH gone AS (
        DELETE FROM execution_admission_slot WHERE execution = ANY(ended_ids)
        RETURNING policy, group_key
    )
    SELECT jsonb_agg(DISTINCT jsonb_build_array(policy, group_key)) INTO freed FROM gone;
    IF freed IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(freed) ORDER BY 1, 2 LOOP
        PERFORM admission_lock(g.policy, g.group_key);  -- held already (above): no wait
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION cancel_descendants(p_id bigint, p_policy text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
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
            WHERE t.status <> ALL(terminal_statuses())
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
            WHERE t.status <> ALL(terminal_statuses())
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

CREATE OR REPLACE FUNCTION execution_wake_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    SET enable_nestloop TO 'off'
    AS $$
DECLARE
    requested boolean;
    ended bigint[];
    freed bigint[];
    placed bigint[];
    placed_on bigint[];
    cancelling bigint[];
    cancelled_on bigint[];
BEGIN
    -- Half of all statements are claims (-> scheduling) and starts (-> running), which wake
    -- nobody: one pass over the new rows says so without the join below (this trigger is on
    -- the hot path; wake() removes duplicate workers, so the arrays are not made distinct).
    IF NOT EXISTS (SELECT 1 FROM after_rows a WHERE a.status NOT IN ('scheduling', 'running')) THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(bool_or(a.status = 'requested' AND b.status <> 'requested'), false),
           array_agg(a.id) FILTER (
               WHERE a.status = ANY(terminal_statuses())
                 AND b.status <> ALL(terminal_statuses())),
           array_agg(b.worker) FILTER (
               WHERE b.worker IS NOT NULL AND b.status = ANY(on_worker_statuses())
                 AND (a.status <> ALL(on_worker_statuses()) OR a.worker IS DISTINCT FROM b.worker)),
           array_agg(a.id) FILTER (
               WHERE a.status = 'scheduled' AND a.worker IS NOT NULL
                 AND (b.status <> 'scheduled' OR b.attempt <> a.attempt)),
           array_agg(a.worker) FILTER (
               WHERE a.status = 'scheduled' AND a.worker IS NOT NULL
                 AND (b.status <> 'scheduled' OR b.attempt <> a.attempt)),
           array_agg(a.id) FILTER (
               WHERE a.status = 'canceling' AND b.status <> 'canceling' AND a.worker IS NOT NULL),
           array_agg(a.worker) FILTER (
               WHERE a.status = 'canceling' AND b.status <> 'canceling' AND a.worker IS NOT NULL)
    INTO requested, ended, freed, placed, placed_on, cancelling, cancelled_on
    FROM after_rows a JOIN before_rows b USING (id);
    IF requested THEN
        PERFORM wake('requested');
    END IF;
    IF placed IS NOT NULL THEN
        PERFORM wake('dispatched', placed, placed_on);
    END IF;
    IF ended IS NOT NULL THEN
        PERFORM wake('completed', ended);
    END IF;
    IF freed IS NOT NULL THEN
        PERFORM wake('capacity', '{}', freed);
    END IF;
    IF cancelling IS NOT NULL THEN
        PERFORM wake('worker', cancelling, cancelled_on);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION expire_inquiries(p_limit integer DEFAULT 1000) RETURNS TABLE(inquiry bigint, execution bigint, outcome text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    d record;
    who text[];
    answers jsonb;
    fallback jsonb;
BEGIN
    FOR d IN SELECT i.id, i.execution, i.on_timeout, i.ttl, e.status AS execution_status
             FROM inquiry i JOIN execution e ON e.id = i.execution
             WHERE i.status = 'pending'
               AND (i.deadline <= now() OR e.status = ANY(terminal_statuses()))
             ORDER BY i.id
             LIMIT p_limit
             FOR NO KEY UPDATE OF e SKIP LOCKED
             FOR UPDATE OF i SKIP LOCKED LOOP
        IF d.execution_status <> 'pending' THEN
            UPDATE inquiry i SET status = 'cancelled', updated = now() WHERE i.id = d.id;
            RETURN QUERY SELECT d.id, d.execution, 'closed'::text;
        ELSIF d.on_timeout = '"fail"' THEN
            UPDATE inquiry i SET status = 'timeout', updated = now() WHERE i.id = d.id;
            UPDATE execution e
            SET status = 'timeout', ended = now(),
                result = jsonb_build_object(
                    'succeeded', false, 'failed_by', 'inquiry',
                    'error', format('inquiry %s was not answered within its ttl of %s s', d.id, d.ttl))
            WHERE e.id = d.execution AND e.status = 'pending';
            RETURN QUERY SELECT d.id, d.execution, 'timeout'::text;
        ELSE
            fallback := d.on_timeout -> 'default';
            INSERT INTO inquiry_response (inquiry, responder, role, data)
            VALUES (d.id, 'ttl', NULL, fallback)
            ON CONFLICT ON CONSTRAINT uq_inquiry_response_responder DO NOTHING;
            who := ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = d.id ORDER BY r.id);
            SELECT jsonb_agg(jsonb_build_object('responder', r.responder, 'data', r.data) ORDER BY r.id)
            INTO answers FROM inquiry_response r WHERE r.inquiry = d.id;
            UPDATE inquiry i SET status = 'responded', response = fallback, responded = now(), updated = now()
            WHERE i.id = d.id;
            UPDATE execution e
            SET status = 'completed', ended = now(),
                result = jsonb_build_object('succeeded', true, 'response', fallback, 'responders', to_jsonb(who),
                                            'responses', answers, 'timed_out', true)
            WHERE e.id = d.execution AND e.status = 'pending';
            RETURN QUERY SELECT d.id, d.execution, 'default'::text;
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION purge_blocked(root bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    WITH RECURSIVE tree(id) AS (
        SELECT root
        UNION ALL
        SELECT c.id FROM execution c JOIN tree t ON c.parent = t.id
    )
    SELECT EXISTS (SELECT 1 FROM tree t JOIN execution e ON e.id = t.id
                   WHERE e.status <> ALL(terminal_statuses()))
        OR EXISTS (SELECT 1 FROM tree t JOIN dead_letter d ON d.execution = t.id WHERE d.resolution IS NULL)
        OR EXISTS (SELECT 1 FROM tree t
                   JOIN workflow_task_dispatch d ON d.execution = t.id
                   JOIN workflow_execution w ON w.id = d.workflow_execution
                   JOIN execution we ON we.id = w.execution
                   WHERE we.status <> ALL(terminal_statuses()))
        OR EXISTS (SELECT 1 FROM tree t
                   JOIN workflow_execution w ON w.execution = t.id
                   JOIN workflow_execution r ON r.rerun_of = w.id
                   JOIN execution re ON re.id = r.execution
                   WHERE re.status <> ALL(terminal_statuses()))
$$;

CREATE OR REPLACE FUNCTION purge_statuses(statuses text[]) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    finished CONSTANT text[] := terminal_statuses();
    bad text;
BEGIN
    IF statuses IS NULL THEN
        RETURN finished;
    END IF;
    SELECT string_agg(coalesce(s, 'NULL'), ', ') INTO bad FROM unnest(statuses) s WHERE s IS NULL OR s <> ALL(finished);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'only finished executions can be purged (%), not %', array_to_string(finished, ', '), bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN statuses;
END
$$;

CREATE OR REPLACE FUNCTION schedule_running(schedule_id bigint) RETURNS bigint
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT e.id
    FROM (SELECT ss.execution FROM schedule_slot ss
          WHERE ss.schedule = schedule_running.schedule_id AND ss.execution IS NOT NULL
          ORDER BY ss.slot DESC LIMIT 1) l
    JOIN execution e ON e.id = l.execution
    WHERE e.status <> ALL(terminal_statuses())
$$;

-- A child's end wakes its workflow: the same trigger, its condition over the one list.
DROP TRIGGER workflow_child_ended ON execution;
CREATE TRIGGER workflow_child_ended AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (NEW.parent IS NOT NULL
          AND NEW.status = ANY(terminal_statuses())
          AND OLD.status <> ALL(terminal_statuses()))
    EXECUTE FUNCTION workflow_child_ended();
