-- Rules evaluated (issue #13): the one write path of an executor's pass over pending
-- events. The executors lock a batch of event_pending rows (FOR UPDATE SKIP LOCKED), decide
-- per (rule, event) in Python (conveyor.rules.render.decide: criteria, templates -- pure),
-- and hand the decisions to enforce_events, which writes them in the same transaction.

-- For each event in `events` that is still pending (its event_pending row deleted here:
-- the guard -- an event another executor already enforced has no row left, and one it is
-- enforcing now blocks this DELETE until that commits, then finds nothing), each of its
-- decisions becomes an enforcement; a 'requested' one requests its execution with
-- request_execution_once(..., enforcement => id) as requested_by 'rule:<ref>' (set_config,
-- local to the transaction). A refused request (CVA01 unknown action, CVA02 invalid
-- parameters) is caught in a subtransaction and recorded as 'request_error' with its
-- message: one bad rule neither blocks the event's other rules nor the batch.
--
-- decisions: a JSON array of {event, rule, rule_ref, outcome, action_ref, parameters, error}
-- with outcome 'requested' | 'template_error' | 'rule_disabled' (or 'request_error': a request
-- the executor already saw refused when it retried an event alone). Decisions for events not
-- pending any more are ignored (a duplicate pass, a replayed NOTIFY). The execution is
-- requested before its enforcement row is inserted because enforcement's CHECK ties
-- outcome 'requested' to a non-NULL execution; the enforcement id is taken from its
-- sequence first so the execution can name it. uq_enforcement_rule_event is the backstop:
-- if it ever fires, the whole pass rolls back (serialization_failure) rather than leave an
-- execution without its enforcement.
--
-- Answers one row per enforcement written, and per event taken (enforcement NULL when no
-- rule matched) so the caller can count events processed.
CREATE FUNCTION enforce_events(events bigint[], decisions jsonb)
RETURNS TABLE (event bigint, enforcement bigint, rule_ref text, outcome text, execution bigint, error text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
