-- Schedules, faster (issue #13: a slot fires within a p99 of 250 ms of its time, with
-- 100 schedules firing every second). 0019's fire_schedules looped per schedule and per
-- slot in plpgsql: per slot an INSERT of its row, a subtransaction (the EXCEPTION block
-- that turns a refused request into 'request_error'), request_execution's own checks, an
-- INSERT into execution whose statement triggers (admission, wake) ran once per slot, and
-- an UPDATE of the row. 100 slots on one instant took 250 ms to 2 s on a loaded 2-core
-- machine, and more than 64 subtransactions in one transaction overflow PostgreSQL's
-- per-backend subxid cache, which slows every other session's snapshots meanwhile.
--
-- Here a pass is set-based, in three statements whatever the number of slots:
--   1. every decided slot row in one INSERT ... ON CONFLICT DO NOTHING (the exactly-once
--      key, unchanged: only the rows this statement inserted are requested or emitted),
--      its outcome decided beforehand by the checks request_execution and emit_event
--      make -- unknown action (CVA01) or invalid parameters (CVA02), unknown trigger
--      (CVE01) or invalid payload (CVE02) -- with the same messages; a refused slot is
--      'request_error' and the others fire;
--   2. in the same statement, one INSERT into execution for every requested slot (ids
--      drawn beforehand so the slot row names its execution; requested_by
--      'schedule:<name>'), so admission and the 'requested' wake run once per pass;
--   3. one UPDATE emitting the events of the slots of schedules without an action
--      (emit_event per row: its checks were made in 1, so it is not refused).
-- No subtransaction, no row written twice. The schedules move on (next_fire, last_slot)
-- in one UPDATE. fire_schedule_slots, backfill and "fire now" keep 0019's per-slot path
-- (a person's request for one slot, or a backfill, is not on the clock).

CREATE OR REPLACE FUNCTION fire_schedules(batch jsonb) RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
