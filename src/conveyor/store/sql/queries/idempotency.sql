-- name: purge_idempotency_keys
-- Retention: keys first used longer than executor.idempotency_key_retention ago go (a
-- retry with one afterwards is a new request); their executions stay.
DELETE FROM execution_idempotency WHERE created < now() - make_interval(secs => %(retention)s);
