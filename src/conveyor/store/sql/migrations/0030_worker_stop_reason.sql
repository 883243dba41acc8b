-- Why and since when a worker is inactive (issue #15), so that the Workers page, the API and
-- `conveyor workers list` tell a graceful stop from a death without reading executor logs.
-- Set by the one statement that moves the worker to inactive, in the same statement:
--   stopped         the worker's own graceful shutdown (set_worker_status, worker.sql);
--   process_gone    its liveness lock gone and no session of its process left: the process
--                   died (kill -9, OOM, crash) -- recovery.sql, deactivate_dead_workers;
--   lock_lost       its liveness lock gone for longer than its lock_grace while other
--                   sessions of its process lived on (its liveness session dropped alone);
--   heartbeat_stale its heartbeat older than its stale_after, or never sent (a partition,
--                   a hung process, a host gone without closing its sockets).
-- Both are cleared when a process (re)registers under the name (register_worker). Rows
-- inactive before this migration have neither: nobody recorded why.
ALTER TABLE worker
    ADD COLUMN inactive_reason text
        CHECK (inactive_reason IN ('stopped', 'process_gone', 'lock_lost', 'heartbeat_stale')),
    ADD COLUMN inactive_since timestamptz;
