-- name: pick_due_schedules
-- Due schedules (next_fire passed), earliest first, locked for this pass; a replica
-- firing one already holds it and it is skipped, so two replicas at a slot boundary
-- never both decide it. `now` is the transaction's clock (fired = now() too); `running`
-- the previous run still going (only the overlap policies that look at it pay for it),
-- `buffered` whether a slot already waits for it (buffer_one).
SELECT s.id, s.name, s.kind, s.cron, s.timezone, s.every, s.at, s.starts, s.ends, s.action_ref, s.trigger,
       s.catchup, s.catchup_window, s.overlap, s.next_fire, s.last_slot, s.created, s.updated, now() AS now,
       CASE WHEN s.overlap <> 'allow' AND s.action_ref IS NOT NULL THEN schedule_running(s.id) END AS running,
       (s.overlap = 'buffer_one'
        AND EXISTS (SELECT 1 FROM schedule_slot b WHERE b.schedule = s.id AND b.outcome = 'buffered')) AS buffered
FROM schedule s
WHERE s.next_fire <= now() AND NOT s.paused
ORDER BY s.next_fire
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: fire_schedules
-- Apply the decisions of a pass (conveyor.domain.schedules.plan), every due schedule in
-- one statement: the slot rows written.
SELECT * FROM fire_schedules(%(batch)s);

-- name: buffered_schedules
-- Schedules with a slot waiting for the previous run (buffer_one), not held by another
-- replica: release_buffered_slot fires it once that run has ended.
SELECT s.id, s.name FROM schedule s
WHERE s.id IN (SELECT b.schedule FROM schedule_slot b WHERE b.outcome = 'buffered') AND NOT s.paused
ORDER BY s.id
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: release_buffered_slot
SELECT * FROM release_buffered_slot(%(id)s);

-- name: next_schedule_fire
-- Seconds (database clock) until the earliest next fire time, NULL if none: the firing
-- loop sleeps exactly that long (schedule_next_fire_idx). Negative: due now (another
-- replica may be firing it).
SELECT extract(epoch FROM min(s.next_fire) - now())::float8 AS wait
FROM schedule s
WHERE NOT s.paused AND s.next_fire IS NOT NULL;

-- name: create_schedule
SELECT * FROM create_schedule(
    name => %(name)s, kind => %(kind)s, cron => %(cron)s, timezone => %(timezone)s, every => %(every)s,
    at => %(at)s, starts => %(starts)s, ends => %(ends)s, action_ref => %(action_ref)s,
    parameters => %(parameters)s, catchup => %(catchup)s, catchup_window => %(catchup_window)s,
    overlap => %(overlap)s, description => %(description)s, replace => %(replace)s);

-- name: patch_schedule
-- The SQL function of migration 0035: the fields named, checked by the caller, applied
-- to the row locked (a concurrent PATCH of other fields is kept).
SELECT * FROM patch_schedule(
    p_name => %(name)s, p_fields => %(fields)s, p_kind => %(kind)s, p_cron => %(cron)s,
    p_timezone => %(timezone)s, p_every => %(every)s, p_at => %(at)s, p_starts => %(starts)s,
    p_ends => %(ends)s, p_action_ref => %(action_ref)s, p_parameters => %(parameters)s,
    p_catchup => %(catchup)s, p_catchup_window => %(catchup_window)s, p_overlap => %(overlap)s,
    p_description => %(description)s);

-- name: delete_schedule
SELECT delete_schedule(%(name)s) AS deleted;

-- name: pause_schedule
SELECT schedule_id, was FROM pause_schedule(%(name)s);

-- name: resume_schedule
SELECT schedule_id, was FROM resume_schedule(%(name)s);

-- name: fire_schedule
SELECT * FROM fire_schedule(%(name)s);

-- name: backfill_schedule
SELECT * FROM backfill_schedule(%(name)s, %(slots)s::timestamptz[]);

-- name: get_schedule
-- One schedule with the database's now (the next fire times shown are computed from it).
SELECT s.*, now() AS now FROM schedule s WHERE s.name = %(name)s;

-- name: list_schedules
SELECT s.*, now() AS now FROM schedule s ORDER BY s.name LIMIT %(limit)s;

-- name: schedule_slots
-- A schedule's most recent slots, newest first, with the status of the execution each
-- requested.
SELECT ss.slot, ss.origin, ss.outcome, ss.execution, ss.event, ss.error, ss.fired,
       extract(epoch FROM ss.fired - ss.slot)::float8 AS lag, e.status AS execution_status
FROM schedule_slot ss
LEFT JOIN execution e ON e.id = ss.execution
WHERE ss.schedule = %(id)s
ORDER BY ss.slot DESC
LIMIT %(limit)s;
