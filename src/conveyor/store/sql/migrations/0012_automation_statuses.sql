-- Workflows and inquiries run in the executor, not on a worker: they need runner types
-- of their own and two statuses.
--   pending  an inquiry (core.ask) waits for a human answer; holds no worker slot
--   paused   a workflow whose operator paused it: no new task starts, children in
--            flight finish; resume takes it back to running
-- The edges (also in conveyor.domain.status.TRANSITIONS):
--   scheduling -> running   a workflow claimed by an executor starts (no worker)
--   scheduling -> pending   an inquiry claimed by an executor is asked
--   pending    -> completed | failed | timeout | cancelled
--   running   <-> paused;   paused -> canceling | cancelled
ALTER TABLE action DROP CONSTRAINT action_runner_type_check;
ALTER TABLE action ADD CONSTRAINT action_runner_type_check
    CHECK (runner_type IN ('python', 'subprocess', 'workflow', 'inquiry'));

ALTER TABLE execution DROP CONSTRAINT execution_status_check;
ALTER TABLE execution ADD CONSTRAINT execution_status_check
    CHECK (status IN ('requested', 'scheduling', 'scheduled', 'running', 'pending', 'paused', 'completed',
                      'failed', 'canceling', 'cancelled', 'timeout', 'abandoned'));

INSERT INTO execution_transition (from_status, to_status) VALUES
    ('scheduling', 'running'), ('scheduling', 'pending'),
    ('pending', 'completed'), ('pending', 'failed'), ('pending', 'timeout'), ('pending', 'cancelled'),
    ('running', 'paused'), ('paused', 'running'), ('paused', 'canceling'), ('paused', 'cancelled');
