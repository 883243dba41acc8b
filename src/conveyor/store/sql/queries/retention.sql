-- name: purge_executions
-- Retention (migration 0024): at most `batch` finished top-level executions of these
-- statuses older than `older_than` seconds, with their trees; the number deleted.
SELECT purge_executions(make_interval(secs => %(older_than)s), %(statuses)s::text[], %(batch)s) AS purged;

-- name: purgeable_executions
SELECT purgeable_executions(make_interval(secs => %(older_than)s), %(statuses)s::text[]) AS count;
