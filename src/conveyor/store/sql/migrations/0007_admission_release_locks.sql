-- Release takes the group's lock before it touches the group's rows, for queued
-- executions too. 0006 deleted first and locked after (and never locked a group whose
-- waiter ended), so two writers could interleave on a group's rows:
-- * a waiter cancelled while a finishing execution promoted it: the promotion picked the
--   waiter, found it gone once the cancel committed, and admitted nobody, leaving the
--   next waiter beside a free slot until an admission repair noticed;
-- * a waiter ended (by an operator's own UPDATE) while a promotion admitted it: the
--   release found no slot yet, and the ended execution kept the slot for good.
-- Now every statement that ends executions first locks, in key order, the group of each
-- slot or queue row they have, then deletes and promotes in statements of their own --
-- each with a snapshot taken after the lock, so it sees what the group's previous holder
-- committed.
CREATE OR REPLACE FUNCTION admission_on_change() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ended_ids bigint[];
    g record;
    freed jsonb;
    admitted integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM execution_admission_slot)
       AND NOT EXISTS (SELECT 1 FROM execution_admission_queue) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(a.id) INTO ended_ids
    FROM after_rows a JOIN before_rows b USING (id)
    WHERE a.status IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned')
      AND b.status NOT IN ('completed', 'failed', 'cancelled', 'timeout', 'abandoned');
    IF ended_ids IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT DISTINCT policy, group_key FROM (
                 SELECT policy, group_key FROM execution_admission_slot WHERE execution = ANY(ended_ids)
                 UNION ALL
                 SELECT policy, group_key FROM execution_admission_queue WHERE execution = ANY(ended_ids)
             ) held ORDER BY policy, group_key LOOP
        PERFORM admission_lock(g.policy, g.group_key);
    END LOOP;
    DELETE FROM execution_admission_queue WHERE execution = ANY(ended_ids);
    WITH gone AS (
        DELETE FROM execution_admission_slot WHERE execution = ANY(ended_ids)
        RETURNING policy, group_key
    )
    SELECT jsonb_agg(DISTINCT jsonb_build_array(policy, group_key)) INTO freed FROM gone;
    IF freed IS NULL THEN
        RETURN NULL;
    END IF;
    FOR g IN SELECT value ->> 0 AS policy, value -> 1 AS group_key
             FROM jsonb_array_elements(freed) ORDER BY 1, 2 LOOP
        PERFORM admission_lock(g.policy, g.group_key);  -- held already (above): no wait
        admitted := admitted + admission_promote(g.policy, g.group_key);
    END LOOP;
    IF admitted > 0 THEN
        PERFORM pg_notify(current_schema() || '.requested', '');
    END IF;
    RETURN NULL;
END
$$;
