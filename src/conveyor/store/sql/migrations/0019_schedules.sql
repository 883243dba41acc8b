-- Schedules (issue #13): the verbs on the schedule and schedule_slot tables of 0016.
-- Which slots fire, how late is too late and what overlap does are decided in Python
-- (conveyor.domain.schedules: croniter, IANA zones); these functions apply a decision in
-- the caller's transaction. The exactly-once key is schedule_slot's primary key
-- (schedule, slot): every write of a slot is INSERT ... ON CONFLICT DO NOTHING, and only
-- the transaction that inserted the row requests its execution (or emits its event).
-- The executors pick due schedules FOR UPDATE SKIP LOCKED, so two replicas at a slot
-- boundary never both decide one; the key is the backstop.
--
-- next_fire = now() after a change (create, update, resume) means "recompute": the
-- executors are woken (wake('schedule')), find it due, decide that no slot is due yet and
-- store the real next fire time -- the cron arithmetic lives in one place.

-- Refusals of the schedule verbs.
--   CVN06  no such schedule
--   CVC06  a schedule of that name exists already (create without replace)

-- A change by a verb (updated moves) wakes the executors: the next fire time may be
-- sooner than they sleep. The executors' own advance of next_fire/last_slot does not
-- touch updated, so firing a slot wakes nobody.
CREATE FUNCTION schedule_wake() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM wake('schedule');
    RETURN NULL;
END
$$;
CREATE TRIGGER schedule_wake_changed AFTER UPDATE ON schedule
    FOR EACH ROW WHEN (OLD.updated IS DISTINCT FROM NEW.updated) EXECUTE FUNCTION schedule_wake();
CREATE TRIGGER schedule_wake_created AFTER INSERT ON schedule
    FOR EACH STATEMENT EXECUTE FUNCTION schedule_wake();

CREATE FUNCTION schedule_not_found(name text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'no schedule %', quote_literal(name)
        USING ERRCODE = 'CVN06', HINT = 'see conveyor schedules list';
END
$$;

-- Create (replace = false: refused if the name exists) or create-or-replace a schedule.
-- The Python callers check the cron expression, the time zone and the policies first
-- (conveyor.domain.schedules.Spec); the table's CHECKs are the backstop. A schedule
-- without an action emits events on a trigger of its own name (type = kind), created
-- here. An action is checked as a request would be (CVA01 unknown, CVA02 parameters).
-- Replacing keeps the slots fired (and last_slot): a slot fired is never fired again.
CREATE FUNCTION create_schedule(name text, kind text, cron text DEFAULT NULL, timezone text DEFAULT 'UTC',
                                every interval DEFAULT NULL, at timestamptz DEFAULT NULL,
                                starts timestamptz DEFAULT NULL, ends timestamptz DEFAULT NULL,
                                action_ref text DEFAULT NULL, parameters jsonb DEFAULT '{}',
                                catchup text DEFAULT 'latest', catchup_window interval DEFAULT '1 hour',
                                overlap text DEFAULT 'allow', description text DEFAULT NULL,
                                replace boolean DEFAULT false,
                                OUT schedule_id bigint, OUT created boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

CREATE FUNCTION delete_schedule(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- Its slots go with it (ON DELETE CASCADE); the executions and events they made stay.
    DELETE FROM schedule s WHERE s.name = delete_schedule.name;
    RETURN FOUND;
END
$$;

-- Pause and resume answer (schedule_id, was paused); no row: no such schedule. Slots
-- while paused are not fired (backfill them): resuming starts the schedule afresh from
-- now. Either verb on a schedule already in that state changes nothing.
CREATE FUNCTION pause_schedule(name text) RETURNS TABLE (schedule_id bigint, was boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    WITH old AS (SELECT s.id, s.paused FROM schedule s WHERE s.name = pause_schedule.name FOR UPDATE),
    moved AS (UPDATE schedule s SET paused = true, updated = now() FROM old
              WHERE s.id = old.id AND NOT old.paused RETURNING s.id)
    SELECT old.id, old.paused FROM old;
END
$$;

CREATE FUNCTION resume_schedule(name text) RETURNS TABLE (schedule_id bigint, was boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    WITH old AS (SELECT s.id, s.paused FROM schedule s WHERE s.name = resume_schedule.name FOR UPDATE),
    moved AS (UPDATE schedule s SET paused = false, next_fire = now(), updated = now() FROM old
              WHERE s.id = old.id AND old.paused RETURNING s.id)
    SELECT old.id, old.paused FROM old;
END
$$;

-- The execution of this schedule's latest requested slot, if it has not ended: the
-- "previous run still going" of the overlap policies.
CREATE FUNCTION schedule_running(schedule_id bigint) RETURNS bigint
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT e.id
    FROM (SELECT ss.execution FROM schedule_slot ss
          WHERE ss.schedule = schedule_running.schedule_id AND ss.execution IS NOT NULL
          ORDER BY ss.slot DESC LIMIT 1) l
    JOIN execution e ON e.id = l.execution
    WHERE e.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
$$;

-- Request the schedule's action (requested_by 'schedule:<name>') or emit its event
-- (source 'schedule'; payload: schedule, slot, origin). A refusal (unknown action,
-- invalid parameters, payload refused) is the slot's outcome 'request_error', not an
-- error of the whole pass: one broken schedule must not stop the others.
CREATE FUNCTION schedule_request(s schedule, slot timestamptz, origin text,
                                 OUT outcome text, OUT execution_id bigint, OUT event_id bigint, OUT error text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- One slot, once: the row is inserted or the slot was decided already (no row answered).
-- decision: 'fire' (request or emit), 'skip' (overlap), 'miss' (catch-up), 'buffer'.
CREATE FUNCTION schedule_fire_slot(s schedule, slot timestamptz, origin text, decision text)
RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- The executors' firing of one due schedule (locked by pick_due_schedules in this
-- transaction): cancel the previous run (cancel_previous), record every decided slot,
-- and move next_fire and last_slot on. decisions: [{slot, origin, action}] in order.
-- Answers the slot rows written (slots decided already are not written again).
CREATE FUNCTION fire_schedule_slots(schedule_id bigint, decisions jsonb, cancel bigint,
                                    next_fire timestamptz, last_slot timestamptz)
RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- A whole pass in one statement (one round trip however many schedules are due): each
-- element {id, decisions, cancel, next_fire, last_slot} as fire_schedule_slots takes it.
CREATE FUNCTION fire_schedules(batch jsonb) RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b jsonb;
BEGIN
    FOR b IN SELECT value FROM jsonb_array_elements(coalesce(batch, '[]')) LOOP
        RETURN QUERY SELECT * FROM fire_schedule_slots((b ->> 'id')::bigint, b -> 'decisions', (b ->> 'cancel')::bigint,
                                                       (b ->> 'next_fire')::timestamptz,
                                                       (b ->> 'last_slot')::timestamptz);
    END LOOP;
END
$$;

-- "Fire now": slot = now(), origin 'manual', whatever the overlap policy and even while
-- paused (asked for by a person). next_fire and last_slot are not moved.
CREATE FUNCTION fire_schedule(name text) RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- Backfill: each slot given (computed by the caller from the schedule's spec over a
-- range), origin 'backfill'; a slot fired already (by any origin) is not fired again.
-- Answers the slots fired now.
CREATE FUNCTION backfill_schedule(name text, slots timestamptz[]) RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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

-- buffer_one: the slot that waited fires once the run it waited for has ended (its
-- outcome becomes 'requested'; fired keeps when it was decided). Answers it, if any.
CREATE FUNCTION release_buffered_slot(schedule_id bigint) RETURNS SETOF schedule_slot
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
