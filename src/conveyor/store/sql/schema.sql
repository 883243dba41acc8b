-- The schema the migrations produce (conveyor.store.snapshot; checked by a test).
-- Do not edit: add a migration, then regenerate this file.

CREATE SCHEMA conveyor;

CREATE TYPE conveyor.property_fact AS (
	key text,
	types text[],
	enum jsonb,
	minimum text,
	maximum text,
	min_length text,
	max_length text
);

CREATE FUNCTION conveyor.acquire_worker_lock(worker_id bigint) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    SELECT pg_try_advisory_lock(worker_lock_class(), worker_id::integer)
$$;

CREATE FUNCTION conveyor.admission_group_key(parameters text[], params jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT coalesce(jsonb_object_agg(p, coalesce(params -> p, 'null'::jsonb)), '{}'::jsonb)
    FROM unnest(parameters) AS p
$$;

CREATE FUNCTION conveyor.admission_lock(p_policy text, p_group jsonb) RETURNS void
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    INSERT INTO execution_admission_group (policy, group_key) VALUES (p_policy, p_group)
    ON CONFLICT (policy, group_key) DO UPDATE SET touched = now()
$$;

CREATE FUNCTION conveyor.admission_on_change() RETURNS trigger
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

CREATE FUNCTION conveyor.admission_on_request() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    r record;
    seq_no bigint;
    held integer;
    enqueued jsonb := '[]';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM admission_policy) THEN
        RETURN NULL;
    END IF;
    -- Group locks first, in key order (see execution_admission_group).
    FOR r IN SELECT DISTINCT p.target AS policy, admission_group_key(p.parameters, i.parameters) AS group_key
             FROM inserted i CROSS JOIN LATERAL admission_policy_for(i.action_ref) p
             ORDER BY 1, 2 LOOP
        PERFORM admission_lock(r.policy, r.group_key);
    END LOOP;
    FOR r IN SELECT i.id, p.target AS policy, p.method, p.concurrency, p.parameters,
                    admission_group_key(p.parameters, i.parameters) AS group_key
             FROM inserted i CROSS JOIN LATERAL admission_policy_for(i.action_ref) p
             ORDER BY i.id LOOP
        UPDATE execution_admission_group SET next_seq = next_seq + 1
        WHERE policy = r.policy AND group_key = r.group_key
        RETURNING next_seq INTO seq_no;
        IF r.method = 'enqueue' THEN
            INSERT INTO execution_admission_queue (execution, policy, group_key, seq)
            VALUES (r.id, r.policy, r.group_key, seq_no);
            enqueued := enqueued || jsonb_build_array(jsonb_build_array(r.policy, r.group_key));
        ELSE
            SELECT count(*) INTO held FROM execution_admission_slot
            WHERE policy = r.policy AND group_key = r.group_key;
            IF held < r.concurrency THEN
                INSERT INTO execution_admission_slot (execution, policy, group_key, seq)
                VALUES (r.id, r.policy, r.group_key, seq_no);
            ELSE
                UPDATE execution SET status = 'cancelled', ended = now(),
                    result = jsonb_build_object(
                        'succeeded', false, 'cancelled_by', 'admission', 'policy', r.policy,
                        'error', format('concurrency limit reached: policy %s allows %s at once%s',
                                        r.policy, r.concurrency,
                                        CASE WHEN cardinality(r.parameters) > 0
                                             THEN ' per ' || r.group_key::text ELSE '' END))
                WHERE id = r.id;
            END IF;
        END IF;
    END LOOP;
    FOR r IN SELECT DISTINCT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(enqueued) ORDER BY 1, 2 LOOP
        PERFORM admission_promote(r.policy, r.group_key);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.admission_policy_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    g record;
    admitted integer := 0;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM wake('requested');
        RETURN NULL;
    END IF;
    FOR g IN SELECT policy, group_key FROM execution_admission_group
             WHERE policy = NEW.target ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;

