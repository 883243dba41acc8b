-- compatible-from: 37
-- The workflow and task status graphs as data, enforced like execution_guard (issue #26):
-- workflow_execution.status and workflow_task.status were changed by the advancement's
-- writes (workflow_update, workflow_upsert_tasks) with no guard. Now each graph is a table
-- of the edges the code makes (the same as conveyor.domain.workflow_status, which a test
-- compares) and a BEFORE UPDATE trigger refuses any other change, whatever issued it.
--
-- An advancement stores its net effect, several of the conductor's steps in one write, so
-- an edge may be a composite: paused -> succeeded is a resume and the end in one
-- advancement; a task failed -> running is a rerun's join waiting again, then reached by an
-- action-less task of the same advancement. Rows are created in any status (an instance
-- that ends as it starts, a rerun's copy): only a change is guarded.
-- An expand migration: the code of 37 makes no other change.

CREATE TABLE workflow_transition (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO workflow_transition (from_status, to_status) VALUES
    -- pause; cancel; the end (a cancel and the end in one advancement: -> cancelled)
    ('running', 'paused'), ('running', 'canceling'),
    ('running', 'succeeded'), ('running', 'failed'), ('running', 'cancelled'),
    -- resume; cancel; a workflow timeout; resume or cancel, then the end
    ('paused', 'running'), ('paused', 'canceling'),
    ('paused', 'succeeded'), ('paused', 'failed'), ('paused', 'cancelled'),
    -- the end once nothing runs; a workflow timeout (or a broken advancement) while canceling
    ('canceling', 'cancelled'), ('canceling', 'failed');

CREATE TABLE workflow_task_transition (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO workflow_task_transition (from_status, to_status) VALUES
    -- started (its child or items); an action-less task, or no items, ends at once; an
    -- input that fails to evaluate, a join that can never fire; a cancel or timeout
    ('waiting', 'running'), ('waiting', 'succeeded'), ('waiting', 'failed'), ('waiting', 'cancelled'),
    -- its children ended; a task timeout; a cancel or a workflow timeout
    ('running', 'succeeded'), ('running', 'failed'), ('running', 'cancelled'),
    -- a rerun: a join that could not fire waits again (and, reached in the same
    -- advancement, starts or ends; or a cancel in the same advancement cancels it)
    ('failed', 'waiting'), ('failed', 'running'), ('failed', 'succeeded'), ('failed', 'cancelled');

CREATE FUNCTION workflow_execution_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_transition t
                   WHERE t.from_status = OLD.status AND t.to_status = NEW.status) THEN
        RAISE EXCEPTION 'illegal workflow transition % -> % (workflow execution %)', OLD.status, NEW.status, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
-- WHEN: an update that keeps the status (most of them: context, errors) costs no call.
CREATE TRIGGER workflow_execution_guard BEFORE UPDATE ON workflow_execution
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION workflow_execution_guard();

CREATE FUNCTION workflow_task_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
CREATE TRIGGER workflow_task_guard BEFORE UPDATE ON workflow_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION workflow_task_guard();
