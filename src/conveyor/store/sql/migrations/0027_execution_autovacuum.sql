-- Autovacuum for `execution` by the number of its dead rows, not by its size (issue #14).
--
-- Every execution enters the partial indexes on live statuses (execution_requested_idx,
-- execution_requested_action_idx, execution_on_worker_idx) at their right end and leaves
-- them by an update, which leaves a dead entry at their left end -- where every claim, every
-- worker's claim of its dispatches and every live_workers count starts its walk. A scan
-- steps over dead entries, but their pages go only when VACUUM cleans the index. With the
-- default thresholds (50 rows + 20 % of the table) a table of ten million finished rows is
-- two million dead rows away from autovacuum: measured on one, after ~200,000 executions a
-- claim of one row walked 1,205 index pages (3.2 ms), and one plain VACUUM (3.1 s on that
-- table, through the visibility map) brought it back to 45 (0.7 ms).
--
-- 1,000 rows + 1 % of the table: about as often as the default on a young table, fifty times
-- as often on a 10M-row history (every ~25,000 executions, which leave about four dead rows
-- each). vacuum_index_cleanup = on: with few heap pages holding dead rows (which frequent
-- vacuums make likely on a big table) VACUUM would otherwise skip the indexes, and the indexes
-- are the point. The cost is each run reading every index of the table (about 2 GB at 10M
-- rows, mostly from cache), throttled by autovacuum's cost limit, at most once per
-- autovacuum_naptime. Operators can change both with ALTER TABLE (docs/runbook.md).
ALTER TABLE execution SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    vacuum_index_cleanup = on
);
