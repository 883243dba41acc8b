-- name: pick_pending_events
-- A batch of events awaiting their rules, oldest first, locked for this pass (rows
-- another executor holds are skipped: it is enforcing them), with the rules on their
-- triggers. enforce_events deletes the event_pending rows in the same transaction.
WITH picked AS (
    SELECT p.event FROM event_pending p ORDER BY p.event LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
SELECT e.id, e.trigger, e.payload, e.source, e.received,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', r.id, 'ref', r.ref, 'criteria', r.criteria, 'action_ref', r.action_ref,
                     'parameters', r.parameters, 'enabled', r.enabled, 'updated', r.updated) ORDER BY r.id)
                 FROM rule r WHERE r.trigger = e.trigger), '[]') AS rules
FROM picked k JOIN event e ON e.id = k.event
ORDER BY e.id;

-- name: enforce_events
-- Write a pass's decisions (migration 0018): enforcements, their executions, the
-- event_pending rows deleted; one row per enforcement and one per event taken.
SELECT event, enforcement, rule_ref, outcome, execution, error
FROM enforce_events(%(events)s, %(decisions)s);

-- name: list_rules
-- Rules, by ref, with how many enforcements each has made.
SELECT r.id, r.ref, r.trigger, r.criteria, r.action_ref, r.parameters, r.enabled, r.description,
       r.created, r.updated,
       (SELECT count(*) FROM enforcement f WHERE f.rule = r.id) AS enforcements
FROM rule r
WHERE %(trigger)s::text IS NULL OR r.trigger = %(trigger)s
ORDER BY r.ref
LIMIT %(limit)s;

-- name: get_rule
-- One rule by ref, with its definition as registered.
SELECT r.id, r.ref, r.trigger, r.criteria, r.action_ref, r.parameters, r.enabled, r.description,
       r.definition, r.created, r.updated
FROM rule r WHERE r.ref = %(ref)s;

-- name: rule_enforcements
-- A rule's most recent enforcements (by rule_ref: kept when the rule was deleted).
SELECT f.id, f.event, f.outcome, f.execution, f.parameters, f.error, f.created
FROM enforcement f WHERE f.rule_ref = %(ref)s
ORDER BY f.id DESC
LIMIT %(limit)s;

-- name: register_rule
-- Create or update a rule by ref (migration 0016; the caller validated it first).
SELECT rule_id, created
FROM register_rule(%(ref)s, %(trigger)s, %(criteria)s, %(action_ref)s, %(parameters)s, %(enabled)s,
                   %(description)s, %(definition)s);

-- name: delete_rule
-- Delete a rule by ref; its enforcements stay (rule_ref). False: no such rule.
SELECT delete_rule(%(ref)s) AS deleted;

-- name: set_rule_enabled
-- Enable or disable a rule by ref; no row: no such rule.
SELECT rule_id, was FROM set_rule_enabled(%(ref)s, %(enabled)s);

-- name: lock_pending_events
-- These pending events (an event of a failed batch retried alone), locked, with their
-- rules: pick_pending_events for given ids.
WITH picked AS (
    SELECT p.event FROM event_pending p WHERE p.event = ANY(%(ids)s) FOR UPDATE SKIP LOCKED
)
SELECT e.id, e.trigger, e.payload, e.source, e.received,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', r.id, 'ref', r.ref, 'criteria', r.criteria, 'action_ref', r.action_ref,
                     'parameters', r.parameters, 'enabled', r.enabled, 'updated', r.updated) ORDER BY r.id)
                 FROM rule r WHERE r.trigger = e.trigger), '[]') AS rules
FROM picked k JOIN event e ON e.id = k.event
ORDER BY e.id;
