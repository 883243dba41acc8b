-- name: list_triggers
-- Every trigger by name, with how many rules use it and its newest event.
SELECT t.name, t.type, t.payload_schema, t.description, t.created, t.updated,
       (SELECT count(*) FROM rule r WHERE r.trigger = t.name)::int AS rules,
       (SELECT max(e.received) FROM event e WHERE e.trigger = t.name) AS last_event
FROM trigger t
ORDER BY t.name;

-- name: get_trigger
-- One trigger (same columns as list_triggers); no row: no such trigger.
SELECT t.name, t.type, t.payload_schema, t.description, t.created, t.updated,
       (SELECT count(*) FROM rule r WHERE r.trigger = t.name)::int AS rules,
       (SELECT max(e.received) FROM event e WHERE e.trigger = t.name) AS last_event
FROM trigger t
WHERE t.name = %(name)s;

-- name: trigger_schema
-- The payload schema emit_event checks (NULL: any JSON); no row: no such trigger.
SELECT t.payload_schema FROM trigger t WHERE t.name = %(name)s;

-- name: register_trigger
-- The one write path of triggers (migration 0016): created (true) or updated (false).
SELECT register_trigger(%(name)s, %(type)s, %(payload_schema)s, %(description)s) AS created;

-- name: delete_trigger
-- Refused (CVC05) while rules, webhooks, schedules or events use it; false: no such trigger.
SELECT delete_trigger(%(name)s) AS deleted;

-- name: emit_event
-- The one door for events (migration 0016): (event_id, repeated).
SELECT event_id, repeated FROM emit_event_once(%(trigger)s, %(payload)s, %(source)s, %(key)s);

-- name: list_events
-- Newest first, filtered; ``before`` is the cursor (ids below it). ``pending``: its rules
-- have not been evaluated yet.
SELECT e.id, e.trigger, e.payload, e.source, e.received, e.idempotency_key, e.replay_of,
       EXISTS (SELECT 1 FROM event_pending p WHERE p.event = e.id) AS pending
FROM event e
WHERE (%(trigger)s::text IS NULL OR e.trigger = %(trigger)s)
  AND (%(source)s::text IS NULL OR e.source = %(source)s)
  AND (%(since)s::timestamptz IS NULL OR e.received >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR e.received < %(until)s)
  AND (%(before)s::bigint IS NULL OR e.id < %(before)s)
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: get_event
-- One event (same columns as list_events); no row: no such event.
SELECT e.id, e.trigger, e.payload, e.source, e.received, e.idempotency_key, e.replay_of,
       EXISTS (SELECT 1 FROM event_pending p WHERE p.event = e.id) AS pending
FROM event e
WHERE e.id = %(id)s;

-- name: event_enforcements
-- The decisions the rules made about one event, oldest first.
SELECT n.id, n.rule, n.rule_ref, n.event, n.outcome, n.execution, n.parameters, n.error, n.created
FROM enforcement n
WHERE n.event = %(id)s
ORDER BY n.id;

-- name: event_replays
-- The replays of one event (new events naming it), oldest first.
SELECT e.id, e.received FROM event e WHERE e.replay_of = %(id)s ORDER BY e.id;

-- name: replay_event
-- A new event with the original's trigger and payload (migration 0016); CVN05: no such event.
SELECT replay_event(%(id)s) AS id;

-- name: replay_events
-- One replay per original event of the trigger received in [since, until) (until NULL:
-- the database's now()); CVE01: no such trigger.
SELECT original, replay FROM replay_events(%(trigger)s, %(since)s, coalesce(%(until)s::timestamptz, now()));

-- name: list_enforcements
-- Newest first, filtered by rule ref, event, outcome and creation time; ``before`` is the
-- cursor (ids below it).
SELECT n.id, n.rule, n.rule_ref, n.event, n.outcome, n.execution, n.parameters, n.error, n.created
FROM enforcement n
WHERE (%(rule)s::text IS NULL OR n.rule_ref = %(rule)s)
  AND (%(event)s::bigint IS NULL OR n.event = %(event)s)
  AND (%(outcome)s::text IS NULL OR n.outcome = %(outcome)s)
  AND (%(since)s::timestamptz IS NULL OR n.created >= %(since)s)
  AND (%(before)s::bigint IS NULL OR n.id < %(before)s)
ORDER BY n.id DESC
LIMIT %(limit)s;

-- name: get_enforcement
-- One enforcement, with its event's trigger; no row: no such enforcement.
SELECT n.id, n.rule, n.rule_ref, n.event, n.outcome, n.execution, n.parameters, n.error, n.created,
       e.trigger
FROM enforcement n LEFT JOIN event e ON e.id = n.event
WHERE n.id = %(id)s;

-- name: enter_schema
-- A caller's own connection (an SDK function given one) may have no search_path to
-- Conveyor's schema, and the verbs' statements name none: the schema for the verb's
-- savepoint (set_config local: it lasts until the caller's transaction ends). ``was``:
-- the caller's search_path to put back (NULL: it was the schema already, nothing set).
SELECT CASE WHEN w.was = quote_ident(%(schema)s) THEN NULL ELSE w.was END AS was,
       CASE WHEN w.was = quote_ident(%(schema)s) THEN NULL
            ELSE set_config('search_path', quote_ident(%(schema)s), true) END AS now
FROM (SELECT current_setting('search_path') AS was) w;

-- name: leave_schema
-- The caller's search_path back after enter_schema, for the rest of its transaction.
SELECT set_config('search_path', %(was)s, true) AS now;

-- name: database_time_ago
-- The database's now() less an interval: a window given as a duration ago (``--since 1h``)
-- starts by the database's clock, as the events' ``received`` times do.
SELECT now() - %(ago)s::interval AS at;
