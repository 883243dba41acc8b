-- name: dash_events
-- The dashboard's events, newest first (a page: before = the last id shown), optionally of
-- one trigger: whether their rules are still to be evaluated (event_pending), how many
-- enforcements they made and of which outcome, and the event each one replays.
SELECT e.id, e.trigger, e.source, e.received, e.replay_of, e.idempotency_key,
       EXISTS (SELECT 1 FROM event_pending p WHERE p.event = e.id) AS pending,
       coalesce((SELECT jsonb_object_agg(o.outcome, o.n ORDER BY o.outcome)
                 FROM (SELECT f.outcome, count(*)::int AS n FROM enforcement f
                       WHERE f.event = e.id GROUP BY f.outcome) o), '{}') AS outcomes
FROM event e
WHERE (%(trigger)s::text IS NULL OR e.trigger = %(trigger)s::text)
  AND (%(before)s::bigint IS NULL OR e.id < %(before)s::bigint)
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: dash_event
-- One event, whole (the page bounds how much of the payload it shows).
SELECT e.id, e.trigger, t.type AS trigger_type, e.payload, e.source, e.received, e.idempotency_key,
       e.replay_of, EXISTS (SELECT 1 FROM event_pending p WHERE p.event = e.id) AS pending,
       (SELECT p.since FROM event_pending p WHERE p.event = e.id) AS pending_since
FROM event e JOIN trigger t ON t.name = e.trigger
WHERE e.id = %(id)s;

-- name: dash_event_replays
-- The events replaying this one (newest first, bounded).
SELECT e.id, e.received, e.source FROM event e
WHERE e.replay_of = %(id)s
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: dash_enforcements
-- Enforcements, newest first, optionally of one outcome, one rule (by ref: kept when the
-- rule is deleted) and one event, with the status of the execution each one requested.
SELECT f.id, f.rule, f.rule_ref, f.event, f.outcome, f.execution, f.error, f.created,
       ev.trigger, x.status AS execution_status
FROM enforcement f
LEFT JOIN event ev ON ev.id = f.event
LEFT JOIN execution x ON x.id = f.execution
WHERE (%(outcome)s::text IS NULL OR f.outcome = %(outcome)s::text)
  AND (%(rule_ref)s::text IS NULL OR f.rule_ref = %(rule_ref)s::text)
  AND (%(event)s::bigint IS NULL OR f.event = %(event)s::bigint)
  AND (%(before)s::bigint IS NULL OR f.id < %(before)s::bigint)
ORDER BY f.id DESC
LIMIT %(limit)s;

-- name: dash_rules
-- Every rule with its latest enforcement (enforcement_rule_created_idx finds it).
SELECT r.id, r.ref, r.trigger, r.action_ref, r.enabled, r.description, r.updated,
       last.id AS last_id, last.outcome AS last_outcome, last.created AS last_created,
       last.execution AS last_execution
FROM rule r
LEFT JOIN LATERAL (SELECT f.id, f.outcome, f.created, f.execution FROM enforcement f
                   WHERE f.rule = r.id ORDER BY f.created DESC LIMIT 1) last ON true
ORDER BY r.ref;

-- name: dash_rule
SELECT r.id, r.ref, r.trigger, r.criteria, r.action_ref, r.parameters, r.enabled, r.description,
       r.created, r.updated
FROM rule r
WHERE r.ref = %(ref)s;

-- name: dash_triggers
-- Every trigger with its event count (the (trigger, received) index counts them) and the
-- time of its latest event.
SELECT t.name, t.type, t.payload_schema, t.description, t.updated,
       (SELECT count(*) FROM event e WHERE e.trigger = t.name)::bigint AS events,
       (SELECT max(e.received) FROM event e WHERE e.trigger = t.name) AS last_event,
       (SELECT count(*) FROM rule r WHERE r.trigger = t.name)::int AS rules
FROM trigger t
ORDER BY t.name;

-- name: dash_webhooks
-- Webhooks as the dashboard shows them: how they authenticate, never with what (neither
-- token_hash nor secret is read here).
SELECT w.name, w.trigger, w.auth, w.enabled, w.signature_header, w.idempotency_header, w.max_body_bytes,
       w.description, w.updated
FROM webhook w
ORDER BY w.name;

-- name: dash_schedules
-- Every schedule, its last slot, and the database clock (for the next fire times the
-- page computes, and each schedule's lateness).
SELECT s.id, s.name, s.kind, s.cron, s.timezone, s.every, s.at, s.starts, s.ends, s.action_ref, s.trigger,
       s.catchup, s.catchup_window, s.overlap, s.paused, s.next_fire, s.last_slot, s.description,
       s.created, s.updated, now() AS db_now,
       ls.slot AS last_slot_time, ls.outcome AS last_outcome, ls.execution AS last_execution,
       ls.fired AS last_fired
FROM schedule s
LEFT JOIN LATERAL (SELECT l.slot, l.outcome, l.execution, l.fired FROM schedule_slot l
                   WHERE l.schedule = s.id ORDER BY l.slot DESC LIMIT 1) ls ON true
ORDER BY s.name;

-- name: dash_schedule
SELECT s.id, s.name, s.kind, s.cron, s.timezone, s.every, s.at, s.starts, s.ends, s.action_ref, s.parameters,
       s.trigger, s.catchup, s.catchup_window, s.overlap, s.paused, s.next_fire, s.last_slot, s.description,
       s.created, s.updated, now() AS db_now
FROM schedule s
WHERE s.name = %(name)s;

-- name: dash_schedule_slots
-- A schedule's newest slots: when each fired and its lag (fired - slot), how (origin),
-- what came of it, and the status of the execution it requested.
SELECT l.slot, l.fired, extract(epoch FROM l.fired - l.slot)::float8 AS lag, l.origin, l.outcome,
       l.execution, l.event, l.error, x.status AS execution_status
FROM schedule_slot l
LEFT JOIN execution x ON x.id = l.execution
WHERE l.schedule = %(id)s
ORDER BY l.slot DESC
LIMIT %(limit)s;

-- name: dash_execution_origin
-- What started an execution: the enforcement it names (its rule and event), or the
-- schedule slot that requested it. Either may be absent (requested by hand).
SELECT x.enforcement, f.rule, f.rule_ref, f.event,
       s.name AS schedule, l.slot
FROM execution x
LEFT JOIN enforcement f ON f.id = x.enforcement
LEFT JOIN LATERAL (SELECT sl.schedule, sl.slot FROM schedule_slot sl
                   WHERE sl.execution = x.id ORDER BY sl.slot LIMIT 1) l ON true
LEFT JOIN schedule s ON s.id = l.schedule
WHERE x.id = %(id)s;

-- name: dash_trigger_names
-- The events page's trigger filter (names only: counting events is the triggers page's).
SELECT name FROM trigger ORDER BY name;

-- name: dash_rule_refs
-- The enforcements page's rule filter.
SELECT ref FROM rule ORDER BY ref;
