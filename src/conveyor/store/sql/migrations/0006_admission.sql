-- Admission policies: concurrency limits and FIFO waiting shared by every executor
-- replica (the seeds' execution_admission_* design). The state lives here and the
-- three operations -- acquire on request, release when an execution ends, promote the
-- next waiter -- run inside the transaction that causes them, in triggers, so no code
-- path (worker result, timeout, recovery, dead letter, cancel, a user's own SQL) can
-- forget one or do one twice, and no crash can separate a release from its promotion.

-- One policy per target: an action ref ('core.http'), a pack ('core') or '*' (global).
-- The most specific one governs an execution; the others do not apply to it.
CREATE TABLE admission_policy (
    target      text PRIMARY KEY
                CHECK (target = '*' OR target ~ '^[A-Za-z0-9_-]+$'
                       OR target ~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+$'),
    scope       text NOT NULL GENERATED ALWAYS AS (
                    CASE WHEN target = '*' THEN 'global'
                         WHEN strpos(target, '.') > 0 THEN 'action'
                         ELSE 'pack' END) STORED,
    concurrency integer NOT NULL CHECK (concurrency > 0),
    -- Parameters whose values split the limit: one limit per distinct combination.
    parameters  text[] NOT NULL DEFAULT '{}' CHECK (array_position(parameters, NULL) IS NULL),
    -- enqueue: wait in strict request order; cancel: refuse at once with the reason.
    method      text NOT NULL DEFAULT 'enqueue' CHECK (method IN ('enqueue', 'cancel')),
    -- metadata: from the action's definition (re-synced when it registers);
    -- operator: set from the CLI or API, which a registration never overwrites.
    source      text NOT NULL DEFAULT 'operator' CHECK (source IN ('metadata', 'operator')),
    created     timestamptz NOT NULL DEFAULT now(),
    updated     timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER admission_policy_touch BEFORE UPDATE ON admission_policy
    FOR EACH ROW EXECUTE FUNCTION touch_updated();

-- One row per (policy, group): the lock every admission decision for the group takes
-- (always in (policy, group_key) order, so two transactions cannot deadlock on them),
-- and the counter that numbers its requests.
CREATE TABLE execution_admission_group (
    policy    text NOT NULL REFERENCES admission_policy (target) ON DELETE CASCADE,
    group_key jsonb NOT NULL,
    next_seq  bigint NOT NULL DEFAULT 0,
    touched   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy, group_key)
);

-- Slots held: one per admitted execution until it ends (retries keep it).
CREATE TABLE execution_admission_slot (
    execution bigint PRIMARY KEY REFERENCES execution (id) ON DELETE CASCADE,
    policy    text NOT NULL,
    group_key jsonb NOT NULL,
    seq       bigint NOT NULL,
    acquired  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (policy, group_key) REFERENCES execution_admission_group ON DELETE CASCADE
);
CREATE INDEX execution_admission_slot_group_idx ON execution_admission_slot (policy, group_key);

-- Executions waiting for a slot, in request order (seq). A queued execution stays
-- 'requested' and the scheduler does not claim it.
CREATE TABLE execution_admission_queue (
    execution bigint PRIMARY KEY REFERENCES execution (id) ON DELETE CASCADE,
    policy    text NOT NULL,
    group_key jsonb NOT NULL,
    seq       bigint NOT NULL,
    enqueued  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (policy, group_key) REFERENCES execution_admission_group ON DELETE CASCADE,
    UNIQUE (policy, group_key, seq)
);

CREATE FUNCTION admission_group_key(parameters text[], params jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(p, coalesce(params -> p, 'null'::jsonb)), '{}'::jsonb)
    FROM unnest(parameters) AS p
$$;

-- The policy that governs an action: its own, else its pack's, else the global one.
CREATE FUNCTION admission_policy_for(ref text) RETURNS SETOF admission_policy
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT p.* FROM admission_policy p
    WHERE p.target IN (ref, split_part(ref, '.', 1), '*')
    ORDER BY CASE p.scope WHEN 'action' THEN 0 WHEN 'pack' THEN 1 ELSE 2 END
    LIMIT 1
$$;

-- Take the group's lock. An UPDATE, not SELECT ... FOR UPDATE: under REPEATABLE READ a
-- concurrent change then fails with a serialization error instead of letting a stale
-- snapshot count the slots.
CREATE FUNCTION admission_lock(p_policy text, p_group jsonb) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO execution_admission_group (policy, group_key) VALUES (p_policy, p_group)
    ON CONFLICT (policy, group_key) DO UPDATE SET touched = now()
$$;

-- Admit waiters of one group, oldest request first, while slots are free. The caller
-- holds the group's lock. Returns how many were admitted.
CREATE FUNCTION admission_promote(p_policy text, p_group jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- Acquire, for the executions a statement inserted: each governed one is numbered in
-- its group and queued, then the group promotes (enqueue); or it takes a free slot or
-- is cancelled with the reason at once (cancel).
CREATE FUNCTION admission_on_request() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    seq_no bigint;
    held integer;
    enqueued jsonb := '[]';
    refused bigint[] := '{}';
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
                refused := refused || r.id;
            END IF;
        END IF;
    END LOOP;
    FOR r IN SELECT DISTINCT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(enqueued) ORDER BY 1, 2 LOOP
        PERFORM admission_promote(r.policy, r.group_key);
    END LOOP;
    IF cardinality(refused) > 0 THEN
        PERFORM pg_notify(current_schema() || '.completed', array_to_string(refused, ','));
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER admission_on_request AFTER INSERT ON execution
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION admission_on_request();

-- Release and promote, for the executions a statement ended: their slots (or places
-- in a queue) go, and each group they freed admits its next waiters -- in the same
-- transaction, so a crash keeps both or neither.
CREATE FUNCTION admission_on_change() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    groups jsonb;
    g jsonb;
    admitted integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM execution_admission_slot)
       AND NOT EXISTS (SELECT 1 FROM execution_admission_queue) THEN
        RETURN NULL;
    END IF;
    WITH ended AS (
        SELECT a.id FROM after_rows a JOIN before_rows b USING (id)
        WHERE a.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
          AND b.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
    ), freed AS (
        DELETE FROM execution_admission_slot s USING ended WHERE s.execution = ended.id
        RETURNING s.policy, s.group_key
    ), dropped AS (
        DELETE FROM execution_admission_queue q USING ended WHERE q.execution = ended.id
        RETURNING q.execution
    )
    -- (dropped runs whether read or not: data-modifying CTEs always do.)
    SELECT jsonb_agg(DISTINCT jsonb_build_array(policy, group_key)) INTO groups FROM freed;
    IF groups IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT value FROM jsonb_array_elements(groups) ORDER BY value ->> 0, value -> 1 LOOP
        PERFORM admission_lock(g ->> 0, g -> 1);
        admitted := admitted + admission_promote(g ->> 0, g -> 1);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER admission_on_change AFTER UPDATE ON execution
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION admission_on_change();

-- A policy created or changed admits whoever its (possibly higher) limit now allows;
-- a policy deleted lets its waiters go (the cascade removed their queue rows).
CREATE FUNCTION admission_policy_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    g record;
    admitted integer := 0;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
        RETURN NULL;
    END IF;
    FOR g IN SELECT policy, group_key FROM execution_admission_group
             WHERE policy = NEW.target ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER admission_policy_changed AFTER INSERT OR UPDATE OR DELETE ON admission_policy
    FOR EACH ROW EXECUTE FUNCTION admission_policy_changed();

-- A policy in an action's definition (metadata.policy) follows the definition each time
-- a worker registers it, unless an operator set one for that action.
CREATE FUNCTION admission_policy_from_metadata() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
CREATE TRIGGER admission_policy_from_metadata AFTER INSERT OR UPDATE OF metadata ON action
    FOR EACH ROW EXECUTE FUNCTION admission_policy_from_metadata();
