-- compatible-from: 35
-- A pause or a resume takes a workflow's rows in the order its advancement does (issue #25,
-- point 2, follow-up of 0034 for the cancel): the workflow's state row (workflow_execution)
-- first, then its execution row. An advancement holds the state row FOR UPDATE and, when it
-- ends the workflow, then updates its execution (paused -> running -> its end);
-- pause_execution and resume_execution locked the execution row first, then met the state
-- row (the 'pause' or 'resume' event's foreign key), so a pause or a resume racing the end
-- of that same workflow deadlocked, and PostgreSQL aborted one side after deadlock_timeout.
-- Now each takes the state row KEY SHARE before the execution row: the verb waits for an
-- advancement in flight (then reads what it did: a workflow that ended is a 409) and a later
-- advancement waits for the verb. What the order cannot exclude is retried whole by the
-- verb's callers (verbs.retried, database.verb_retries).
-- An expand migration: the same functions with the same signatures and answers.

CREATE OR REPLACE FUNCTION pause_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text)
LANGUAGE plpgsql SET search_path = conveyor AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    -- (0036) The state row before the execution row: the advancement's order.
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wf_id IS NULL OR current <> 'running' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'paused' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'paused' WHERE e.id = p_id AND e.status = 'running';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'pause', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'paused'::text;
END
$$;

CREATE OR REPLACE FUNCTION resume_execution(p_id bigint, p_by text)
RETURNS TABLE (id bigint, was text, now text)
LANGUAGE plpgsql SET search_path = conveyor AS $$
#variable_conflict use_column
DECLARE
    wf_id bigint;
    current text;
BEGIN
    -- (0036) The state row before the execution row: the advancement's order.
    SELECT w.id INTO wf_id FROM workflow_execution w WHERE w.execution = p_id FOR KEY SHARE;
    SELECT e.status INTO current FROM execution e WHERE e.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wf_id IS NULL OR current <> 'paused' THEN
        RETURN QUERY SELECT p_id, current, CASE WHEN wf_id IS NOT NULL AND current = 'running' THEN current END;
        RETURN;
    END IF;
    UPDATE execution e SET status = 'running' WHERE e.id = p_id AND e.status = 'paused';
    INSERT INTO workflow_event (workflow_execution, kind, payload)
    VALUES (wf_id, 'resume', jsonb_build_object('by', p_by));
    RETURN QUERY SELECT p_id, current, 'running'::text;
END
$$;
