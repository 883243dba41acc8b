-- name: webhook_door
-- What the door needs to decide (secret and token hash included: never shown). An
-- unknown and a disabled webhook both answer no row, so they cannot be told apart.
SELECT w.name, w.trigger, w.auth, w.token_hash, w.secret, w.signature_header, w.signature_prefix,
       w.idempotency_header, w.max_body_bytes, t.payload_schema
FROM webhook w JOIN trigger t ON t.name = w.trigger
WHERE w.name = %(name)s AND w.enabled;

-- name: list_webhooks
-- Never the secret or the token hash: only whether one is set.
SELECT w.name, w.trigger, w.auth, w.secret IS NOT NULL AS secret_set, w.token_hash IS NOT NULL AS token_set,
       w.signature_header, w.signature_prefix, w.idempotency_header, w.max_body_bytes, w.enabled,
       w.description, t.payload_schema, w.created, w.updated,
       (SELECT count(*) FROM event e WHERE e.trigger = w.trigger AND e.source = 'webhook')::bigint AS events,
       (SELECT max(e.received) FROM event e WHERE e.trigger = w.trigger AND e.source = 'webhook') AS last_event
FROM webhook w JOIN trigger t ON t.name = w.trigger
ORDER BY w.name;

-- name: get_webhook
SELECT w.name, w.trigger, w.auth, w.secret IS NOT NULL AS secret_set, w.token_hash IS NOT NULL AS token_set,
       w.signature_header, w.signature_prefix, w.idempotency_header, w.max_body_bytes, w.enabled,
       w.description, t.payload_schema, w.created, w.updated,
       (SELECT count(*) FROM event e WHERE e.trigger = w.trigger AND e.source = 'webhook')::bigint AS events,
       (SELECT max(e.received) FROM event e WHERE e.trigger = w.trigger AND e.source = 'webhook') AS last_event
FROM webhook w JOIN trigger t ON t.name = w.trigger
WHERE w.name = %(name)s;

-- name: register_webhook
-- The SQL function of migration 0017 (CVW01: invalid; CVC05: the trigger has another type).
SELECT created FROM register_webhook(%(name)s, %(trigger)s, %(auth)s, %(token_hash)s, %(secret)s,
                                     %(signature_header)s, %(signature_prefix)s, %(idempotency_header)s,
                                     %(max_body_bytes)s, %(description)s, %(payload_schema)s);

-- name: delete_webhook
SELECT delete_webhook(%(name)s) AS deleted;

-- name: set_webhook_enabled
-- No row: no such webhook.
SELECT was FROM set_webhook_enabled(%(name)s, %(enabled)s);

-- name: emit_webhook_event
-- The one door for events (migration 0016), with source 'webhook'.
SELECT event_id, repeated FROM emit_event_once(%(trigger)s, %(payload)s, 'webhook', %(key)s);