CREATE TABLE conveyor.admission_policy (
    target text NOT NULL,
    scope text GENERATED ALWAYS AS (
CASE
    WHEN (target = '*'::text) THEN 'global'::text
    WHEN (strpos(target, '.'::text) > 0) THEN 'action'::text
    ELSE 'pack'::text
END) STORED NOT NULL,
    concurrency integer NOT NULL,
    parameters text[] DEFAULT '{}'::text[] NOT NULL,
    method text DEFAULT 'enqueue'::text NOT NULL,
    source text DEFAULT 'operator'::text NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT admission_policy_concurrency_check CHECK ((concurrency > 0)),
    CONSTRAINT admission_policy_method_check CHECK ((method = ANY (ARRAY['enqueue'::text, 'cancel'::text]))),
    CONSTRAINT admission_policy_parameters_check CHECK ((array_position(parameters, NULL::text) IS NULL)),
    CONSTRAINT admission_policy_source_check CHECK ((source = ANY (ARRAY['metadata'::text, 'operator'::text]))),
    CONSTRAINT admission_policy_target_check CHECK (((target = '*'::text) OR (target ~ '^[A-Za-z0-9_-]+$'::text) OR (target ~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$'::text)))
);

CREATE FUNCTION conveyor.admission_policy_for(ref text) RETURNS SETOF conveyor.admission_policy
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT p.* FROM admission_policy p
    WHERE p.target IN (ref, split_part(ref, '.', 1), '*')
    ORDER BY CASE p.scope WHEN 'action' THEN 0 WHEN 'pack' THEN 1 ELSE 2 END
    LIMIT 1
$$;

CREATE FUNCTION conveyor.admission_policy_from_metadata() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    spec jsonb := NEW.metadata -> 'policy';
BEGIN
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        DELETE FROM admission_policy WHERE target = NEW.ref AND source = 'metadata';
        RETURN NULL;
    END IF;
    INSERT INTO admission_policy AS p (target, concurrency, parameters, method, source)
    VALUES (NEW.ref, (spec ->> 'concurrency')::integer,
            ARRAY(SELECT jsonb_array_elements_text(coalesce(spec -> 'parameters', '[]'))),
            coalesce(spec ->> 'method', 'enqueue'), 'metadata')
    ON CONFLICT (target) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, parameters = EXCLUDED.parameters, method = EXCLUDED.method
    WHERE p.source = 'metadata'
      AND (p.concurrency, p.parameters, p.method)
          IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.parameters, EXCLUDED.method);
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.admission_promote(p_policy text, p_group jsonb) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    lim integer;
    held integer;
    n integer;
BEGIN
    SELECT concurrency INTO lim FROM admission_policy WHERE target = p_policy;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO held FROM execution_admission_slot WHERE policy = p_policy AND group_key = p_group;
    IF held >= lim THEN
        RETURN 0;
    END IF;
    WITH heads AS (
        DELETE FROM execution_admission_queue q
        WHERE q.execution IN (
            SELECT execution FROM execution_admission_queue
            WHERE policy = p_policy AND group_key = p_group
            ORDER BY seq LIMIT lim - held)
        RETURNING q.execution, q.policy, q.group_key, q.seq
    )
    INSERT INTO execution_admission_slot (execution, policy, group_key, seq)
    SELECT execution, policy, group_key, seq FROM heads;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION conveyor.append_output(p_worker bigint, p_executions bigint[], p_attempts integer[], p_streams text[], p_chunks bytea[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
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

CREATE FUNCTION conveyor.ask_inquiries(ids bigint[], executor text) RETURNS TABLE(execution bigint, inquiry bigint, created boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH asking AS (
        SELECT e.id, e.parameters AS p FROM execution e
        WHERE e.id = ANY(ask_inquiries.ids) AND e.status = 'scheduling' AND e.executor = ask_inquiries.executor
        ORDER BY e.id
        FOR NO KEY UPDATE OF e
    ), inserted AS (
        INSERT INTO inquiry AS i (execution, prompt, schema, assignees, quorum, forbid_requester, requester,
                                  ttl, deadline, on_timeout)
        SELECT a.id, a.p ->> 'prompt', coalesce(a.p -> 'schema', '{}'),
               ARRAY(SELECT jsonb_array_elements_text(coalesce(a.p -> 'assignees', '[]'))),
               coalesce((a.p ->> 'quorum')::numeric::integer, 1),
               coalesce((a.p ->> 'forbid_requester')::boolean, false),
               root_requester(a.id),
               (a.p ->> 'ttl')::float8,
               now() + make_interval(secs => (a.p ->> 'ttl')::float8),
               coalesce(a.p -> 'on_timeout', '"fail"')
        FROM asking a ORDER BY a.id
        ON CONFLICT ON CONSTRAINT uq_inquiry_execution DO NOTHING
        RETURNING i.id, i.execution
    ), moved AS (
        UPDATE execution e SET status = 'pending', started = now(), not_before = NULL
        FROM asking WHERE e.id = asking.id AND e.status = 'scheduling'
        RETURNING e.id
    )
    SELECT m.id, coalesce(n.id, (SELECT i.id FROM inquiry i WHERE i.execution = m.id)), n.id IS NOT NULL
    FROM moved m LEFT JOIN inserted n ON n.execution = m.id
    ORDER BY m.id;
END
$$;

CREATE TABLE conveyor.schedule_slot (
    schedule bigint NOT NULL,
    slot timestamp with time zone NOT NULL,
    origin text DEFAULT 'scheduled'::text NOT NULL,
    outcome text NOT NULL,
    execution bigint,
    event bigint,
    error text,
    fired timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedule_slot_origin_check CHECK ((origin = ANY (ARRAY['scheduled'::text, 'catchup'::text, 'manual'::text, 'backfill'::text]))),
    CONSTRAINT schedule_slot_outcome_check CHECK ((outcome = ANY (ARRAY['requested'::text, 'emitted'::text, 'skipped'::text, 'missed'::text, 'buffered'::text, 'request_error'::text])))
);

CREATE FUNCTION conveyor.backfill_schedule(name text, slots timestamp with time zone[]) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    s schedule;
    t timestamptz;
BEGIN
    SELECT * INTO s FROM schedule x WHERE x.name = backfill_schedule.name;
    IF NOT FOUND THEN
        PERFORM schedule_not_found(name);
    END IF;
    FOR t IN SELECT DISTINCT u FROM unnest(slots) u WHERE u IS NOT NULL ORDER BY u LOOP
        RETURN QUERY SELECT * FROM schedule_fire_slot(s, t, 'backfill', 'fire');
    END LOOP;
END
$$;

CREATE FUNCTION conveyor.cancel_descendants(p_id bigint, p_policy text) RETURNS integer
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

CREATE FUNCTION conveyor.cancel_execution(p_id bigint, p_by text) RETURNS TABLE(id bigint, was text, now text, worker bigint)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
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

CREATE FUNCTION conveyor.cancel_workflow(p_id bigint, p_by text, p_policy text DEFAULT 'allow_finish'::text) RETURNS TABLE(id bigint, was text, now text, worker bigint)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
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

CREATE FUNCTION conveyor.charge_workflow_trees(p_wids bigint[], p_tasks integer[], p_executions integer[], p_max_tasks bigint, p_max_executions bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    r record;
    t workflow_tree;
BEGIN
    FOR r IN
        WITH RECURSIVE u AS (
            SELECT * FROM unnest(p_wids, p_tasks, p_executions) AS u(wid, tasks, executions)
        ), up AS (
            SELECT u.wid, e.id, e.parent
            FROM u JOIN workflow_execution w ON w.id = u.wid JOIN execution e ON e.id = w.execution
            UNION ALL
            SELECT up.wid, p.id, p.parent FROM up JOIN execution p ON p.id = up.parent
        )
        SELECT up.id AS root, sum(u.tasks) AS tasks, sum(u.executions) AS executions
        FROM up JOIN u ON u.wid = up.wid
        WHERE up.parent IS NULL
        GROUP BY up.id
        HAVING sum(u.tasks) > 0 OR sum(u.executions) > 0
        ORDER BY up.id
    LOOP
        INSERT INTO workflow_tree AS w (root, tasks, executions) VALUES (r.root, r.tasks, r.executions)
        ON CONFLICT (root) DO UPDATE
        SET tasks = w.tasks + EXCLUDED.tasks, executions = w.executions + EXCLUDED.executions, updated = now()
        RETURNING w.* INTO t;
        IF t.executions > p_max_executions THEN
            RAISE EXCEPTION 'workflow execution % and its sub-workflows would request more than % child executions (workflow.max_tree_executions)',
                r.root, p_max_executions USING ERRCODE = 'CVB01';
        END IF;
        IF t.tasks > p_max_tasks THEN
            RAISE EXCEPTION 'workflow execution % and its sub-workflows would create more than % task instances (workflow.max_tree_tasks)',
                r.root, p_max_tasks USING ERRCODE = 'CVB01';
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION conveyor.cordon_worker(p_name text, p_cordoned boolean) RETURNS TABLE(id bigint, name text, status text, cordoned boolean)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    UPDATE worker w SET cordoned = p_cordoned WHERE w.name = p_name
    RETURNING w.id, w.name, w.status, w.cordoned
$$;

CREATE FUNCTION conveyor.create_api_token(p_name text, p_role text, p_hash bytea, p_prefix text) RETURNS TABLE(id bigint, name text, role text, prefix text, created timestamp with time zone)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    INSERT INTO api_token AS t (name, role, token_hash, prefix)
    VALUES (p_name, p_role, p_hash, p_prefix)
    RETURNING t.id, t.name, t.role, t.prefix, t.created
$$;

CREATE FUNCTION conveyor.create_schedule(name text, kind text, cron text DEFAULT NULL::text, timezone text DEFAULT 'UTC'::text, every interval DEFAULT NULL::interval, at timestamp with time zone DEFAULT NULL::timestamp with time zone, starts timestamp with time zone DEFAULT NULL::timestamp with time zone, ends timestamp with time zone DEFAULT NULL::timestamp with time zone, action_ref text DEFAULT NULL::text, parameters jsonb DEFAULT '{}'::jsonb, catchup text DEFAULT 'latest'::text, catchup_window interval DEFAULT '01:00:00'::interval, overlap text DEFAULT 'allow'::text, description text DEFAULT NULL::text, replace boolean DEFAULT false, OUT schedule_id bigint, OUT created boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_variable
DECLARE
    params jsonb := coalesce(parameters, '{}');
    action_schema jsonb;
    problems text[];
    trigger_type text;
    events_on text;
BEGIN
    IF NOT replace AND EXISTS (SELECT 1 FROM schedule s WHERE s.name = create_schedule.name) THEN
        RAISE EXCEPTION 'schedule % exists already', quote_literal(name)
            USING ERRCODE = 'CVC06', HINT = 'update it (PUT/PATCH), or delete it first';
    END IF;
    IF action_ref IS NOT NULL THEN
        SELECT a.parameters_schema INTO action_schema FROM action a WHERE a.ref = action_ref;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unknown action %', quote_literal(action_ref)
                USING ERRCODE = 'CVA01', HINT = 'no worker has registered this action';
        END IF;
        problems := validate_parameters(action_schema, params);
        IF cardinality(problems) > 0 THEN
            RAISE EXCEPTION 'invalid parameters for %: %', action_ref, array_to_string(problems, '; ')
                USING ERRCODE = 'CVA02';
        END IF;
    ELSE
        events_on := name;
        SELECT t.type INTO trigger_type FROM trigger t WHERE t.name = events_on;
        IF NOT FOUND THEN
            PERFORM register_trigger(events_on, kind, NULL, 'events of schedule ' || name);
        ELSIF trigger_type <> kind THEN
            RAISE EXCEPTION 'trigger % is a % trigger: a % schedule without an action emits on a % trigger of its name',
                quote_literal(events_on), trigger_type, kind, kind
                USING ERRCODE = 'CVC05', HINT = 'give the schedule an action, or another name';
        END IF;
    END IF;
    INSERT INTO schedule AS s (name, kind, cron, timezone, every, at, starts, ends, action_ref, parameters,
                               trigger, catchup, catchup_window, overlap, description, next_fire)
    VALUES (name, kind, cron, coalesce(timezone, 'UTC'), every, at, starts, ends, action_ref, params,
            events_on, coalesce(catchup, 'latest'), coalesce(catchup_window, '1 hour'),
            coalesce(overlap, 'allow'), description, now())
    ON CONFLICT ON CONSTRAINT schedule_name_key DO UPDATE
        SET kind = excluded.kind, cron = excluded.cron, timezone = excluded.timezone, every = excluded.every,
            at = excluded.at, starts = excluded.starts, ends = excluded.ends, action_ref = excluded.action_ref,
            parameters = excluded.parameters, trigger = coalesce(excluded.trigger, s.trigger),
            catchup = excluded.catchup, catchup_window = excluded.catchup_window, overlap = excluded.overlap,
            description = excluded.description, next_fire = now(), updated = now()
    RETURNING s.id, (s.xmax = 0) INTO schedule_id, created;
END
$$;

CREATE FUNCTION conveyor.current_server_epoch() RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT epoch FROM server_epoch WHERE postmaster_start = pg_postmaster_start_time()
$$;

CREATE FUNCTION conveyor.delete_admission_policy(p_target text) RETURNS TABLE(target text, source text, released integer, restored boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    current admission_policy;
    defined boolean;
    n integer;
BEGIN
    SELECT * INTO current FROM admission_policy p WHERE p.target = p_target FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no admission policy for %', quote_literal(p_target)
            USING ERRCODE = 'CVN03', HINT = 'see `conveyor policies list`';
    END IF;
    defined := EXISTS (SELECT 1 FROM action a
                       WHERE a.ref = p_target AND jsonb_typeof(a.metadata -> 'policy') = 'object');
    IF current.source = 'metadata' AND defined THEN
        RAISE EXCEPTION 'the policy for % comes from the action''s definition (policy=...): change the '
                        'definition, or override it with `conveyor policies set % --concurrency N`',
                        p_target, p_target
            USING ERRCODE = 'CVC02';
    END IF;
    SELECT count(*) INTO n FROM execution_admission_queue q WHERE q.policy = p_target;
    DELETE FROM admission_policy p WHERE p.target = p_target;
    IF defined THEN
        -- Assigning metadata fires admission_policy_from_metadata, which re-inserts it.
        UPDATE action a SET metadata = a.metadata WHERE a.ref = p_target;
    END IF;
    RETURN QUERY SELECT current.target, current.source, n, defined;
END
$$;

CREATE FUNCTION conveyor.delete_rule(ref text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    DELETE FROM rule r WHERE r.ref = delete_rule.ref;
    RETURN FOUND;
END
$$;

CREATE FUNCTION conveyor.delete_schedule(name text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    -- Its slots go with it (ON DELETE CASCADE); the executions and events they made stay.
    DELETE FROM schedule s WHERE s.name = delete_schedule.name;
    RETURN FOUND;
END
$$;

CREATE FUNCTION conveyor.delete_trigger(name text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    DELETE FROM trigger t WHERE t.name = delete_trigger.name;
    RETURN FOUND;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'trigger % is still in use: by rules, webhooks, schedules or its events%',
        quote_literal(delete_trigger.name),
        coalesce(' (rules: ' || (SELECT string_agg(r.ref, ', ' ORDER BY r.ref) FROM rule r
                                 WHERE r.trigger = delete_trigger.name) || ')', '')
        USING ERRCODE = 'CVC05', HINT = 'delete what uses it first';
END
$$;

CREATE FUNCTION conveyor.delete_webhook(name text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    trig text;
BEGIN
    DELETE FROM webhook w WHERE w.name = delete_webhook.name RETURNING w.trigger INTO trig;
    IF trig IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM trigger t
    WHERE t.name = trig AND t.type = 'webhook'
          AND NOT EXISTS (SELECT 1 FROM rule r WHERE r.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM schedule s WHERE s.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM event e WHERE e.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM webhook w WHERE w.trigger = trig);
    RETURN true;
END
$$;

CREATE FUNCTION conveyor.delete_workflow(p_ref text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    n integer;
BEGIN
    UPDATE workflow_definition d SET deleted = now() WHERE d.ref = p_ref AND d.deleted IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 AND NOT EXISTS (SELECT 1 FROM execution e WHERE e.action_ref = p_ref) THEN
        DELETE FROM action a WHERE a.ref = p_ref AND a.runner_type = 'workflow';
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION conveyor.drain_worker(p_name text) RETURNS TABLE(id bigint, name text, status text, cordoned boolean, handed_back integer)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    w record;
    n integer;
BEGIN
    SELECT * INTO w FROM cordon_worker(p_name, true);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || '.assign', 0));
    SELECT count(*) INTO n FROM hand_back_scheduled(w.id);
    RETURN QUERY SELECT w.id, w.name, w.status, w.cordoned, n;
END
$$;

CREATE FUNCTION conveyor.emit_event(trigger text, payload jsonb DEFAULT '{}'::jsonb, source text DEFAULT 'sql'::text, idempotency_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $_$
    SELECT event_id FROM emit_event_once($1, $2, $3, $4)
$_$;

CREATE FUNCTION conveyor.emit_event_once(trigger text, payload jsonb, source text DEFAULT 'sql'::text, idempotency_key text DEFAULT NULL::text, OUT event_id bigint, OUT repeated boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    body jsonb := coalesce(emit_event_once.payload, '{}');
    schema jsonb;
    problems text[];
    earlier record;
    turns integer := 0;
BEGIN
    SELECT t.payload_schema INTO schema FROM trigger t WHERE t.name = emit_event_once.trigger;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(emit_event_once.trigger)
            USING ERRCODE = 'CVE01', HINT = 'register it first (conveyor triggers register)';
    END IF;
    IF schema IS NOT NULL THEN
        problems := validate_parameters(schema, body);
        IF cardinality(problems) > 0 THEN
            RAISE EXCEPTION 'invalid payload for trigger %: %', emit_event_once.trigger,
                replace(array_to_string(problems, '; '), 'parameters must', 'the payload must')
                USING ERRCODE = 'CVE02';
        END IF;
    END IF;
    LOOP
        turns := turns + 1;
        IF turns > 3 THEN
            RAISE EXCEPTION 'idempotency key % is changing under this event; retry it',
                quote_literal(idempotency_key) USING ERRCODE = 'serialization_failure';
        END IF;
        INSERT INTO event AS e (trigger, payload, source, idempotency_key)
        VALUES (emit_event_once.trigger, body, coalesce(emit_event_once.source, 'sql'),
                emit_event_once.idempotency_key)
        ON CONFLICT (trigger, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING e.id INTO event_id;
        IF FOUND THEN
            INSERT INTO event_pending (event) VALUES (event_id);
            repeated := false;
            RETURN;
        END IF;
        SELECT e.id, e.payload INTO earlier FROM event e
        WHERE e.trigger = emit_event_once.trigger AND e.idempotency_key = emit_event_once.idempotency_key;
        IF FOUND THEN
            IF earlier.payload IS DISTINCT FROM body THEN
                RAISE EXCEPTION 'idempotency key % was already used for another event (event %)',
                    quote_literal(idempotency_key), earlier.id
                    USING ERRCODE = 'CVE03',
                          HINT = 'a retry must repeat the event unchanged; send a new key for a new event';
            END IF;
            event_id := earlier.id;
            repeated := true;
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION conveyor.enforce_events(events bigint[], decisions jsonb) RETURNS TABLE(event bigint, enforcement bigint, rule_ref text, outcome text, execution bigint, error text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    taken bigint[];
    d record;
    eid bigint;
    done text;
    exec_id bigint;
    err text;
    previous text := current_setting('conveyor.requested_by', true);
BEGIN
    WITH gone AS (
        DELETE FROM event_pending p WHERE p.event = ANY(enforce_events.events) RETURNING p.event
    )
    SELECT coalesce(array_agg(g.event ORDER BY g.event), '{}') INTO taken FROM gone g;
    FOR d IN
        SELECT x.* FROM jsonb_to_recordset(coalesce(decisions, '[]'))
            AS x(event bigint, rule bigint, rule_ref text, outcome text, action_ref text, parameters jsonb, error text)
        WHERE x.event = ANY(taken)
        ORDER BY x.event, x.rule
    LOOP
        IF d.outcome NOT IN ('requested', 'template_error', 'request_error', 'rule_disabled') THEN
            RAISE EXCEPTION 'enforce_events: unknown outcome %', quote_literal(d.outcome);
        END IF;
        IF EXISTS (SELECT 1 FROM enforcement f WHERE f.rule = d.rule AND f.event = d.event) THEN
            CONTINUE;  -- cannot happen while the event_pending guard holds; harmless if it does
        END IF;
        eid := nextval(pg_get_serial_sequence('enforcement', 'id'));
        done := d.outcome;
        exec_id := NULL;
        err := d.error;
        IF done = 'requested' THEN
            PERFORM set_config('conveyor.requested_by', 'rule:' || d.rule_ref, true);
            BEGIN
                SELECT r.execution_id INTO exec_id
                FROM request_execution_once(d.action_ref, coalesce(d.parameters, '{}'), NULL, NULL, NULL, eid) r;
            EXCEPTION WHEN SQLSTATE 'CVA01' OR SQLSTATE 'CVA02' THEN
                done := 'request_error';
                err := SQLERRM;
                exec_id := NULL;
            END;
        END IF;
        INSERT INTO enforcement AS f (id, rule, rule_ref, event, outcome, execution, parameters, error)
        OVERRIDING SYSTEM VALUE
        VALUES (eid, d.rule, d.rule_ref, d.event, done, exec_id, d.parameters, err)
        ON CONFLICT (rule, event) WHERE event IS NOT NULL DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'enforcement of rule % for event % written twice', d.rule_ref, d.event
                USING ERRCODE = 'serialization_failure';
        END IF;
        event := d.event; enforcement := eid; rule_ref := d.rule_ref; outcome := done;
        execution := exec_id; error := err;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('conveyor.requested_by', coalesce(previous, ''), true);
    RETURN QUERY SELECT t, NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::text FROM unnest(taken) t;
END
$$;

CREATE FUNCTION conveyor.event_immutable() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.trigger IS DISTINCT FROM OLD.trigger
       OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.source IS DISTINCT FROM OLD.source
       OR NEW.received IS DISTINCT FROM OLD.received
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR (NEW.replay_of IS NOT NULL AND NEW.replay_of IS DISTINCT FROM OLD.replay_of) THEN
        RAISE EXCEPTION 'event % is immutable', OLD.id USING ERRCODE = 'CVC05';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION conveyor.event_pending_wake() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    PERFORM wake('event');
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.execution_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'requested' THEN
            RAISE EXCEPTION 'an execution starts in requested, not %', NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.created := now();
    ELSIF NEW.status IS DISTINCT FROM OLD.status AND NOT EXISTS (
        SELECT 1 FROM execution_transition t
        WHERE t.from_status = OLD.status AND t.to_status = NEW.status
    ) THEN
        RAISE EXCEPTION 'illegal execution transition % -> % (execution %)', OLD.status, NEW.status, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated := now();
    RETURN NEW;
END
$$;

CREATE FUNCTION conveyor.execution_wake_changed() RETURNS trigger
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

CREATE FUNCTION conveyor.execution_wake_inserted() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE status = 'requested') THEN
        PERFORM wake('requested');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.expire_inquiries(p_limit integer DEFAULT 1000) RETURNS TABLE(inquiry bigint, execution bigint, outcome text)
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

CREATE FUNCTION conveyor.finish_executions(p_worker bigint, p_ids bigint[], p_attempts integer[], p_statuses text[], p_outcomes text[], p_delays double precision[], p_results jsonb[], p_errors text[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET enable_bitmapscan TO 'off'
    SET enable_seqscan TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        SELECT * FROM unnest(p_ids, p_attempts, p_statuses, p_outcomes, p_delays, p_results, p_errors)
            AS d(id, attempt, status, outcome, delay, result, error)
    ), finishing AS (
        SELECT done.*, x.cancel
        FROM done CROSS JOIN LATERAL (
            SELECT e.status = 'canceling' AS cancel FROM execution e
            WHERE e.id = done.id AND e.worker = p_worker AND e.attempt = done.attempt
              AND e.status || '' IN ('running', 'canceling')
            OFFSET 0  -- a probe per result, never flattened into a join
            FOR UPDATE
        ) x
    ), decided AS (
        SELECT f.id, f.attempt, f.result,
               CASE WHEN f.cancel THEN 'cancelled' ELSE f.status END AS status,
               CASE WHEN f.cancel THEN 'cancelled' ELSE f.outcome END AS outcome,
               CASE WHEN f.cancel THEN NULL ELSE f.delay END AS delay,
               CASE WHEN f.cancel THEN coalesce(f.error, 'cancelled') ELSE f.error END AS error
        FROM finishing f
    ), finished AS (
        UPDATE execution e
        SET status = d.status, result = d.result,
            ended = CASE WHEN d.status = 'requested' THEN NULL ELSE now() END,
            worker = CASE WHEN d.status = 'requested' THEN NULL ELSE e.worker END,
            executor = CASE WHEN d.status = 'requested' THEN NULL ELSE e.executor END,
            started = CASE WHEN d.status = 'requested' THEN NULL ELSE e.started END,
            not_before = CASE WHEN d.delay IS NULL THEN NULL ELSE now() + make_interval(secs => d.delay) END
        FROM decided d
        -- Only the key: each row was checked and locked in `finishing`, in this statement,
        -- and nothing else can change it before this transaction ends.
        WHERE e.id = d.id
        RETURNING e.id, e.attempt, d.outcome, d.error
    ), recorded AS (
        UPDATE execution_attempt t
        SET ended = now(), outcome = f.outcome, error = f.error
        FROM finished f WHERE t.execution = f.id AND t.attempt = f.attempt
    )
    SELECT f.id FROM finished f;
END
$$;

CREATE FUNCTION conveyor.fire_schedule(name text) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    s schedule;
BEGIN
    SELECT * INTO s FROM schedule x WHERE x.name = fire_schedule.name;
    IF NOT FOUND THEN
        PERFORM schedule_not_found(name);
    END IF;
    RETURN QUERY SELECT * FROM schedule_fire_slot(s, now(), 'manual', 'fire');
END
$$;

CREATE FUNCTION conveyor.fire_schedule_slots(schedule_id bigint, decisions jsonb, cancel bigint, next_fire timestamp with time zone, last_slot timestamp with time zone) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    s schedule;
    d jsonb;
BEGIN
    SELECT * INTO s FROM schedule x WHERE x.id = fire_schedule_slots.schedule_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- deleted since it was picked
    END IF;
    IF cancel IS NOT NULL THEN
        PERFORM cancel_execution(cancel, 'schedule:' || s.name);
    END IF;
    FOR d IN SELECT value FROM jsonb_array_elements(coalesce(decisions, '[]')) LOOP
        RETURN QUERY SELECT * FROM schedule_fire_slot(s, (d ->> 'slot')::timestamptz, d ->> 'origin', d ->> 'action');
    END LOOP;
    UPDATE schedule x SET next_fire = fire_schedule_slots.next_fire,
                          last_slot = coalesce(fire_schedule_slots.last_slot, x.last_slot)
    WHERE x.id = s.id;
END
$$;

CREATE FUNCTION conveyor.fire_schedules(batch jsonb) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    doomed record;
    made schedule_slot[];
    bad text;
BEGIN
    SELECT d ->> 'action' INTO bad
    FROM jsonb_array_elements(coalesce(batch, '[]')) b, jsonb_array_elements(coalesce(b -> 'decisions', '[]')) d
    WHERE (d ->> 'action') IS NULL OR (d ->> 'action') NOT IN ('fire', 'skip', 'miss', 'buffer')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown slot decision %', coalesce(bad, 'NULL');
    END IF;
    -- The executors picked (and locked) them already in this transaction; other callers
    -- lock them here, in id order. A schedule deleted since it was picked drops out.
    PERFORM 1 FROM schedule x
    WHERE x.id IN (SELECT (b ->> 'id')::bigint FROM jsonb_array_elements(coalesce(batch, '[]')) b)
    ORDER BY x.id FOR UPDATE;
    FOR doomed IN SELECT x.name, (b ->> 'cancel')::bigint AS cancel
             FROM jsonb_array_elements(coalesce(batch, '[]')) b JOIN schedule x ON x.id = (b ->> 'id')::bigint
             WHERE b ->> 'cancel' IS NOT NULL ORDER BY x.id LOOP
        PERFORM cancel_execution(doomed.cancel, 'schedule:' || doomed.name);  -- cancel_previous (rare)
    END LOOP;

    WITH decided AS (
        SELECT x.id AS schedule, (e ->> 'slot')::timestamptz AS slot, e ->> 'origin' AS origin,
               e ->> 'action' AS decision, x.action_ref, coalesce(x.parameters, '{}') AS parameters, x.trigger,
               jsonb_build_object('schedule', x.name, 'slot', (e ->> 'slot')::timestamptz,
                                  'origin', e ->> 'origin') AS payload
        FROM jsonb_array_elements(coalesce(batch, '[]')) b
        JOIN schedule x ON x.id = (b ->> 'id')::bigint
        CROSS JOIN LATERAL jsonb_array_elements(coalesce(b -> 'decisions', '[]')) WITH ORDINALITY AS d(e, n)
    ), verdict AS (
        -- Each distinct request checked once (validate_parameters is the costly part, and
        -- schedules of one action often share their parameters).
        SELECT w.action_ref, w.parameters, a.ref IS NOT NULL AS known,
               CASE WHEN a.ref IS NOT NULL THEN validate_parameters(a.parameters_schema, w.parameters) END AS problems
        FROM (SELECT DISTINCT d.action_ref, d.parameters FROM decided d
              WHERE d.decision = 'fire' AND d.action_ref IS NOT NULL) w
        LEFT JOIN action a ON a.ref = w.action_ref
    ), checked AS (
        -- request_execution's and emit_event's refusals, word for word.
        SELECT d.*,
               CASE WHEN d.decision <> 'fire' THEN NULL
                    WHEN d.action_ref IS NOT NULL AND NOT v.known
                        THEN 'unknown action ' || quote_literal(d.action_ref)
                    WHEN d.action_ref IS NOT NULL AND cardinality(v.problems) > 0
                        THEN format('invalid parameters for %s: %s', d.action_ref, array_to_string(v.problems, '; '))
                    WHEN d.action_ref IS NULL AND t.name IS NULL
                        THEN 'unknown trigger ' || quote_literal(d.trigger)
                    WHEN d.action_ref IS NULL AND cardinality(p.problems) > 0
                        THEN format('invalid payload for trigger %s: %s', d.trigger,
                                    replace(array_to_string(p.problems, '; '), 'parameters must', 'the payload must'))
               END AS error
        FROM decided d
        LEFT JOIN verdict v ON v.action_ref = d.action_ref AND v.parameters = d.parameters
        LEFT JOIN trigger t ON d.action_ref IS NULL AND t.name = d.trigger
        LEFT JOIN LATERAL (
            SELECT CASE WHEN d.decision = 'fire' AND t.payload_schema IS NOT NULL
                        THEN validate_parameters(t.payload_schema, d.payload) END AS problems) p ON true
    ), ins AS (
        -- fired: the clock now, not the transaction's start (the slot's true lag).
        INSERT INTO schedule_slot AS ss (schedule, slot, origin, outcome, execution, error, fired)
        SELECT c.schedule, c.slot, c.origin,
               CASE c.decision WHEN 'skip' THEN 'skipped' WHEN 'miss' THEN 'missed' WHEN 'buffer' THEN 'buffered'
                    ELSE CASE WHEN c.error IS NOT NULL THEN 'request_error'
                              WHEN c.action_ref IS NULL THEN 'emitted' ELSE 'requested' END
               END,
               CASE WHEN c.decision = 'fire' AND c.action_ref IS NOT NULL AND c.error IS NULL
                    THEN nextval(pg_get_serial_sequence('execution', 'id')) END,
               c.error, greatest(clock_timestamp(), now())
        FROM checked c
        ORDER BY c.schedule, c.slot
        ON CONFLICT ON CONSTRAINT schedule_slot_pkey DO NOTHING
        RETURNING ss.*
    ), requested AS (
        -- Only the slots inserted above: a slot decided already requests nothing.
        INSERT INTO execution (id, action_ref, parameters, requested_by)
        SELECT i.execution, x.action_ref, coalesce(x.parameters, '{}'), 'schedule:' || x.name
        FROM ins i JOIN schedule x ON x.id = i.schedule
        WHERE i.execution IS NOT NULL
        ORDER BY i.execution
        RETURNING id
    )
    SELECT array_agg(i ORDER BY i.schedule, i.slot) INTO made FROM ins i;
    -- (requested runs whether read or not: data-modifying CTEs always do.)

    IF made IS NULL THEN
        made := '{}';
    ELSIF EXISTS (SELECT 1 FROM unnest(made) m WHERE m.outcome = 'emitted') THEN
        UPDATE schedule_slot ss
        SET event = emit_event(x.trigger, jsonb_build_object('schedule', x.name, 'slot', m.slot, 'origin', m.origin),
                               'schedule')
        FROM unnest(made) m JOIN schedule x ON x.id = m.schedule
        WHERE m.outcome = 'emitted' AND ss.schedule = m.schedule AND ss.slot = m.slot;
    END IF;

    UPDATE schedule x SET next_fire = (b ->> 'next_fire')::timestamptz,
                          last_slot = coalesce((b ->> 'last_slot')::timestamptz, x.last_slot)
    FROM jsonb_array_elements(coalesce(batch, '[]')) b
    WHERE x.id = (b ->> 'id')::bigint;

    RETURN QUERY
    SELECT ss.* FROM schedule_slot ss JOIN unnest(made) m ON ss.schedule = m.schedule AND ss.slot = m.slot
    ORDER BY ss.schedule, ss.slot;
END
$$;

CREATE FUNCTION conveyor.hand_back_scheduled(p_worker bigint) RETURNS TABLE(id bigint, worker bigint, attempt integer, worker_name text)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    WITH back AS (
        SELECT e.id, e.attempt, e.worker, w.name AS worker_name
        FROM execution e LEFT JOIN worker w ON w.id = e.worker
        WHERE e.status = 'scheduled'
          AND (e.worker = p_worker OR (p_worker IS NULL AND (w.id IS NULL OR w.status = 'inactive')))
        ORDER BY e.id
        FOR UPDATE OF e SKIP LOCKED
    ), withdrawn AS (
        DELETE FROM execution_attempt t USING back WHERE t.execution = back.id AND t.attempt = back.attempt
    )
    UPDATE execution e
    SET status = 'requested', worker = NULL, executor = NULL, attempt = e.attempt - 1,
        scheduled = NULL, started = NULL
    FROM back
    WHERE e.id = back.id AND e.status = 'scheduled' AND e.attempt = back.attempt
    RETURNING e.id, back.worker, back.attempt, back.worker_name
$$;

CREATE FUNCTION conveyor.inquiry_role_rank(p_role text) RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE p_role WHEN 'viewer' THEN 1 WHEN 'operator' THEN 2 WHEN 'admin' THEN 3 END
$$;

CREATE FUNCTION conveyor.inquiry_wake_inserted() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    asked bigint[];
BEGIN
    SELECT array_agg(execution ORDER BY execution) INTO asked FROM inserted;
    IF asked IS NOT NULL THEN
        PERFORM wake('inquiry', asked);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.json_type_matches(value jsonb, expected text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE expected
        WHEN 'integer' THEN jsonb_typeof(value) = 'number' AND value::text::numeric = trunc(value::text::numeric)
        WHEN 'number' THEN jsonb_typeof(value) = 'number'
        ELSE jsonb_typeof(value) = expected
    END
$$;

CREATE FUNCTION conveyor.on_worker_statuses() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT ARRAY['scheduled', 'running', 'canceling']
$$;

CREATE FUNCTION conveyor.outbox_wake() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.outbox', '');
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.parameters_refused(refs text[], parameters jsonb) RETURNS TABLE(i bigint, ref text, params jsonb, schema jsonb)
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    SET jit TO 'off'
    AS $$
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

CREATE FUNCTION conveyor.patch_schedule(p_name text, p_fields text[], p_kind text DEFAULT NULL::text, p_cron text DEFAULT NULL::text, p_timezone text DEFAULT NULL::text, p_every interval DEFAULT NULL::interval, p_at timestamp with time zone DEFAULT NULL::timestamp with time zone, p_starts timestamp with time zone DEFAULT NULL::timestamp with time zone, p_ends timestamp with time zone DEFAULT NULL::timestamp with time zone, p_action_ref text DEFAULT NULL::text, p_parameters jsonb DEFAULT NULL::jsonb, p_catchup text DEFAULT NULL::text, p_catchup_window interval DEFAULT NULL::interval, p_overlap text DEFAULT NULL::text, p_description text DEFAULT NULL::text) RETURNS TABLE(schedule_id bigint, created boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    cur schedule;
    unknown text[];
    timing boolean := p_fields && ARRAY['kind', 'cron', 'every', 'at'];
BEGIN
    unknown := ARRAY(SELECT f FROM unnest(p_fields) f
                     WHERE f <> ALL (ARRAY['kind', 'cron', 'timezone', 'every', 'at', 'starts', 'ends',
                                           'action_ref', 'parameters', 'catchup', 'catchup_window',
                                           'overlap', 'description']));
    IF cardinality(unknown) > 0 THEN
        RAISE EXCEPTION 'unknown schedule fields: %', array_to_string(unknown, ', ') USING ERRCODE = '22023';
    END IF;
    SELECT * INTO cur FROM schedule s WHERE s.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM schedule_not_found(p_name);
    END IF;
    RETURN QUERY SELECT c.schedule_id, c.created FROM create_schedule(
        name => p_name,
        kind => CASE WHEN timing THEN p_kind ELSE cur.kind END,
        cron => CASE WHEN timing THEN p_cron ELSE cur.cron END,
        every => CASE WHEN timing THEN p_every ELSE cur.every END,
        at => CASE WHEN timing THEN p_at ELSE cur.at END,
        timezone => CASE WHEN 'timezone' = ANY(p_fields) THEN p_timezone ELSE cur.timezone END,
        starts => CASE WHEN 'starts' = ANY(p_fields) THEN p_starts ELSE cur.starts END,
        ends => CASE WHEN 'ends' = ANY(p_fields) THEN p_ends ELSE cur.ends END,
        action_ref => CASE WHEN 'action_ref' = ANY(p_fields) THEN p_action_ref ELSE cur.action_ref END,
        parameters => CASE WHEN 'parameters' = ANY(p_fields) THEN p_parameters ELSE cur.parameters END,
        catchup => CASE WHEN 'catchup' = ANY(p_fields) THEN p_catchup ELSE cur.catchup END,
        catchup_window => CASE WHEN 'catchup_window' = ANY(p_fields) THEN p_catchup_window
                               ELSE cur.catchup_window END,
        overlap => CASE WHEN 'overlap' = ANY(p_fields) THEN p_overlap ELSE cur.overlap END,
        description => CASE WHEN 'description' = ANY(p_fields) THEN p_description ELSE cur.description END,
        replace => true) c;
END
$$;

CREATE FUNCTION conveyor.pause_execution(p_id bigint, p_by text) RETURNS TABLE(id bigint, was text, now text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    -- (0036) The state row before the execution row: the advancement's order.
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wf_id IS NULL OR current <> 'running' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'paused' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'paused' WHERE e.id = p_id AND e.status = 'running';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'pause', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'paused'::text;
END
$$;

CREATE FUNCTION conveyor.pause_schedule(name text) RETURNS TABLE(schedule_id bigint, was boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    RETURN QUERY
    WITH old AS (SELECT s.id, s.paused FROM schedule s WHERE s.name = pause_schedule.name FOR UPDATE),
    moved AS (UPDATE schedule s SET paused = true, updated = now() FROM old
              WHERE s.id = old.id AND NOT old.paused RETURNING s.id)
    SELECT old.id, old.paused FROM old;
END
$$;

CREATE FUNCTION conveyor.property_facts(schema jsonb) RETURNS SETOF conveyor.property_fact
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
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

CREATE FUNCTION conveyor.property_ok(types text[], enum jsonb, minimum text, maximum text, min_length text, max_length text, val jsonb) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
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

CREATE FUNCTION conveyor.purge_blocked(root bigint) RETURNS boolean
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

CREATE FUNCTION conveyor.purge_cutoff(older_than interval) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must be a duration of zero or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN now() - older_than;
END
$$;

CREATE FUNCTION conveyor.purge_dead_letters(p_reason text, p_resolution text, p_execution bigint, p_queue text, p_older_than double precision, p_include_pending boolean) RETURNS TABLE(id bigint)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    DELETE FROM dead_letter d
    WHERE (p_reason IS NULL OR d.reason = p_reason)
      AND (p_resolution IS NULL OR d.resolution IS NOT DISTINCT FROM nullif(p_resolution, 'pending'))
      AND (p_execution IS NULL OR d.execution = p_execution)
      AND (p_queue IS NULL OR d.queue = p_queue)
      AND (p_older_than IS NULL OR d.first_seen < now() - make_interval(secs => p_older_than))
      AND (coalesce(p_include_pending, false) OR d.resolution IS NOT NULL)
    RETURNING d.id
$$;

CREATE FUNCTION conveyor.purge_executions(older_than interval, statuses text[] DEFAULT NULL::text[], batch integer DEFAULT 1000) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
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

CREATE FUNCTION conveyor.purge_statuses(statuses text[]) RETURNS text[]
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

CREATE FUNCTION conveyor.purgeable_executions(older_than interval, statuses text[] DEFAULT NULL::text[]) RETURNS bigint
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT count(*) FROM execution e
    WHERE e.status = ANY(purge_statuses(statuses)) AND e.updated < purge_cutoff(older_than) AND e.parent IS NULL
$$;

CREATE FUNCTION conveyor.register_rule(ref text, trigger text, criteria jsonb, action_ref text, parameters jsonb, enabled boolean DEFAULT true, description text DEFAULT NULL::text, definition jsonb DEFAULT NULL::jsonb, OUT rule_id bigint, OUT created boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
BEGIN
    IF NOT EXISTS (SELECT 1 FROM trigger t WHERE t.name = register_rule.trigger) THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(register_rule.trigger)
            USING ERRCODE = 'CVE01', HINT = 'register it first (conveyor triggers register)';
    END IF;
    -- xmax = 0: the row was inserted, not updated by ON CONFLICT.
    INSERT INTO rule AS r (ref, trigger, criteria, action_ref, parameters, enabled, description, definition)
    VALUES (register_rule.ref, register_rule.trigger, coalesce(register_rule.criteria, '{}'),
            register_rule.action_ref, coalesce(register_rule.parameters, '{}'), coalesce(register_rule.enabled, true),
            register_rule.description, register_rule.definition)
    ON CONFLICT (ref) DO UPDATE
        SET trigger = excluded.trigger, criteria = excluded.criteria, action_ref = excluded.action_ref,
            parameters = excluded.parameters, enabled = excluded.enabled, description = excluded.description,
            definition = excluded.definition, updated = now()
    RETURNING r.id, (r.xmax = 0) INTO rule_id, created;
END
$$;

CREATE FUNCTION conveyor.register_trigger(name text, type text DEFAULT 'custom'::text, payload_schema jsonb DEFAULT NULL::jsonb, description text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    was text;
BEGIN
    SELECT t.type INTO was FROM trigger t WHERE t.name = register_trigger.name FOR UPDATE;
    IF FOUND AND was <> register_trigger.type THEN
        RAISE EXCEPTION 'trigger % is a % trigger, not %', quote_literal(register_trigger.name), was,
            register_trigger.type
            USING ERRCODE = 'CVC05', HINT = 'a trigger keeps its type: delete it first, or use another name';
    END IF;
    INSERT INTO trigger AS t (name, type, payload_schema, description)
    VALUES (register_trigger.name, register_trigger.type, register_trigger.payload_schema,
            register_trigger.description)
    ON CONFLICT ON CONSTRAINT trigger_pkey DO UPDATE
        SET payload_schema = excluded.payload_schema, description = excluded.description, updated = now();
    RETURN was IS NULL;
END
$$;

CREATE FUNCTION conveyor.register_webhook(name text, trigger text DEFAULT NULL::text, auth text DEFAULT 'hmac'::text, token_hash text DEFAULT NULL::text, secret text DEFAULT NULL::text, signature_header text DEFAULT NULL::text, signature_prefix text DEFAULT NULL::text, idempotency_header text DEFAULT NULL::text, max_body_bytes integer DEFAULT NULL::integer, description text DEFAULT NULL::text, payload_schema jsonb DEFAULT NULL::jsonb, OUT created boolean) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $_$
#variable_conflict use_variable
DECLARE
    trig text;
    old webhook;
    -- An HTTP header name (RFC 9110 token).
    header_re constant text := '^[A-Za-z0-9!#$%&''*+.^_`|~-]{1,255}$';
    name_re constant text := '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$';
    sig_header text := coalesce(register_webhook.signature_header, 'X-Hub-Signature-256');
    sig_prefix text := coalesce(register_webhook.signature_prefix, 'sha256=');
    key_header text := coalesce(register_webhook.idempotency_header, 'Idempotency-Key');
    body_limit integer := coalesce(register_webhook.max_body_bytes, 1048576);
    kept_secret text;
    kept_hash text;
BEGIN
    IF register_webhook.name IS NULL OR length(register_webhook.name) > 255 OR register_webhook.name !~ name_re THEN
        RAISE EXCEPTION 'invalid webhook name %: letters, digits, _ and - (an optional dotted suffix), '
            'at most 255 characters', quote_nullable(register_webhook.name) USING ERRCODE = 'CVW01';
    END IF;
    -- Two registrations of one name at once: the second waits, then updates what the first
    -- created (rather than failing on the primary key).
    PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.webhook:' || register_webhook.name, 0));
    SELECT * INTO old FROM webhook w WHERE w.name = register_webhook.name FOR UPDATE;
    trig := coalesce(register_webhook.trigger, old.trigger, register_webhook.name);
    IF length(trig) > 255 OR trig !~ name_re THEN
        RAISE EXCEPTION 'invalid trigger name %', quote_literal(trig) USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.auth IS NULL OR register_webhook.auth NOT IN ('none', 'bearer', 'hmac') THEN
        RAISE EXCEPTION 'invalid webhook auth %: none, bearer or hmac', quote_nullable(register_webhook.auth)
            USING ERRCODE = 'CVW01';
    END IF;
    IF sig_header !~ header_re OR key_header !~ header_re THEN
        RAISE EXCEPTION 'invalid header name % or %: an HTTP header name (letters, digits, -), at most 255',
            quote_literal(sig_header), quote_literal(key_header) USING ERRCODE = 'CVW01';
    END IF;
    IF length(sig_prefix) > 64 THEN
        RAISE EXCEPTION 'signature prefix longer than 64 characters' USING ERRCODE = 'CVW01';
    END IF;
    IF body_limit NOT BETWEEN 1 AND 67108864 THEN
        RAISE EXCEPTION 'max_body_bytes % out of range: 1 to 67108864 (64 MiB)', body_limit USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.token_hash IS NOT NULL AND register_webhook.token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'token_hash must be the SHA-256 of the token, as 64 lowercase hex digits'
            USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.secret IS NOT NULL AND length(register_webhook.secret) NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION 'an HMAC secret has 1 to 1024 characters' USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.auth <> 'hmac' AND register_webhook.secret IS NOT NULL
       OR register_webhook.auth <> 'bearer' AND register_webhook.token_hash IS NOT NULL THEN
        RAISE EXCEPTION 'auth % takes %', register_webhook.auth,
            CASE register_webhook.auth WHEN 'hmac' THEN 'a secret, not a token'
                                       WHEN 'bearer' THEN 'a token, not a secret'
                                       ELSE 'neither a secret nor a token' END
            USING ERRCODE = 'CVW01';
    END IF;

    -- The trigger first: refused (CVC05) when it exists with another type.
    PERFORM register_trigger(trig, 'webhook', register_webhook.payload_schema, register_webhook.description);

    kept_secret := CASE WHEN register_webhook.auth = 'hmac' THEN
                       coalesce(register_webhook.secret, CASE WHEN old.auth = 'hmac' THEN old.secret END) END;
    kept_hash := CASE WHEN register_webhook.auth = 'bearer' THEN
                     coalesce(register_webhook.token_hash, CASE WHEN old.auth = 'bearer' THEN old.token_hash END) END;
    IF register_webhook.auth = 'hmac' AND kept_secret IS NULL THEN
        RAISE EXCEPTION 'webhook % needs an HMAC secret (auth hmac)', quote_literal(register_webhook.name)
            USING ERRCODE = 'CVW01', HINT = 'generate one: conveyor webhooks create NAME --generate-secret';
    END IF;
    IF register_webhook.auth = 'bearer' AND kept_hash IS NULL THEN
        RAISE EXCEPTION 'webhook % needs a bearer token (auth bearer)', quote_literal(register_webhook.name)
            USING ERRCODE = 'CVW01';
    END IF;
    IF EXISTS (SELECT 1 FROM webhook w WHERE w.trigger = trig AND w.name <> register_webhook.name) THEN
        RAISE EXCEPTION 'trigger % already belongs to another webhook', quote_literal(trig)
            USING ERRCODE = 'CVW01', HINT = 'each webhook has its own trigger';
    END IF;

    IF old.name IS NULL THEN
        INSERT INTO webhook (name, trigger, auth, token_hash, secret, signature_header, signature_prefix,
                             idempotency_header, max_body_bytes, description)
        VALUES (register_webhook.name, trig, register_webhook.auth, kept_hash, kept_secret, sig_header, sig_prefix,
                key_header, body_limit, register_webhook.description);
        created := true;
    ELSE
        UPDATE webhook w
        SET trigger = trig, auth = register_webhook.auth, token_hash = kept_hash, secret = kept_secret,
            signature_header = sig_header, signature_prefix = sig_prefix, idempotency_header = key_header,
            max_body_bytes = body_limit, description = register_webhook.description, updated = now()
        WHERE w.name = register_webhook.name;
        created := false;
    END IF;
END
$_$;

CREATE FUNCTION conveyor.register_workflow(p_ref text, p_definition jsonb, p_source text DEFAULT ''::text, p_description text DEFAULT ''::text, p_parameters_schema jsonb DEFAULT '{"type": "object"}'::jsonb) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    other text;
    v integer;
BEGIN
    SELECT a.runner_type INTO other FROM action a WHERE a.ref = p_ref FOR UPDATE;
    IF FOUND AND other <> 'workflow' THEN
        RAISE EXCEPTION 'action % exists with runner type %: a workflow cannot replace it', p_ref, other
            USING ERRCODE = 'CVC03';
    END IF;
    -- The upsert locks the action row: concurrent registrations of one ref take turns,
    -- and the next statement (a new snapshot) sees the version the previous one added.
    INSERT INTO action AS a (ref, pack, name, description, runner_type, runtime, parameters_schema)
    VALUES (p_ref, split_part(p_ref, '.', 1), substr(p_ref, length(split_part(p_ref, '.', 1)) + 2),
            coalesce(p_description, ''), 'workflow', 'conveyor', coalesce(p_parameters_schema, '{"type": "object"}'))
    ON CONFLICT (ref) DO UPDATE
    SET description = EXCLUDED.description, parameters_schema = EXCLUDED.parameters_schema,
        runner_type = 'workflow', runtime = 'conveyor';
    SELECT coalesce(max(d.version), 0) + 1 INTO v FROM workflow_definition d WHERE d.ref = p_ref;
    INSERT INTO workflow_definition (ref, version, definition, source, description)
    VALUES (p_ref, v, p_definition, coalesce(p_source, ''), coalesce(p_description, ''));
    RETURN v;
END
$$;

CREATE FUNCTION conveyor.release_buffered_slot(schedule_id bigint) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    s schedule;
    waiting timestamptz;
    fired record;
BEGIN
    SELECT * INTO s FROM schedule x WHERE x.id = release_buffered_slot.schedule_id FOR UPDATE;
    IF NOT FOUND OR schedule_running(s.id) IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT ss.slot INTO waiting FROM schedule_slot ss WHERE ss.schedule = s.id AND ss.outcome = 'buffered'
    ORDER BY ss.slot LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    fired := schedule_request(s, waiting, 'scheduled');
    RETURN QUERY
    UPDATE schedule_slot ss SET outcome = fired.outcome, execution = fired.execution_id, event = fired.event_id,
                                error = fired.error
    WHERE ss.schedule = s.id AND ss.slot = waiting AND ss.outcome = 'buffered'
    RETURNING ss.*;
END
$$;

CREATE FUNCTION conveyor.replay_dead_letter(p_id bigint, p_by text, p_skip_replayed boolean, p_routing_key text, p_message_type text, p_payload jsonb) RETURNS TABLE(outcome text, transport text, detail text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    previous text;
    route text;
    said text;
BEGIN
    SELECT coalesce(d.resolution, 'pending') INTO previous FROM dead_letter d WHERE d.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    IF p_skip_replayed AND previous = 'replayed' THEN
        RETURN QUERY SELECT 'skipped'::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    route := replay_message(p_routing_key, p_message_type, p_payload);
    said := format('published again to %s on the %s transport; was %s', p_routing_key,
                   coalesce(route, '?'), previous);
    UPDATE dead_letter d SET resolution = 'replayed', resolved = now(), resolved_by = p_by, detail = said
    WHERE d.id = p_id;
    RETURN QUERY SELECT 'replayed'::text, route, said;
END
$$;

CREATE FUNCTION conveyor.replay_event(event_id bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    replayed bigint;
BEGIN
    INSERT INTO event (trigger, payload, source, replay_of)
    SELECT e.trigger, e.payload, 'replay', e.id FROM event e WHERE e.id = replay_event.event_id
    RETURNING id INTO replayed;
    IF replayed IS NULL THEN
        RAISE EXCEPTION 'no event %', replay_event.event_id USING ERRCODE = 'CVN05';
    END IF;
    INSERT INTO event_pending (event) VALUES (replayed);
    RETURN replayed;
END
$$;

CREATE FUNCTION conveyor.replay_events(trigger text, since timestamp with time zone, until timestamp with time zone DEFAULT now()) RETURNS TABLE(original bigint, replay bigint)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM trigger t WHERE t.name = replay_events.trigger) THEN
        RAISE EXCEPTION 'unknown trigger %', quote_literal(replay_events.trigger) USING ERRCODE = 'CVE01';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT e.id, e.trigger, e.payload FROM event e
        WHERE e.trigger = replay_events.trigger AND e.received >= since AND e.received < until
              AND e.replay_of IS NULL
        ORDER BY e.id
    ), made AS (
        INSERT INTO event (trigger, payload, source, replay_of)
        SELECT p.trigger, p.payload, 'replay', p.id FROM picked p ORDER BY p.id
        RETURNING id, replay_of
    ), queued AS (
        INSERT INTO event_pending (event) SELECT m.id FROM made m RETURNING event
    )
    SELECT m.replay_of, m.id FROM made m ORDER BY m.id;
END
$$;

CREATE FUNCTION conveyor.replay_message(p_routing_key text, p_message_type text, p_payload jsonb) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    route text;
BEGIN
    SELECT coalesce(r.transport, 'postgres') INTO route FROM transport_route r;
    IF route = 'rabbitmq' THEN
        INSERT INTO outbox (exchange, routing_key, message_type, payload)
        VALUES ('executions', p_routing_key, p_message_type, p_payload);
    ELSIF p_routing_key LIKE 'execution.scheduled.worker.%' THEN
        PERFORM wake('worker', '{}', ARRAY[substr(p_routing_key, length('execution.scheduled.worker.') + 1)::bigint]);
    ELSIF p_routing_key = 'execution.completed' THEN
        PERFORM wake('completed', ARRAY(SELECT jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(p_payload -> 'execution_ids') = 'array' THEN p_payload -> 'execution_ids'
                 ELSE '[]' END)::bigint));
    ELSIF p_routing_key = 'worker.capacity' THEN
        PERFORM wake('capacity');
    ELSE
        PERFORM wake('requested');
    END IF;
    RETURN route;
END
$$;

CREATE FUNCTION conveyor.request_execution(action_ref text, parameters jsonb DEFAULT '{}'::jsonb, parent bigint DEFAULT NULL::bigint, idempotency_key text DEFAULT NULL::text, not_before timestamp with time zone DEFAULT NULL::timestamp with time zone, enforcement bigint DEFAULT NULL::bigint) RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $_$
    SELECT execution_id FROM request_execution_once($1, $2, $3, $4, $5, $6)
$_$;

CREATE FUNCTION conveyor.request_execution_batch(refs text[], parameters jsonb, not_before timestamp with time zone[] DEFAULT NULL::timestamp with time zone[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    SET jit TO 'off'
    AS $$  -- jit: see parameters_refused
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

CREATE FUNCTION conveyor.request_execution_once(action_ref text, parameters jsonb, parent bigint, idempotency_key text, not_before timestamp with time zone DEFAULT NULL::timestamp with time zone, enforcement bigint DEFAULT NULL::bigint, OUT execution_id bigint, OUT repeated boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    params jsonb := coalesce(request_execution_once.parameters, '{}');
    -- A time already past is no delay: NULL keeps such rows out of next_not_before's index.
    delay_until timestamptz := CASE WHEN request_execution_once.not_before > now()
                                    THEN request_execution_once.not_before END;
    action_schema jsonb;
    problems text[];
    earlier record;
    turns integer := 0;
BEGIN
    IF idempotency_key IS NOT NULL AND length(idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'an idempotency key must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        turns := turns + 1;
        IF turns > 3 THEN  -- a key that keeps appearing and vanishing (purged meanwhile): give up
            RAISE EXCEPTION 'idempotency key % is changing under this request; retry it', quote_literal(idempotency_key)
                USING ERRCODE = 'serialization_failure';
        END IF;
        IF idempotency_key IS NOT NULL THEN
            SELECT e.id, e.action_ref, e.parameters, e.parent INTO earlier
            FROM execution_idempotency k JOIN execution e ON e.id = k.execution
            WHERE k.key = idempotency_key;
            IF FOUND THEN
                IF earlier.action_ref IS DISTINCT FROM request_execution_once.action_ref
                   OR earlier.parameters IS DISTINCT FROM params
                   OR earlier.parent IS DISTINCT FROM request_execution_once.parent THEN
                    RAISE EXCEPTION 'idempotency key % was already used for another request (execution %)',
                        quote_literal(idempotency_key), earlier.id
                        USING ERRCODE = 'CVA03',
                              HINT = 'send a new key for a new request; a retry must repeat the request unchanged';
                END IF;
                execution_id := earlier.id;
                repeated := true;
                RETURN;
            END IF;
        END IF;
        IF problems IS NULL THEN  -- validated once, even when the loop comes round again
            SELECT a.parameters_schema INTO action_schema FROM action a
            WHERE a.ref = request_execution_once.action_ref;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown action %', quote_literal(request_execution_once.action_ref)
                    USING ERRCODE = 'CVA01', HINT = 'no worker has registered this action';
            END IF;
            problems := validate_parameters(action_schema, params);
            IF cardinality(problems) > 0 THEN
                RAISE EXCEPTION 'invalid parameters for %: %', request_execution_once.action_ref,
                    array_to_string(problems, '; ')
                    USING ERRCODE = 'CVA02';
            END IF;
        END IF;
        execution_id := nextval(pg_get_serial_sequence('execution', 'id'));
        IF idempotency_key IS NOT NULL THEN
            INSERT INTO execution_idempotency (key, execution) VALUES (idempotency_key, execution_id)
            ON CONFLICT (key) DO NOTHING;
        END IF;
        IF idempotency_key IS NULL OR FOUND THEN
            -- (The executors are woken by the insert trigger of 0009; they then wait for
            -- next_not_before.)
            INSERT INTO execution (id, action_ref, parameters, parent, not_before, enforcement)
            VALUES (execution_id, request_execution_once.action_ref, params, request_execution_once.parent,
                    delay_until, request_execution_once.enforcement);
            repeated := false;
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION conveyor.request_executions(refs text[], parameters jsonb[]) RETURNS SETOF bigint
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    SELECT request_execution_batch(refs, coalesce(to_jsonb(parameters), '[]'), NULL)
$$;

CREATE FUNCTION conveyor.request_executions(refs text[], parameters jsonb[], not_before timestamp with time zone[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF cardinality(refs) <> cardinality(parameters) OR cardinality(refs) <> cardinality(not_before) THEN
        RAISE EXCEPTION 'request_executions: % refs, % parameters and % not_before times',
            cardinality(refs), cardinality(parameters), cardinality(not_before)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY SELECT request_execution_batch(refs, coalesce(to_jsonb(parameters), '[]'), not_before);
END
$$;

CREATE FUNCTION conveyor.requested_candidates(refs text[], lim integer) RETURNS bigint[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'conveyor'
    SET enable_sort TO 'off'
    SET enable_incremental_sort TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET enable_bitmapscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN ARRAY(
        SELECT c.id FROM unnest(refs) AS r(ref) CROSS JOIN LATERAL (
            SELECT e.id FROM execution e
            WHERE e.status = 'requested' AND e.action_ref >= r.ref AND e.action_ref <= r.ref
              AND (e.not_before IS NULL OR e.not_before <= now())
              AND NOT EXISTS (SELECT 1 FROM execution_admission_queue q WHERE q.execution = e.id)
            ORDER BY e.action_ref, e.id
            LIMIT lim
        ) c
        ORDER BY c.id
        LIMIT lim);
END
$$;

CREATE FUNCTION conveyor.rerun_execution(p_id bigint, p_from_failed boolean, p_by text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    old execution;
    wf workflow_execution;
    new_id bigint;
    new_wf bigint;
    reset jsonb;
BEGIN
    SELECT * INTO old FROM execution e WHERE e.id = p_id;
    SELECT * INTO wf FROM workflow_execution w WHERE w.execution = p_id;
    IF old.id IS NULL OR wf.id IS NULL THEN
        RAISE EXCEPTION 'execution % is not a workflow execution', p_id USING ERRCODE = 'CVN04';
    END IF;
    IF old.status NOT IN ('failed', 'cancelled', 'timeout', 'abandoned') THEN
        RAISE EXCEPTION 'workflow execution % is %: only a failed or cancelled workflow can be rerun', p_id, old.status
            USING ERRCODE = 'CVC04';
    END IF;
    INSERT INTO execution (action_ref, parameters) VALUES (old.action_ref, old.parameters)
    RETURNING execution.id INTO new_id;
    IF NOT p_from_failed THEN
        RETURN new_id;  -- started like any request (start_workflows), rerun_of unset
    END IF;
    -- The state is copied whole, as the failed execution left it: the conductor's rerun
    -- (workflows/conductor.py) starts each failed task instance again as a new iteration
    -- and keeps what completed (and the succeeded instances' results). A cancelled
    -- instance, or one still running when a workflow timeout ended the workflow (its
    -- children were cancelled), is copied as failed: the rerun starts it again too.
    INSERT INTO workflow_execution (execution, workflow_ref, version, status, context, errors, depth, cancel_policy,
                                    rerun_of)
    VALUES (new_id, wf.workflow_ref, wf.version, 'running', wf.context, '[]', 0, 'allow_finish', wf.id)
    RETURNING workflow_execution.id INTO new_wf;
    SELECT coalesce(jsonb_agg(jsonb_build_array(t.task_name, t.iteration) ORDER BY t.task_name, t.iteration), '[]')
    INTO reset FROM workflow_task t
    WHERE t.workflow_execution = wf.id AND t.status IN ('failed', 'cancelled', 'running');
    INSERT INTO workflow_task (workflow_execution, task_name, iteration, status, arrivals, items_total, items,
                               concurrency, result, error, ended)
    SELECT new_wf, t.task_name, t.iteration,
           CASE WHEN t.status IN ('cancelled', 'running') THEN 'failed' ELSE t.status END,
           t.arrivals, t.items_total, t.items, t.concurrency, t.result, t.error, t.ended
    FROM workflow_task t
    WHERE t.workflow_execution = wf.id;
    INSERT INTO workflow_task_dispatch (workflow_execution, task_name, task_index, iteration, execution, retry,
                                       status, result)
    SELECT new_wf, d.task_name, d.task_index, d.iteration, d.execution, d.retry,
           CASE WHEN d.status = 'running' THEN 'cancelled' ELSE d.status END, d.result
    FROM workflow_task_dispatch d
    WHERE d.workflow_execution = wf.id;
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (new_wf, 'rerun', jsonb_build_object('tasks', reset, 'by', p_by, 'rerun_of', p_id));
    RETURN new_id;
END
$$;

CREATE FUNCTION conveyor.respond_inquiry(p_id bigint, p_responder text, p_role text, p_data jsonb) RETURNS TABLE(outcome text, inquiry bigint, execution bigint, status text, responders text[])
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    eid bigint;
    q inquiry;
    execution_status text;
    who text[];
    answers jsonb;
BEGIN
    SELECT i.execution INTO eid FROM inquiry i WHERE i.id = p_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', p_id, NULL::bigint, NULL::text, NULL::text[];
        RETURN;
    END IF;
    -- Execution first, then inquiry: the order cancel_execution and expire_inquiries use.
    -- Concurrent answers queue here; each then sees what the one before it did.
    SELECT e.status INTO execution_status FROM execution e WHERE e.id = eid FOR NO KEY UPDATE;
    SELECT * INTO q FROM inquiry i WHERE i.id = p_id FOR UPDATE;
    who := ARRAY(SELECT r.responder FROM inquiry_response r WHERE r.inquiry = p_id ORDER BY r.id);
    IF q.status <> 'pending' OR execution_status IS DISTINCT FROM 'pending' THEN
        RETURN QUERY SELECT 'not_pending', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF NOT (p_responder = ANY(q.assignees)
            OR (cardinality(q.assignees) = 0 AND coalesce(inquiry_role_rank(p_role), 0) >= inquiry_role_rank('operator'))
            OR EXISTS (SELECT 1 FROM unnest(q.assignees) a
                       WHERE coalesce(inquiry_role_rank(p_role), 0) >= inquiry_role_rank(a))) THEN
        RETURN QUERY SELECT 'not_assignee', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF q.forbid_requester AND q.requester IS NOT NULL AND q.requester = p_responder THEN
        RETURN QUERY SELECT 'requester_forbidden', p_id, eid, q.status, who;
        RETURN;
    END IF;
    IF p_responder = ANY(who) THEN
        RETURN QUERY SELECT 'already_responded', p_id, eid, q.status, who;
        RETURN;
    END IF;
    INSERT INTO inquiry_response (inquiry, responder, role, data) VALUES (p_id, p_responder, p_role, p_data);
    who := who || p_responder;
    IF cardinality(who) < q.quorum THEN
        UPDATE inquiry i SET updated = now() WHERE i.id = p_id;
        RETURN QUERY SELECT 'recorded', p_id, eid, q.status, who;
        RETURN;
    END IF;
    SELECT jsonb_agg(jsonb_build_object('responder', r.responder, 'data', r.data) ORDER BY r.id) INTO answers
    FROM inquiry_response r WHERE r.inquiry = p_id;
    UPDATE inquiry i SET status = 'responded', response = p_data, responded = now(), updated = now()
    WHERE i.id = p_id AND i.status = 'pending';
    UPDATE execution e
    SET status = 'completed', ended = now(),
        result = jsonb_build_object('succeeded', true, 'response', p_data, 'responders', to_jsonb(who),
                                    'responses', answers)
    WHERE e.id = eid AND e.status = 'pending';
    RETURN QUERY SELECT 'answered', p_id, eid, 'responded'::text, who;
END
$$;

CREATE FUNCTION conveyor.resume_execution(p_id bigint, p_by text) RETURNS TABLE(id bigint, was text, now text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    -- (0036) The state row before the execution row: the advancement's order.
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wf_id IS NULL OR current <> 'paused' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'running' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'running' WHERE e.id = p_id AND e.status = 'paused';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'resume', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'running'::text;
END
$$;

CREATE FUNCTION conveyor.resume_schedule(name text) RETURNS TABLE(schedule_id bigint, was boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    RETURN QUERY
    WITH old AS (SELECT s.id, s.paused FROM schedule s WHERE s.name = resume_schedule.name FOR UPDATE),
    moved AS (UPDATE schedule s SET paused = false, next_fire = now(), updated = now() FROM old
              WHERE s.id = old.id AND old.paused RETURNING s.id)
    SELECT old.id, old.paused FROM old;
END
$$;

CREATE FUNCTION conveyor.revoke_api_token(p_id bigint) RETURNS TABLE(id bigint)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    UPDATE api_token t SET revoked = now() WHERE t.id = p_id AND t.revoked IS NULL RETURNING t.id
$$;

CREATE FUNCTION conveyor.root_requester(p_execution bigint) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    WITH RECURSIVE up AS (
        SELECT e.id, e.parent, e.requested_by, 0 AS depth FROM execution e WHERE e.id = p_execution
        UNION ALL
        SELECT p.id, p.parent, p.requested_by, up.depth + 1
        FROM up JOIN execution p ON p.id = up.parent
        WHERE up.depth < 100
    )
    SELECT requested_by FROM up ORDER BY depth DESC LIMIT 1
$$;

CREATE TABLE conveyor.schedule (
    id bigint NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    cron text,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    every interval,
    at timestamp with time zone,
    starts timestamp with time zone,
    ends timestamp with time zone,
    action_ref text,
    parameters jsonb DEFAULT '{}'::jsonb NOT NULL,
    trigger text,
    catchup text DEFAULT 'latest'::text NOT NULL,
    catchup_window interval DEFAULT '01:00:00'::interval NOT NULL,
    overlap text DEFAULT 'allow'::text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    next_fire timestamp with time zone,
    last_slot timestamp with time zone,
    description text,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedule_catchup_check CHECK ((catchup = ANY (ARRAY['skip'::text, 'latest'::text, 'all'::text]))),
    CONSTRAINT schedule_catchup_window_check CHECK ((catchup_window >= '00:00:00'::interval)),
    CONSTRAINT schedule_check CHECK (((kind = 'cron'::text) = (cron IS NOT NULL))),
    CONSTRAINT schedule_check1 CHECK (((kind = 'interval'::text) = (every IS NOT NULL))),
    CONSTRAINT schedule_check2 CHECK (((kind = 'date'::text) = (at IS NOT NULL))),
    CONSTRAINT schedule_check3 CHECK (((action_ref IS NOT NULL) OR (trigger IS NOT NULL))),
    CONSTRAINT schedule_cron_check CHECK ((length(cron) <= 255)),
    CONSTRAINT schedule_every_check CHECK (((every IS NULL) OR (every >= '00:00:01'::interval))),
    CONSTRAINT schedule_kind_check CHECK ((kind = ANY (ARRAY['cron'::text, 'interval'::text, 'date'::text]))),
    CONSTRAINT schedule_name_check CHECK (((length(name) <= 255) AND (name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'::text))),
    CONSTRAINT schedule_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text, 'buffer_one'::text, 'cancel_previous'::text]))),
    CONSTRAINT schedule_parameters_check CHECK ((jsonb_typeof(parameters) = 'object'::text)),
    CONSTRAINT schedule_timezone_check CHECK ((length(timezone) <= 64))
);

CREATE FUNCTION conveyor.schedule_fire_slot(s conveyor.schedule, slot timestamp with time zone, origin text, decision text) RETURNS SETOF conveyor.schedule_slot
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    made schedule_slot;
    fired record;
BEGIN
    -- fired: the clock now, not the transaction's start -- a pass deciding many schedules
    -- reports each slot's true lag.
    INSERT INTO schedule_slot AS ss (schedule, slot, origin, outcome, fired)
    VALUES (s.id, slot, origin, CASE decision WHEN 'skip' THEN 'skipped' WHEN 'miss' THEN 'missed'
                                              WHEN 'buffer' THEN 'buffered' ELSE 'requested' END,
            greatest(clock_timestamp(), now()))
    ON CONFLICT ON CONSTRAINT schedule_slot_pkey DO NOTHING
    RETURNING * INTO made;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF decision = 'fire' THEN
        fired := schedule_request(s, slot, origin);
        UPDATE schedule_slot ss SET outcome = fired.outcome, execution = fired.execution_id, event = fired.event_id,
                                    error = fired.error
        WHERE ss.schedule = s.id AND ss.slot = schedule_fire_slot.slot
        RETURNING * INTO made;
    ELSIF decision NOT IN ('skip', 'miss', 'buffer') THEN
        RAISE EXCEPTION 'unknown slot decision %', decision;
    END IF;
    RETURN NEXT made;
END
$$;

CREATE FUNCTION conveyor.schedule_not_found(name text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    RAISE EXCEPTION 'no schedule %', quote_literal(name)
        USING ERRCODE = 'CVN06', HINT = 'see conveyor schedules list';
END
$$;

CREATE FUNCTION conveyor.schedule_request(s conveyor.schedule, slot timestamp with time zone, origin text, OUT outcome text, OUT execution_id bigint, OUT event_id bigint, OUT error text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    before text := coalesce(current_setting('conveyor.requested_by', true), '');
BEGIN
    BEGIN
        IF s.action_ref IS NOT NULL THEN
            PERFORM set_config('conveyor.requested_by', 'schedule:' || s.name, true);
            execution_id := request_execution(s.action_ref, s.parameters);
            PERFORM set_config('conveyor.requested_by', before, true);
            outcome := 'requested';
        ELSE
            event_id := emit_event(s.trigger, jsonb_build_object('schedule', s.name, 'slot', slot, 'origin', origin),
                                   'schedule');
            outcome := 'emitted';
        END IF;
    EXCEPTION WHEN SQLSTATE 'CVA01' OR SQLSTATE 'CVA02' OR SQLSTATE 'CVE01' OR SQLSTATE 'CVE02' THEN
        outcome := 'request_error';
        error := SQLERRM;
        execution_id := NULL;
        event_id := NULL;
    END;
END
$$;

CREATE FUNCTION conveyor.schedule_running(schedule_id bigint) RETURNS bigint
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

CREATE FUNCTION conveyor.schedule_wake() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    PERFORM wake('schedule');
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.set_admission_policy(p_target text, p_concurrency integer, p_parameters text[], p_method text) RETURNS SETOF conveyor.admission_policy
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    INSERT INTO admission_policy AS p (target, concurrency, parameters, method, source)
    VALUES (p_target, p_concurrency, p_parameters, p_method, 'operator')
    ON CONFLICT (target) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, parameters = EXCLUDED.parameters,
        method = EXCLUDED.method, source = 'operator'
    RETURNING p.*
$$;

CREATE FUNCTION conveyor.set_rule_enabled(ref text, enabled boolean) RETURNS TABLE(rule_id bigint, was boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH old AS (SELECT r.id, r.enabled FROM rule r WHERE r.ref = set_rule_enabled.ref FOR UPDATE)
    UPDATE rule r SET enabled = set_rule_enabled.enabled, updated = now()
    FROM old WHERE r.id = old.id
    RETURNING r.id, old.enabled;
END
$$;

CREATE FUNCTION conveyor.set_transport_route(p_transport text) RETURNS TABLE(was text)
    LANGUAGE sql
    SET search_path TO 'conveyor'
    AS $$
    WITH old AS (SELECT transport FROM transport_route FOR UPDATE)
    UPDATE transport_route r SET transport = p_transport, updated = now()
    FROM old WHERE r.singleton AND old.transport IS DISTINCT FROM p_transport
    RETURNING old.transport
$$;

CREATE FUNCTION conveyor.set_webhook_enabled(name text, enabled boolean) RETURNS TABLE(was boolean)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH old AS (SELECT w.name, w.enabled FROM webhook w WHERE w.name = set_webhook_enabled.name FOR UPDATE)
    UPDATE webhook w SET enabled = set_webhook_enabled.enabled, updated = now()
    FROM old WHERE w.name = old.name
    RETURNING old.enabled;
END
$$;

CREATE FUNCTION conveyor.stamp_server_epoch() RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    found_epoch timestamptz := current_server_epoch();
BEGIN
    IF found_epoch IS NULL THEN
        INSERT INTO server_epoch (postmaster_start, epoch) VALUES (pg_postmaster_start_time(), clock_timestamp())
        ON CONFLICT (singleton) DO UPDATE SET postmaster_start = EXCLUDED.postmaster_start, epoch = EXCLUDED.epoch
            WHERE server_epoch.postmaster_start IS DISTINCT FROM EXCLUDED.postmaster_start;
        found_epoch := current_server_epoch();
    END IF;
    RETURN found_epoch;
END
$$;

CREATE FUNCTION conveyor.start_workflows(ids bigint[], executor text, p_max_depth integer DEFAULT 10) RETURNS TABLE(id bigint, status text, error text)
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
#variable_conflict use_column
DECLARE
    r record;
    d workflow_definition;
    depth integer;
    problem text;
    wf_id bigint;
BEGIN
    FOR r IN SELECT e.id, e.action_ref, e.parent, e.parameters FROM execution e
             WHERE e.id = ANY(ids) AND e.status = 'scheduling' AND e.executor = start_workflows.executor
             ORDER BY e.id FOR UPDATE LOOP
        problem := NULL;
        SELECT pw.depth + 1 INTO depth FROM workflow_execution pw WHERE pw.execution = r.parent;
        depth := coalesce(depth, 0);
        SELECT * INTO d FROM workflow_definition wd
        WHERE wd.ref = r.action_ref AND wd.deleted IS NULL ORDER BY wd.version DESC LIMIT 1;
        IF depth > p_max_depth THEN
            problem := format('workflow %s nested too deep: depth %s exceeds workflow.max_depth (%s)',
                              r.action_ref, depth, p_max_depth);
        ELSIF d.ref IS NULL AND NOT EXISTS (SELECT 1 FROM workflow_execution w WHERE w.execution = r.id) THEN
            problem := format('workflow %s was deleted (or never registered)', r.action_ref);
        END IF;
        IF problem IS NOT NULL THEN
            UPDATE execution e SET status = 'failed', ended = now(), not_before = NULL,
                result = jsonb_build_object('succeeded', false, 'error', problem, 'failed_by', 'scheduler')
            WHERE e.id = r.id AND e.status = 'scheduling';
            RETURN QUERY SELECT r.id, 'failed'::text, problem;
            CONTINUE;
        END IF;
        UPDATE execution e SET status = 'running', started = now(), not_before = NULL
        WHERE e.id = r.id AND e.status = 'scheduling';
        wf_id := NULL;
        IF NOT EXISTS (SELECT 1 FROM workflow_execution w WHERE w.execution = r.id) THEN
            INSERT INTO workflow_execution (execution, workflow_ref, version, depth, deadline)
            VALUES (r.id, d.ref, d.version, depth,
                    CASE WHEN jsonb_typeof(d.definition -> 'timeout') = 'number'
                         THEN now() + make_interval(secs => (d.definition ->> 'timeout')::float8) END)
            ON CONFLICT ON CONSTRAINT uq_workflow_execution_execution DO NOTHING
            RETURNING workflow_execution.id INTO wf_id;
        END IF;
        IF wf_id IS NOT NULL THEN
            INSERT INTO workflow_event (workflow_execution, kind) VALUES (wf_id, 'start');
        END IF;
        RETURN QUERY SELECT r.id, 'running'::text, NULL::text;
    END LOOP;
END
$$;

CREATE FUNCTION conveyor.terminal_statuses() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT ARRAY['completed', 'failed', 'timeout', 'cancelled', 'abandoned']
$$;

CREATE FUNCTION conveyor.touch_updated() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.updated := now();
    RETURN NEW;
END
$$;

CREATE FUNCTION conveyor.validate_parameters(schema jsonb, params jsonb) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    problems text[] := '{}';
    key text;
    prop jsonb;
    val jsonb;
    types jsonb;
BEGIN
    IF jsonb_typeof(params) <> 'object' THEN
        RETURN ARRAY['parameters must be a JSON object'];
    END IF;
    FOR key IN SELECT jsonb_array_elements_text(coalesce(schema -> 'required', '[]')) LOOP
        IF NOT params ? key THEN
            problems := problems || format('%s is required', key);
        END IF;
    END LOOP;
    FOR key, val IN SELECT * FROM jsonb_each(params) LOOP
        prop := schema -> 'properties' -> key;
        IF prop IS NULL THEN
            -- A key matching a patternProperties pattern is declared, not additional
            -- (its value is left to the executor's full validation).
            IF schema -> 'additionalProperties' = 'false'::jsonb AND NOT EXISTS (
                SELECT 1 FROM jsonb_object_keys(coalesce(schema -> 'patternProperties', '{}')) p
                WHERE key ~ p
            ) THEN
                problems := problems || format('%s is not a parameter of this action', key);
            END IF;
            CONTINUE;
        END IF;
        types := CASE jsonb_typeof(prop -> 'type')
            WHEN 'string' THEN jsonb_build_array(prop -> 'type')
            WHEN 'array' THEN prop -> 'type'
            ELSE NULL END;
        IF types IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(types) t WHERE json_type_matches(val, t)
        ) THEN
            problems := problems || format('%s must be of type %s, got %s', key,
                array_to_string(ARRAY(SELECT jsonb_array_elements_text(types)), ' or '), val::text);
            CONTINUE;
        END IF;
        IF prop ? 'enum' AND NOT (prop -> 'enum') @> jsonb_build_array(val) THEN
            problems := problems || format('%s must be one of %s, got %s', key, prop ->> 'enum', val::text);
        END IF;
        IF jsonb_typeof(val) = 'number' THEN
            IF prop ? 'minimum' AND val::text::numeric < (prop ->> 'minimum')::numeric THEN
                problems := problems || format('%s must be >= %s, got %s', key, prop ->> 'minimum', val::text);
            END IF;
            IF prop ? 'maximum' AND val::text::numeric > (prop ->> 'maximum')::numeric THEN
                problems := problems || format('%s must be <= %s, got %s', key, prop ->> 'maximum', val::text);
            END IF;
        END IF;
        IF jsonb_typeof(val) = 'string' THEN
            IF prop ? 'minLength' AND length(val #>> '{}') < (prop ->> 'minLength')::int THEN
                problems := problems || format('%s must be at least %s characters', key, prop ->> 'minLength');
            END IF;
            IF prop ? 'maxLength' AND length(val #>> '{}') > (prop ->> 'maxLength')::int THEN
                problems := problems || format('%s must be at most %s characters', key, prop ->> 'maxLength');
            END IF;
        END IF;
    END LOOP;
    RETURN problems;
END
$$;

CREATE FUNCTION conveyor.wake(topic text, execution_ids bigint[] DEFAULT '{}'::bigint[], worker_ids bigint[] DEFAULT '{}'::bigint[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    route text;
    w bigint;
BEGIN
    SELECT r.transport INTO route FROM transport_route r;
    IF topic = 'workflow' THEN
        -- (0013) Workflow executions have events to apply.
        PERFORM pg_notify(current_schema() || '.workflow', '');
    ELSIF topic = 'requested' THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
    ELSIF topic = 'completed' THEN
        PERFORM pg_notify(current_schema() || '.completed', wake_payload(execution_ids));
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'execution.completed', 'execution.completed',
                    jsonb_build_object('execution_ids', to_jsonb(execution_ids)));
        END IF;
    ELSIF topic = 'capacity' THEN
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'worker.capacity', 'worker.capacity',
                    jsonb_build_object('worker_ids', to_jsonb(ARRAY(
                        SELECT DISTINCT x FROM unnest(worker_ids) x ORDER BY x))));
        ELSE
            PERFORM pg_notify(current_schema() || '.capacity', '');
        END IF;
    ELSIF topic = 'dispatched' THEN
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload, execution)
            SELECT 'executions', 'execution.scheduled.worker.' || e.worker, 'execution.scheduled',
                   jsonb_build_object('execution_id', e.id, 'attempt', e.attempt, 'worker_id', e.worker,
                                      'scheduled', e.scheduled),
                   e.id
            FROM execution e
            WHERE e.id = ANY(execution_ids) AND e.status = 'scheduled'
            ORDER BY e.id;
        ELSE
            FOR w IN SELECT DISTINCT x FROM unnest(worker_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
                PERFORM pg_notify(current_schema() || '.worker.' || w, '');
            END LOOP;
        END IF;
    ELSIF topic = 'worker' THEN
        IF route = 'rabbitmq' THEN
            -- The message says "look now", as every message does: the worker finds the
            -- cancel in its rows (a copy dead-lettered later is resolved stale).
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            SELECT 'executions', 'execution.scheduled.worker.' || e.worker, 'execution.scheduled',
                   jsonb_build_object('execution_id', e.id, 'attempt', e.attempt, 'worker_id', e.worker,
                                      'scheduled', e.scheduled)
            FROM execution e
            WHERE e.id = ANY(execution_ids) AND e.worker IS NOT NULL
            ORDER BY e.id;
        ELSE
            FOR w IN SELECT DISTINCT x FROM unnest(worker_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
                PERFORM pg_notify(current_schema() || '.worker.' || w, '');
            END LOOP;
        END IF;
    ELSIF topic = 'inquiry' THEN
        -- (0014) The inquiries of these asking executions were created.
        PERFORM pg_notify(current_schema() || '.inquiry', wake_payload(ARRAY(
            SELECT i.id FROM inquiry i WHERE i.execution = ANY(execution_ids) ORDER BY i.id)));
        IF route = 'rabbitmq' THEN
            INSERT INTO outbox (exchange, routing_key, message_type, payload)
            VALUES ('executions', 'inquiry.created', 'inquiry.created',
                    jsonb_build_object('inquiry_ids', to_jsonb(ARRAY(
                                           SELECT i.id FROM inquiry i WHERE i.execution = ANY(execution_ids)
                                           ORDER BY i.id)),
                                       'execution_ids', to_jsonb(execution_ids)));
        END IF;
    ELSIF topic = 'event' THEN
        -- (0016) Events wait for their rules (event_pending).
        PERFORM pg_notify(current_schema() || '.event', '');
    ELSIF topic = 'schedule' THEN
        -- (0016) A schedule was created or changed: its next fire time may be sooner.
        PERFORM pg_notify(current_schema() || '.schedule', '');
    ELSE
        RAISE EXCEPTION 'unknown wake-up topic %', topic;
    END IF;
END
$$;

CREATE FUNCTION conveyor.wake_payload(ids bigint[]) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN length(p) > 7900 THEN '' ELSE p END
    FROM (SELECT coalesce(array_to_string(ids, ','), '') AS p) s
$$;

CREATE FUNCTION conveyor.worker_load(worker_id bigint) RETURNS integer
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path TO 'conveyor'
    AS $$
    SELECT count(*)::int FROM execution e
    WHERE e.worker = worker_load.worker_id AND e.status = ANY(on_worker_statuses())
$$;

CREATE FUNCTION conveyor.worker_lock_class() RETURNS integer
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT hashtext(current_schema() || '.worker') & 2147483647
$$;

CREATE FUNCTION conveyor.worker_lock_held(worker_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = worker_lock_class()::oid
          AND l.objid = worker_id::oid
    )
$$;

CREATE FUNCTION conveyor.worker_slots_full(worker_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'conveyor'
    AS $$
    SELECT coalesce((SELECT count(*) FROM execution r
                     WHERE r.worker = worker_id AND r.status IN ('running', 'canceling'))
                    >= (SELECT w.capacity FROM worker w WHERE w.id = worker_id), false)
$$;

CREATE FUNCTION conveyor.worker_wake() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    PERFORM wake('capacity', '{}', ARRAY[NEW.id]);
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.workflow_child_ended() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    INSERT INTO workflow_event (workflow_execution, kind, execution)
    SELECT w.id, 'child_ended', NEW.id FROM workflow_execution w WHERE w.execution = NEW.parent
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.workflow_event_wake() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    PERFORM wake('workflow');
    RETURN NULL;
END
$$;

CREATE FUNCTION conveyor.workflow_execution_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_transition t
                   WHERE t.from_status = OLD.status AND t.to_status = NEW.status) THEN
        RAISE EXCEPTION 'illegal workflow transition % -> % (workflow execution %)', OLD.status, NEW.status, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION conveyor.workflow_task_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_task_transition t
                   WHERE t.from_status = OLD.status AND t.to_status = NEW.status) THEN
        RAISE EXCEPTION 'illegal workflow task transition % -> % (task % iteration % of workflow execution %)',
            OLD.status, NEW.status, OLD.task_name, OLD.iteration, OLD.workflow_execution
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION conveyor.workflow_timeouts() RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'conveyor'
    AS $$
DECLARE
    n integer;
    m integer;
BEGIN
    WITH due AS (
        SELECT d.id FROM workflow_task_dispatch d
        WHERE d.deadline <= now() AND d.status = 'running'
        ORDER BY d.id FOR UPDATE SKIP LOCKED
    ), cleared AS (
        UPDATE workflow_task_dispatch d SET deadline = NULL FROM due WHERE d.id = due.id
        RETURNING d.workflow_execution, d.task_name, d.iteration, d.task_index, d.execution
    )
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    SELECT c.workflow_execution, 'timeout',
           jsonb_build_object('task', c.task_name, 'iteration', c.iteration, 'index', c.task_index,
                              'execution', c.execution)
    FROM cleared c;
    GET DIAGNOSTICS n = ROW_COUNT;
    WITH due AS (
        SELECT w.id FROM workflow_execution w
        WHERE w.deadline <= now() AND w.status IN ('running', 'paused', 'canceling')
        ORDER BY w.id FOR UPDATE SKIP LOCKED
    ), cleared AS (
        UPDATE workflow_execution w SET deadline = NULL FROM due WHERE w.id = due.id RETURNING w.id
    )
    INSERT INTO workflow_event (workflow_execution, kind) SELECT c.id, 'timeout' FROM cleared c;
    GET DIAGNOSTICS m = ROW_COUNT;
    RETURN n + m;
END
$$;

CREATE TABLE conveyor.action (
    ref text NOT NULL,
    pack text NOT NULL,
    name text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    runner_type text NOT NULL,
    runtime text NOT NULL,
    parameters_schema jsonb DEFAULT '{"type": "object"}'::jsonb NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT action_ref_check CHECK ((ref ~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$'::text)),
    CONSTRAINT action_runner_type_check CHECK ((runner_type = ANY (ARRAY['python'::text, 'subprocess'::text, 'workflow'::text, 'inquiry'::text])))
);

CREATE TABLE conveyor.api_token (
    id bigint NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    token_hash bytea NOT NULL,
    prefix text NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    last_used timestamp with time zone,
    revoked timestamp with time zone,
    CONSTRAINT api_token_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'admin'::text])))
);

CREATE SEQUENCE conveyor.api_token_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.api_token_id_seq OWNED BY conveyor.api_token.id;

CREATE TABLE conveyor.dead_letter (
    id bigint NOT NULL,
    dedupe_key text NOT NULL,
    message_id text,
    transport text NOT NULL,
    queue text NOT NULL,
    exchange text,
    routing_key text DEFAULT ''::text NOT NULL,
    reason text NOT NULL,
    message_type text,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    execution bigint,
    attempt integer,
    worker bigint,
    error text,
    deliveries integer DEFAULT 1 NOT NULL,
    first_seen timestamp with time zone DEFAULT now() NOT NULL,
    last_seen timestamp with time zone DEFAULT now() NOT NULL,
    resolution text,
    resolved timestamp with time zone,
    resolved_by text,
    detail text,
    CONSTRAINT dead_letter_reason_check CHECK ((reason = ANY (ARRAY['expired'::text, 'rejected'::text, 'poison'::text, 'max_redeliveries'::text]))),
    CONSTRAINT dead_letter_resolution_check CHECK ((resolution = ANY (ARRAY['rescheduled'::text, 'failed'::text, 'stale'::text, 'invalid'::text, 'replayed'::text]))),
    CONSTRAINT dead_letter_transport_check CHECK ((transport = ANY (ARRAY['postgres'::text, 'rabbitmq'::text])))
);

CREATE SEQUENCE conveyor.dead_letter_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.dead_letter_id_seq OWNED BY conveyor.dead_letter.id;

CREATE TABLE conveyor.enforcement (
    id bigint NOT NULL,
    rule bigint,
    rule_ref text NOT NULL,
    event bigint,
    outcome text NOT NULL,
    execution bigint,
    parameters jsonb,
    error text,
    created timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT enforcement_check CHECK (((outcome = 'requested'::text) = (execution IS NOT NULL))),
    CONSTRAINT enforcement_outcome_check CHECK ((outcome = ANY (ARRAY['requested'::text, 'template_error'::text, 'request_error'::text, 'rule_disabled'::text])))
);

ALTER TABLE conveyor.enforcement ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME conveyor.enforcement_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE conveyor.event (
    id bigint NOT NULL,
    trigger text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    source text DEFAULT 'sql'::text NOT NULL,
    received timestamp with time zone DEFAULT now() NOT NULL,
    idempotency_key text,
    replay_of bigint,
    CONSTRAINT event_idempotency_key_check CHECK (((idempotency_key IS NULL) OR ((length(idempotency_key) >= 1) AND (length(idempotency_key) <= 255)))),
    CONSTRAINT event_source_check CHECK ((length(source) <= 255))
);

ALTER TABLE conveyor.event ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME conveyor.event_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE conveyor.event_pending (
    event bigint NOT NULL,
    since timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE conveyor.execution (
    id bigint NOT NULL,
    action_ref text NOT NULL,
    parameters jsonb DEFAULT '{}'::jsonb NOT NULL,
    status text DEFAULT 'requested'::text NOT NULL,
    result jsonb,
    worker bigint,
    executor text,
    parent bigint,
    enforcement bigint,
    attempt integer DEFAULT 0 NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    scheduled timestamp with time zone,
    started timestamp with time zone,
    ended timestamp with time zone,
    not_before timestamp with time zone,
    cancelled_by text,
    requested_by text DEFAULT NULLIF(current_setting('conveyor.requested_by'::text, true), ''::text),
    CONSTRAINT execution_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT execution_status_check CHECK ((status = ANY (ARRAY['requested'::text, 'scheduling'::text, 'scheduled'::text, 'running'::text, 'pending'::text, 'paused'::text, 'completed'::text, 'failed'::text, 'canceling'::text, 'cancelled'::text, 'timeout'::text, 'abandoned'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', vacuum_index_cleanup='on');

CREATE TABLE conveyor.execution_admission_group (
    policy text NOT NULL,
    group_key jsonb NOT NULL,
    next_seq bigint DEFAULT 0 NOT NULL,
    touched timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE conveyor.execution_admission_queue (
    execution bigint NOT NULL,
    policy text NOT NULL,
    group_key jsonb NOT NULL,
    seq bigint NOT NULL,
    enqueued timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE conveyor.execution_admission_slot (
    execution bigint NOT NULL,
    policy text NOT NULL,
    group_key jsonb NOT NULL,
    seq bigint NOT NULL,
    acquired timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE conveyor.execution_attempt (
    execution bigint NOT NULL,
    attempt integer NOT NULL,
    worker bigint,
    worker_name text NOT NULL,
    scheduled timestamp with time zone DEFAULT now() NOT NULL,
    started timestamp with time zone,
    ended timestamp with time zone,
    outcome text,
    error text,
    republished timestamp with time zone,
    CONSTRAINT execution_attempt_attempt_check CHECK ((attempt > 0))
);

CREATE SEQUENCE conveyor.execution_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.execution_id_seq OWNED BY conveyor.execution.id;

CREATE TABLE conveyor.execution_idempotency (
    key text NOT NULL,
    execution bigint NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT execution_idempotency_key_check CHECK (((length(key) >= 1) AND (length(key) <= 255)))
);

CREATE TABLE conveyor.execution_output (
    id bigint NOT NULL,
    execution bigint NOT NULL,
    attempt integer NOT NULL,
    stream text NOT NULL,
    data bytea NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT execution_output_data_check CHECK ((length(data) > 0)),
    CONSTRAINT execution_output_stream_check CHECK ((stream = ANY (ARRAY['stdout'::text, 'stderr'::text, 'log'::text])))
);

ALTER TABLE conveyor.execution_output ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME conveyor.execution_output_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE conveyor.execution_transition (
    from_status text NOT NULL,
    to_status text NOT NULL
);

CREATE TABLE conveyor.inquiry (
    id bigint NOT NULL,
    execution bigint NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    prompt text NOT NULL,
    schema jsonb DEFAULT '{}'::jsonb NOT NULL,
    assignees text[] DEFAULT '{}'::text[] NOT NULL,
    quorum integer DEFAULT 1 NOT NULL,
    forbid_requester boolean DEFAULT false NOT NULL,
    requester text,
    ttl double precision,
    deadline timestamp with time zone,
    on_timeout jsonb DEFAULT '"fail"'::jsonb NOT NULL,
    response jsonb,
    responded timestamp with time zone,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT inquiry_on_timeout_check CHECK (((on_timeout = '"fail"'::jsonb) OR ((jsonb_typeof(on_timeout) = 'object'::text) AND (on_timeout ? 'default'::text)))),
    CONSTRAINT inquiry_quorum_check CHECK ((quorum >= 1)),
    CONSTRAINT inquiry_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'responded'::text, 'timeout'::text, 'cancelled'::text]))),
    CONSTRAINT inquiry_ttl_check CHECK ((ttl > (0)::double precision))
);

CREATE SEQUENCE conveyor.inquiry_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.inquiry_id_seq OWNED BY conveyor.inquiry.id;

CREATE TABLE conveyor.inquiry_response (
    id bigint NOT NULL,
    inquiry bigint NOT NULL,
    responder text NOT NULL,
    role text,
    data jsonb NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL
);

CREATE SEQUENCE conveyor.inquiry_response_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.inquiry_response_id_seq OWNED BY conveyor.inquiry_response.id;

CREATE TABLE conveyor.outbox (
    id bigint NOT NULL,
    message_id uuid DEFAULT gen_random_uuid() NOT NULL,
    exchange text NOT NULL,
    routing_key text NOT NULL,
    message_type text NOT NULL,
    payload jsonb NOT NULL,
    execution bigint,
    created timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT outbox_exchange_check CHECK ((exchange = ANY (ARRAY['executions'::text, 'events'::text, 'dlx'::text])))
);

CREATE SEQUENCE conveyor.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.outbox_id_seq OWNED BY conveyor.outbox.id;

CREATE TABLE conveyor.rule (
    id bigint NOT NULL,
    ref text NOT NULL,
    trigger text NOT NULL,
    criteria jsonb DEFAULT '{}'::jsonb NOT NULL,
    action_ref text NOT NULL,
    parameters jsonb DEFAULT '{}'::jsonb NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    description text,
    definition jsonb,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT rule_parameters_check CHECK ((jsonb_typeof(parameters) = 'object'::text)),
    CONSTRAINT rule_ref_check CHECK (((length(ref) <= 255) AND (ref ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'::text)))
);

ALTER TABLE conveyor.rule ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME conveyor.rule_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE conveyor.schedule ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME conveyor.schedule_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE conveyor.schema_migration (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied timestamp with time zone DEFAULT now() NOT NULL,
    compatible_from integer,
    CONSTRAINT schema_migration_check CHECK (((compatible_from >= 1) AND (compatible_from <= version)))
);

COMMENT ON COLUMN conveyor.schema_migration.compatible_from IS 'oldest schema version whose code may run once this migration is applied (NULL: this version)';

CREATE UNLOGGED TABLE conveyor.server_epoch (
    singleton boolean DEFAULT true NOT NULL,
    postmaster_start timestamp with time zone NOT NULL,
    epoch timestamp with time zone NOT NULL,
    CONSTRAINT server_epoch_singleton_check CHECK (singleton)
);

CREATE TABLE conveyor.transport_route (
    singleton boolean DEFAULT true NOT NULL,
    transport text,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT transport_route_singleton_check CHECK (singleton),
    CONSTRAINT transport_route_transport_check CHECK ((transport = ANY (ARRAY['postgres'::text, 'rabbitmq'::text])))
);

CREATE TABLE conveyor.trigger (
    name text NOT NULL,
    type text NOT NULL,
    payload_schema jsonb,
    description text,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT trigger_name_check CHECK (((length(name) <= 255) AND (name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'::text))),
    CONSTRAINT trigger_payload_schema_check CHECK (((payload_schema IS NULL) OR (jsonb_typeof(payload_schema) = 'object'::text))),
    CONSTRAINT trigger_type_check CHECK ((type = ANY (ARRAY['webhook'::text, 'cron'::text, 'interval'::text, 'date'::text, 'custom'::text])))
);

CREATE TABLE conveyor.webhook (
    name text NOT NULL,
    trigger text NOT NULL,
    auth text NOT NULL,
    token_hash text,
    secret text,
    signature_header text DEFAULT 'X-Hub-Signature-256'::text NOT NULL,
    signature_prefix text DEFAULT 'sha256='::text NOT NULL,
    idempotency_header text DEFAULT 'Idempotency-Key'::text NOT NULL,
    max_body_bytes integer DEFAULT 1048576 NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    description text,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT webhook_auth_check CHECK ((auth = ANY (ARRAY['none'::text, 'bearer'::text, 'hmac'::text]))),
    CONSTRAINT webhook_check CHECK (((auth = 'bearer'::text) = (token_hash IS NOT NULL))),
    CONSTRAINT webhook_check1 CHECK (((auth = 'hmac'::text) = (secret IS NOT NULL))),
    CONSTRAINT webhook_idempotency_header_check CHECK (((length(idempotency_header) >= 1) AND (length(idempotency_header) <= 255))),
    CONSTRAINT webhook_max_body_bytes_check CHECK (((max_body_bytes >= 1) AND (max_body_bytes <= 67108864))),
    CONSTRAINT webhook_name_check CHECK (((length(name) <= 255) AND (name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$'::text))),
    CONSTRAINT webhook_signature_header_check CHECK (((length(signature_header) >= 1) AND (length(signature_header) <= 255))),
    CONSTRAINT webhook_signature_prefix_check CHECK ((length(signature_prefix) <= 64))
);

CREATE TABLE conveyor.worker (
    id bigint NOT NULL,
    name text NOT NULL,
    worker_role text DEFAULT 'action'::text NOT NULL,
    status text DEFAULT 'active'::text NOT NULL,
    runtimes text[] DEFAULT '{}'::text[] NOT NULL,
    actions text[] DEFAULT '{}'::text[] NOT NULL,
    capabilities jsonb DEFAULT '{}'::jsonb NOT NULL,
    capacity integer DEFAULT 10 NOT NULL,
    host text,
    pid integer,
    version text,
    last_heartbeat timestamp with time zone,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    stale_after double precision DEFAULT 30 NOT NULL,
    cordoned boolean DEFAULT false NOT NULL,
    lock_epoch timestamp with time zone,
    lock_lost_at timestamp with time zone,
    lock_grace double precision DEFAULT 0.25 NOT NULL,
    session_tag text,
    registered_at timestamp with time zone,
    inactive_reason text,
    inactive_since timestamp with time zone,
    CONSTRAINT worker_capacity_check CHECK ((capacity > 0)),
    CONSTRAINT worker_inactive_reason_check CHECK ((inactive_reason = ANY (ARRAY['stopped'::text, 'process_gone'::text, 'lock_lost'::text, 'heartbeat_stale'::text]))),
    CONSTRAINT worker_lock_grace_check CHECK ((lock_grace >= (0)::double precision)),
    CONSTRAINT worker_stale_after_check CHECK ((stale_after > (0)::double precision)),
    CONSTRAINT worker_status_check CHECK ((status = ANY (ARRAY['active'::text, 'draining'::text, 'inactive'::text]))),
    CONSTRAINT worker_worker_role_check CHECK ((worker_role = ANY (ARRAY['action'::text, 'sensor'::text, 'notifier'::text])))
);

CREATE SEQUENCE conveyor.worker_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.worker_id_seq OWNED BY conveyor.worker.id;

CREATE TABLE conveyor.workflow_definition (
    ref text NOT NULL,
    version integer NOT NULL,
    definition jsonb NOT NULL,
    source text DEFAULT ''::text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    deleted timestamp with time zone,
    CONSTRAINT workflow_definition_version_check CHECK ((version > 0))
);

CREATE TABLE conveyor.workflow_event (
    id bigint NOT NULL,
    workflow_execution bigint NOT NULL,
    kind text NOT NULL,
    execution bigint,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    created timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_event_check CHECK (((kind = 'child_ended'::text) = (execution IS NOT NULL))),
    CONSTRAINT workflow_event_kind_check CHECK ((kind = ANY (ARRAY['start'::text, 'child_ended'::text, 'cancel'::text, 'pause'::text, 'resume'::text, 'timeout'::text, 'rerun'::text])))
);

CREATE SEQUENCE conveyor.workflow_event_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.workflow_event_id_seq OWNED BY conveyor.workflow_event.id;

CREATE TABLE conveyor.workflow_execution (
    id bigint NOT NULL,
    execution bigint NOT NULL,
    workflow_ref text NOT NULL,
    version integer NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    context jsonb DEFAULT '{}'::jsonb NOT NULL,
    output jsonb,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    depth integer DEFAULT 0 NOT NULL,
    cancel_policy text DEFAULT 'allow_finish'::text NOT NULL,
    deadline timestamp with time zone,
    rerun_of bigint,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_execution_cancel_policy_check CHECK ((cancel_policy = ANY (ARRAY['allow_finish'::text, 'cancel_running'::text]))),
    CONSTRAINT workflow_execution_depth_check CHECK ((depth >= 0)),
    CONSTRAINT workflow_execution_status_check CHECK ((status = ANY (ARRAY['running'::text, 'paused'::text, 'canceling'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text])))
);

CREATE SEQUENCE conveyor.workflow_execution_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.workflow_execution_id_seq OWNED BY conveyor.workflow_execution.id;

CREATE TABLE conveyor.workflow_task (
    workflow_execution bigint NOT NULL,
    task_name text NOT NULL,
    iteration integer DEFAULT 0 NOT NULL,
    status text NOT NULL,
    arrivals text[] DEFAULT '{}'::text[] NOT NULL,
    items_total integer,
    items jsonb,
    concurrency integer,
    result jsonb,
    error text,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    ended timestamp with time zone,
    CONSTRAINT workflow_task_iteration_check CHECK ((iteration >= 0)),
    CONSTRAINT workflow_task_status_check CHECK ((status = ANY (ARRAY['waiting'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text])))
);

CREATE TABLE conveyor.workflow_task_dispatch (
    id bigint NOT NULL,
    workflow_execution bigint NOT NULL,
    task_name text NOT NULL,
    task_index integer,
    iteration integer DEFAULT 0 NOT NULL,
    execution bigint,
    retry integer DEFAULT 0 NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    result jsonb,
    deadline timestamp with time zone,
    created timestamp with time zone DEFAULT now() NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_task_dispatch_iteration_check CHECK ((iteration >= 0)),
    CONSTRAINT workflow_task_dispatch_retry_check CHECK ((retry >= 0)),
    CONSTRAINT workflow_task_dispatch_status_check CHECK ((status = ANY (ARRAY['running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text]))),
    CONSTRAINT workflow_task_dispatch_task_index_check CHECK ((task_index >= 0))
);

CREATE SEQUENCE conveyor.workflow_task_dispatch_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE conveyor.workflow_task_dispatch_id_seq OWNED BY conveyor.workflow_task_dispatch.id;

CREATE TABLE conveyor.workflow_task_transition (
    from_status text NOT NULL,
    to_status text NOT NULL
);

CREATE TABLE conveyor.workflow_transition (
    from_status text NOT NULL,
    to_status text NOT NULL
);

CREATE TABLE conveyor.workflow_tree (
    root bigint NOT NULL,
    tasks bigint DEFAULT 0 NOT NULL,
    executions bigint DEFAULT 0 NOT NULL,
    updated timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_tree_executions_check CHECK ((executions >= 0)),
    CONSTRAINT workflow_tree_tasks_check CHECK ((tasks >= 0))
);

COMMENT ON TABLE conveyor.workflow_tree IS 'what the workflows under one top-level workflow execution created, for workflow.max_tree_*';

ALTER TABLE ONLY conveyor.api_token ALTER COLUMN id SET DEFAULT nextval('conveyor.api_token_id_seq'::regclass);

ALTER TABLE ONLY conveyor.dead_letter ALTER COLUMN id SET DEFAULT nextval('conveyor.dead_letter_id_seq'::regclass);

ALTER TABLE ONLY conveyor.execution ALTER COLUMN id SET DEFAULT nextval('conveyor.execution_id_seq'::regclass);

ALTER TABLE ONLY conveyor.inquiry ALTER COLUMN id SET DEFAULT nextval('conveyor.inquiry_id_seq'::regclass);

ALTER TABLE ONLY conveyor.inquiry_response ALTER COLUMN id SET DEFAULT nextval('conveyor.inquiry_response_id_seq'::regclass);

ALTER TABLE ONLY conveyor.outbox ALTER COLUMN id SET DEFAULT nextval('conveyor.outbox_id_seq'::regclass);

ALTER TABLE ONLY conveyor.worker ALTER COLUMN id SET DEFAULT nextval('conveyor.worker_id_seq'::regclass);

ALTER TABLE ONLY conveyor.workflow_event ALTER COLUMN id SET DEFAULT nextval('conveyor.workflow_event_id_seq'::regclass);

ALTER TABLE ONLY conveyor.workflow_execution ALTER COLUMN id SET DEFAULT nextval('conveyor.workflow_execution_id_seq'::regclass);

ALTER TABLE ONLY conveyor.workflow_task_dispatch ALTER COLUMN id SET DEFAULT nextval('conveyor.workflow_task_dispatch_id_seq'::regclass);

ALTER TABLE ONLY conveyor.action
    ADD CONSTRAINT action_pkey PRIMARY KEY (ref);

ALTER TABLE ONLY conveyor.admission_policy
    ADD CONSTRAINT admission_policy_pkey PRIMARY KEY (target);

ALTER TABLE ONLY conveyor.api_token
    ADD CONSTRAINT api_token_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.api_token
    ADD CONSTRAINT api_token_token_hash_key UNIQUE (token_hash);

ALTER TABLE ONLY conveyor.dead_letter
    ADD CONSTRAINT dead_letter_dedupe_key_key UNIQUE (dedupe_key);

ALTER TABLE ONLY conveyor.dead_letter
    ADD CONSTRAINT dead_letter_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.enforcement
    ADD CONSTRAINT enforcement_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.event_pending
    ADD CONSTRAINT event_pending_pkey PRIMARY KEY (event);

ALTER TABLE ONLY conveyor.event
    ADD CONSTRAINT event_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.execution_admission_group
    ADD CONSTRAINT execution_admission_group_pkey PRIMARY KEY (policy, group_key);

ALTER TABLE ONLY conveyor.execution_admission_queue
    ADD CONSTRAINT execution_admission_queue_pkey PRIMARY KEY (execution);

ALTER TABLE ONLY conveyor.execution_admission_queue
    ADD CONSTRAINT execution_admission_queue_policy_group_key_seq_key UNIQUE (policy, group_key, seq);

ALTER TABLE ONLY conveyor.execution_admission_slot
    ADD CONSTRAINT execution_admission_slot_pkey PRIMARY KEY (execution);

ALTER TABLE ONLY conveyor.execution_attempt
    ADD CONSTRAINT execution_attempt_pkey PRIMARY KEY (execution, attempt);

ALTER TABLE ONLY conveyor.execution_idempotency
    ADD CONSTRAINT execution_idempotency_pkey PRIMARY KEY (key);

ALTER TABLE ONLY conveyor.execution_output
    ADD CONSTRAINT execution_output_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.execution
    ADD CONSTRAINT execution_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.execution_transition
    ADD CONSTRAINT execution_transition_pkey PRIMARY KEY (from_status, to_status);

ALTER TABLE ONLY conveyor.inquiry
    ADD CONSTRAINT inquiry_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.inquiry_response
    ADD CONSTRAINT inquiry_response_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.rule
    ADD CONSTRAINT rule_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.rule
    ADD CONSTRAINT rule_ref_key UNIQUE (ref);

ALTER TABLE ONLY conveyor.schedule
    ADD CONSTRAINT schedule_name_key UNIQUE (name);

ALTER TABLE ONLY conveyor.schedule
    ADD CONSTRAINT schedule_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.schedule_slot
    ADD CONSTRAINT schedule_slot_pkey PRIMARY KEY (schedule, slot);

ALTER TABLE ONLY conveyor.schema_migration
    ADD CONSTRAINT schema_migration_pkey PRIMARY KEY (version);

ALTER TABLE ONLY conveyor.server_epoch
    ADD CONSTRAINT server_epoch_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY conveyor.transport_route
    ADD CONSTRAINT transport_route_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY conveyor.trigger
    ADD CONSTRAINT trigger_pkey PRIMARY KEY (name);

ALTER TABLE ONLY conveyor.inquiry
    ADD CONSTRAINT uq_inquiry_execution UNIQUE (execution);

ALTER TABLE ONLY conveyor.inquiry_response
    ADD CONSTRAINT uq_inquiry_response_responder UNIQUE (inquiry, responder);

ALTER TABLE ONLY conveyor.workflow_execution
    ADD CONSTRAINT uq_workflow_execution_execution UNIQUE (execution);

ALTER TABLE ONLY conveyor.webhook
    ADD CONSTRAINT webhook_pkey PRIMARY KEY (name);

ALTER TABLE ONLY conveyor.webhook
    ADD CONSTRAINT webhook_trigger_key UNIQUE (trigger);

ALTER TABLE ONLY conveyor.worker
    ADD CONSTRAINT worker_name_key UNIQUE (name);

ALTER TABLE ONLY conveyor.worker
    ADD CONSTRAINT worker_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.workflow_definition
    ADD CONSTRAINT workflow_definition_pkey PRIMARY KEY (ref, version);

ALTER TABLE ONLY conveyor.workflow_event
    ADD CONSTRAINT workflow_event_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.workflow_execution
    ADD CONSTRAINT workflow_execution_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.workflow_task_dispatch
    ADD CONSTRAINT workflow_task_dispatch_pkey PRIMARY KEY (id);

ALTER TABLE ONLY conveyor.workflow_task
    ADD CONSTRAINT workflow_task_pkey PRIMARY KEY (workflow_execution, task_name, iteration);

ALTER TABLE ONLY conveyor.workflow_task_transition
    ADD CONSTRAINT workflow_task_transition_pkey PRIMARY KEY (from_status, to_status);

ALTER TABLE ONLY conveyor.workflow_transition
    ADD CONSTRAINT workflow_transition_pkey PRIMARY KEY (from_status, to_status);

ALTER TABLE ONLY conveyor.workflow_tree
    ADD CONSTRAINT workflow_tree_pkey PRIMARY KEY (root);

CREATE INDEX dead_letter_execution_idx ON conveyor.dead_letter USING btree (execution) WHERE (execution IS NOT NULL);

CREATE INDEX dead_letter_first_seen_idx ON conveyor.dead_letter USING btree (first_seen);

CREATE INDEX dead_letter_pending_idx ON conveyor.dead_letter USING btree (id) WHERE (resolution IS NULL);

CREATE INDEX enforcement_created_idx ON conveyor.enforcement USING btree (created);

CREATE INDEX enforcement_event_idx ON conveyor.enforcement USING btree (event);

CREATE INDEX enforcement_execution_idx ON conveyor.enforcement USING btree (execution) WHERE (execution IS NOT NULL);

CREATE INDEX enforcement_rule_created_idx ON conveyor.enforcement USING btree (rule, created);

CREATE INDEX event_received_idx ON conveyor.event USING btree (received);

CREATE INDEX event_replay_of_idx ON conveyor.event USING btree (replay_of) WHERE (replay_of IS NOT NULL);

CREATE INDEX event_trigger_received_idx ON conveyor.event USING btree (trigger, received);

CREATE INDEX execution_action_idx ON conveyor.execution USING btree (action_ref, created);

CREATE INDEX execution_admission_slot_group_idx ON conveyor.execution_admission_slot USING btree (policy, group_key);

CREATE INDEX execution_attempt_worker_idx ON conveyor.execution_attempt USING btree (worker) WHERE (worker IS NOT NULL);

CREATE INDEX execution_created_idx ON conveyor.execution USING btree (created);

CREATE INDEX execution_idempotency_created_idx ON conveyor.execution_idempotency USING btree (created);

CREATE INDEX execution_idempotency_execution_idx ON conveyor.execution_idempotency USING btree (execution);

CREATE INDEX execution_not_before_idx ON conveyor.execution USING btree (not_before) WHERE ((status = 'requested'::text) AND (not_before IS NOT NULL));

CREATE INDEX execution_on_worker_idx ON conveyor.execution USING btree (worker, id) WHERE (status = ANY (ARRAY['scheduled'::text, 'running'::text, 'canceling'::text]));

CREATE INDEX execution_output_execution_idx ON conveyor.execution_output USING btree (execution, id);

CREATE INDEX execution_parent_idx ON conveyor.execution USING btree (parent) WHERE (parent IS NOT NULL);

CREATE INDEX execution_requested_action_idx ON conveyor.execution USING btree (action_ref, id) WHERE (status = 'requested'::text);

CREATE INDEX execution_requested_idx ON conveyor.execution USING btree (id) WHERE (status = 'requested'::text);

CREATE INDEX execution_status_updated_idx ON conveyor.execution USING btree (status, updated);

CREATE INDEX inquiry_pending_deadline_idx ON conveyor.inquiry USING btree (deadline) WHERE (status = 'pending'::text);

CREATE INDEX inquiry_status_idx ON conveyor.inquiry USING btree (status, id);

CREATE INDEX outbox_execution_idx ON conveyor.outbox USING btree (execution) WHERE (execution IS NOT NULL);

CREATE INDEX rule_trigger_idx ON conveyor.rule USING btree (trigger);

CREATE INDEX schedule_next_fire_idx ON conveyor.schedule USING btree (next_fire) WHERE ((NOT paused) AND (next_fire IS NOT NULL));

CREATE INDEX schedule_slot_buffered_idx ON conveyor.schedule_slot USING btree (schedule) WHERE (outcome = 'buffered'::text);

CREATE INDEX schedule_slot_execution_idx ON conveyor.schedule_slot USING btree (execution) WHERE (execution IS NOT NULL);

CREATE INDEX schedule_slot_fired_idx ON conveyor.schedule_slot USING btree (fired);

CREATE UNIQUE INDEX uq_enforcement_rule_event ON conveyor.enforcement USING btree (rule, event) WHERE (event IS NOT NULL);

CREATE UNIQUE INDEX uq_event_trigger_idempotency_key ON conveyor.event USING btree (trigger, idempotency_key) WHERE (idempotency_key IS NOT NULL);

CREATE UNIQUE INDEX uq_execution_enforcement ON conveyor.execution USING btree (enforcement) WHERE ((parent IS NULL) AND (enforcement IS NOT NULL));

CREATE UNIQUE INDEX uq_workflow_event_child ON conveyor.workflow_event USING btree (execution) WHERE (kind = 'child_ended'::text);

CREATE UNIQUE INDEX uq_workflow_task_dispatch ON conveyor.workflow_task_dispatch USING btree (workflow_execution, task_name, COALESCE(task_index, '-1'::integer), iteration);

CREATE INDEX worker_status_heartbeat_idx ON conveyor.worker USING btree (status, last_heartbeat);

CREATE INDEX workflow_event_workflow_idx ON conveyor.workflow_event USING btree (workflow_execution, id);

CREATE INDEX workflow_execution_deadline_idx ON conveyor.workflow_execution USING btree (deadline) WHERE (deadline IS NOT NULL);

CREATE INDEX workflow_execution_rerun_of_idx ON conveyor.workflow_execution USING btree (rerun_of) WHERE (rerun_of IS NOT NULL);

CREATE INDEX workflow_task_dispatch_deadline_idx ON conveyor.workflow_task_dispatch USING btree (deadline) WHERE (deadline IS NOT NULL);

CREATE INDEX workflow_task_dispatch_execution_idx ON conveyor.workflow_task_dispatch USING btree (execution);

CREATE TRIGGER action_touch BEFORE UPDATE ON conveyor.action FOR EACH ROW EXECUTE FUNCTION conveyor.touch_updated();

CREATE TRIGGER admission_on_change AFTER UPDATE ON conveyor.execution REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor.admission_on_change();

CREATE TRIGGER admission_on_request AFTER INSERT ON conveyor.execution REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION conveyor.admission_on_request();

CREATE TRIGGER admission_policy_changed AFTER INSERT OR DELETE OR UPDATE ON conveyor.admission_policy FOR EACH ROW EXECUTE FUNCTION conveyor.admission_policy_changed();

CREATE TRIGGER admission_policy_from_metadata AFTER INSERT OR UPDATE OF metadata ON conveyor.action FOR EACH ROW EXECUTE FUNCTION conveyor.admission_policy_from_metadata();

CREATE TRIGGER admission_policy_touch BEFORE UPDATE ON conveyor.admission_policy FOR EACH ROW EXECUTE FUNCTION conveyor.touch_updated();

CREATE TRIGGER event_immutable BEFORE UPDATE ON conveyor.event FOR EACH ROW EXECUTE FUNCTION conveyor.event_immutable();

CREATE TRIGGER event_pending_wake AFTER INSERT ON conveyor.event_pending FOR EACH STATEMENT EXECUTE FUNCTION conveyor.event_pending_wake();

CREATE TRIGGER execution_guard BEFORE INSERT OR UPDATE ON conveyor.execution FOR EACH ROW EXECUTE FUNCTION conveyor.execution_guard();

CREATE TRIGGER execution_wake_changed AFTER UPDATE ON conveyor.execution REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor.execution_wake_changed();

CREATE TRIGGER execution_wake_inserted AFTER INSERT ON conveyor.execution REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION conveyor.execution_wake_inserted();

CREATE TRIGGER inquiry_wake_inserted AFTER INSERT ON conveyor.inquiry REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION conveyor.inquiry_wake_inserted();

CREATE TRIGGER outbox_wake AFTER INSERT ON conveyor.outbox FOR EACH STATEMENT EXECUTE FUNCTION conveyor.outbox_wake();

CREATE TRIGGER schedule_wake_changed AFTER UPDATE ON conveyor.schedule FOR EACH ROW WHEN ((old.updated IS DISTINCT FROM new.updated)) EXECUTE FUNCTION conveyor.schedule_wake();

CREATE TRIGGER schedule_wake_created AFTER INSERT ON conveyor.schedule FOR EACH STATEMENT EXECUTE FUNCTION conveyor.schedule_wake();

CREATE TRIGGER worker_touch BEFORE UPDATE ON conveyor.worker FOR EACH ROW EXECUTE FUNCTION conveyor.touch_updated();

CREATE TRIGGER worker_wake_changed AFTER UPDATE OF status, cordoned, capacity, pid ON conveyor.worker FOR EACH ROW WHEN (((new.status = 'active'::text) AND (NOT new.cordoned) AND ((((old.status IS DISTINCT FROM new.status) OR (old.cordoned IS DISTINCT FROM new.cordoned)) OR (old.capacity IS DISTINCT FROM new.capacity)) OR (old.pid IS DISTINCT FROM new.pid)))) EXECUTE FUNCTION conveyor.worker_wake();

CREATE TRIGGER worker_wake_inserted AFTER INSERT ON conveyor.worker FOR EACH ROW WHEN (((new.status = 'active'::text) AND (NOT new.cordoned))) EXECUTE FUNCTION conveyor.worker_wake();

CREATE TRIGGER workflow_child_ended AFTER UPDATE OF status ON conveyor.execution FOR EACH ROW WHEN (((new.parent IS NOT NULL) AND (new.status = ANY (conveyor.terminal_statuses())) AND (old.status <> ALL (conveyor.terminal_statuses())))) EXECUTE FUNCTION conveyor.workflow_child_ended();

CREATE TRIGGER workflow_event_wake AFTER INSERT ON conveyor.workflow_event FOR EACH STATEMENT EXECUTE FUNCTION conveyor.workflow_event_wake();

CREATE TRIGGER workflow_execution_guard BEFORE UPDATE ON conveyor.workflow_execution FOR EACH ROW WHEN ((old.status IS DISTINCT FROM new.status)) EXECUTE FUNCTION conveyor.workflow_execution_guard();

CREATE TRIGGER workflow_execution_touch BEFORE UPDATE ON conveyor.workflow_execution FOR EACH ROW EXECUTE FUNCTION conveyor.touch_updated();

CREATE TRIGGER workflow_task_guard BEFORE UPDATE ON conveyor.workflow_task FOR EACH ROW WHEN ((old.status IS DISTINCT FROM new.status)) EXECUTE FUNCTION conveyor.workflow_task_guard();

ALTER TABLE ONLY conveyor.enforcement
    ADD CONSTRAINT enforcement_event_fkey FOREIGN KEY (event) REFERENCES conveyor.event(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.enforcement
    ADD CONSTRAINT enforcement_rule_fkey FOREIGN KEY (rule) REFERENCES conveyor.rule(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.event_pending
    ADD CONSTRAINT event_pending_event_fkey FOREIGN KEY (event) REFERENCES conveyor.event(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.event
    ADD CONSTRAINT event_replay_of_fkey FOREIGN KEY (replay_of) REFERENCES conveyor.event(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.event
    ADD CONSTRAINT event_trigger_fkey FOREIGN KEY (trigger) REFERENCES conveyor.trigger(name);

ALTER TABLE ONLY conveyor.execution
    ADD CONSTRAINT execution_action_ref_fkey FOREIGN KEY (action_ref) REFERENCES conveyor.action(ref);

ALTER TABLE ONLY conveyor.execution_admission_group
    ADD CONSTRAINT execution_admission_group_policy_fkey FOREIGN KEY (policy) REFERENCES conveyor.admission_policy(target) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_admission_queue
    ADD CONSTRAINT execution_admission_queue_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_admission_queue
    ADD CONSTRAINT execution_admission_queue_policy_group_key_fkey FOREIGN KEY (policy, group_key) REFERENCES conveyor.execution_admission_group(policy, group_key) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_admission_slot
    ADD CONSTRAINT execution_admission_slot_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_admission_slot
    ADD CONSTRAINT execution_admission_slot_policy_group_key_fkey FOREIGN KEY (policy, group_key) REFERENCES conveyor.execution_admission_group(policy, group_key) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_attempt
    ADD CONSTRAINT execution_attempt_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution_attempt
    ADD CONSTRAINT execution_attempt_worker_fkey FOREIGN KEY (worker) REFERENCES conveyor.worker(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.execution_idempotency
    ADD CONSTRAINT execution_idempotency_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE ONLY conveyor.execution_output
    ADD CONSTRAINT execution_output_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.execution
    ADD CONSTRAINT execution_parent_fkey FOREIGN KEY (parent) REFERENCES conveyor.execution(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.execution
    ADD CONSTRAINT execution_worker_fkey FOREIGN KEY (worker) REFERENCES conveyor.worker(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.inquiry
    ADD CONSTRAINT inquiry_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.inquiry_response
    ADD CONSTRAINT inquiry_response_inquiry_fkey FOREIGN KEY (inquiry) REFERENCES conveyor.inquiry(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.rule
    ADD CONSTRAINT rule_trigger_fkey FOREIGN KEY (trigger) REFERENCES conveyor.trigger(name);

ALTER TABLE ONLY conveyor.schedule_slot
    ADD CONSTRAINT schedule_slot_event_fkey FOREIGN KEY (event) REFERENCES conveyor.event(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.schedule_slot
    ADD CONSTRAINT schedule_slot_schedule_fkey FOREIGN KEY (schedule) REFERENCES conveyor.schedule(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.schedule
    ADD CONSTRAINT schedule_trigger_fkey FOREIGN KEY (trigger) REFERENCES conveyor.trigger(name);

ALTER TABLE ONLY conveyor.webhook
    ADD CONSTRAINT webhook_trigger_fkey FOREIGN KEY (trigger) REFERENCES conveyor.trigger(name);

ALTER TABLE ONLY conveyor.workflow_definition
    ADD CONSTRAINT workflow_definition_ref_fkey FOREIGN KEY (ref) REFERENCES conveyor.action(ref) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.workflow_event
    ADD CONSTRAINT workflow_event_workflow_execution_fkey FOREIGN KEY (workflow_execution) REFERENCES conveyor.workflow_execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.workflow_execution
    ADD CONSTRAINT workflow_execution_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.workflow_execution
    ADD CONSTRAINT workflow_execution_rerun_of_fkey FOREIGN KEY (rerun_of) REFERENCES conveyor.workflow_execution(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.workflow_execution
    ADD CONSTRAINT workflow_execution_workflow_ref_version_fkey FOREIGN KEY (workflow_ref, version) REFERENCES conveyor.workflow_definition(ref, version);

ALTER TABLE ONLY conveyor.workflow_task_dispatch
    ADD CONSTRAINT workflow_task_dispatch_execution_fkey FOREIGN KEY (execution) REFERENCES conveyor.execution(id) ON DELETE SET NULL;

ALTER TABLE ONLY conveyor.workflow_task_dispatch
    ADD CONSTRAINT workflow_task_dispatch_workflow_execution_fkey FOREIGN KEY (workflow_execution) REFERENCES conveyor.workflow_execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.workflow_task
    ADD CONSTRAINT workflow_task_workflow_execution_fkey FOREIGN KEY (workflow_execution) REFERENCES conveyor.workflow_execution(id) ON DELETE CASCADE;

ALTER TABLE ONLY conveyor.workflow_tree
    ADD CONSTRAINT workflow_tree_root_fkey FOREIGN KEY (root) REFERENCES conveyor.execution(id) ON DELETE CASCADE;
