-- compatible-from: 32
-- Bounds on what one top-level workflow may create in all, sub-workflows included (issue
-- #25, point 3): a workflow could dispatch without bound. One counter row per tree (the
-- top-level workflow's execution), charged by the advancement that creates the task
-- instances and children, in its own transaction: the row lock serializes the replicas
-- advancing different sub-workflows of one tree, and a charge over the bound raises, so
-- the advancement rolls back whole -- nothing of it is created, nothing is counted -- and
-- the executor fails the workflow that asked with this error (executor/workflows.py).
-- An expand migration: a new table and a new function, which the previous release's
-- executors never call (their trees are simply not counted).

CREATE TABLE workflow_tree (
    root       bigint PRIMARY KEY REFERENCES execution (id) ON DELETE CASCADE,
    tasks      bigint NOT NULL DEFAULT 0 CHECK (tasks >= 0),       -- task instances created
    executions bigint NOT NULL DEFAULT 0 CHECK (executions >= 0),  -- children requested (retries too)
    updated    timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE workflow_tree IS
    'what the workflows under one top-level workflow execution created, for workflow.max_tree_*';

-- Charge each workflow's new task instances and children to its tree (the execution at
-- the top of its execution.parent chain), trees in id order (two batches charging the
-- same trees lock them in the same order). Over p_max_tasks or p_max_executions: raises
-- CVB01 naming the bound and its setting, which rolls the caller's transaction back.
CREATE FUNCTION charge_workflow_trees(p_wids bigint[], p_tasks integer[], p_executions integer[],
                                      p_max_tasks bigint, p_max_executions bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    t workflow_tree;
BEGIN
    FOR r IN
        WITH RECURSIVE u AS (
            SELECT * FROM unnest(p_wids, p_tasks, p_executions) AS u(wid, tasks, executions)
        ), up AS (
            SELECT u.wid, e.id, e.parent
            FROM u JOIN workflow_execution w ON w.id = u.wid JOIN execution e ON e.id = w.execution
            UNION ALL
            SELECT up.wid, p.id, p.parent FROM up JOIN execution p ON p.id = up.parent
        )
        SELECT up.id AS root, sum(u.tasks) AS tasks, sum(u.executions) AS executions
        FROM up JOIN u ON u.wid = up.wid
        WHERE up.parent IS NULL
        GROUP BY up.id
        HAVING sum(u.tasks) > 0 OR sum(u.executions) > 0
        ORDER BY up.id
    LOOP
        INSERT INTO workflow_tree AS w (root, tasks, executions) VALUES (r.root, r.tasks, r.executions)
        ON CONFLICT (root) DO UPDATE
        SET tasks = w.tasks + EXCLUDED.tasks, executions = w.executions + EXCLUDED.executions, updated = now()
        RETURNING w.* INTO t;
        IF t.executions > p_max_executions THEN
            RAISE EXCEPTION 'workflow execution % and its sub-workflows would request more than % child executions (workflow.max_tree_executions)',
                r.root, p_max_executions USING ERRCODE = 'CVB01';
        END IF;
        IF t.tasks > p_max_tasks THEN
            RAISE EXCEPTION 'workflow execution % and its sub-workflows would create more than % task instances (workflow.max_tree_tasks)',
                r.root, p_max_tasks USING ERRCODE = 'CVB01';
        END IF;
    END LOOP;
END
$$;
