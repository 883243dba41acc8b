-- Webhooks (issue #13): registering, enabling and deleting them. The door itself
-- (POST /api/v1/webhooks/{name}) reads the webhook table and calls emit_event_once with
-- source 'webhook'; see docs/webhooks.md.
--
-- Secrets at rest: a bearer token is kept only as its SHA-256 hex (token_hash), as API
-- tokens are; an HMAC secret is kept as given (webhook.secret), since verifying a
-- signature needs it. Neither is ever read back by the CLI or the API (they show whether
-- one is set).
--
-- SQLSTATEs: CVW01 invalid webhook definition; register_trigger's CVC05 when the trigger
-- exists with another type. "No such webhook" is no row (or false), as for rules.

-- Create or update the webhook `name` and its trigger (type 'webhook'; named after the
-- webhook unless `trigger` says otherwise, and on update the one it has; its
-- payload_schema and description are set from here) in one transaction. On update, a NULL secret (auth 'hmac') or token_hash
-- (auth 'bearer') keeps the one stored, so settings can change without re-sending it;
-- NULL headers, prefix and limit mean the defaults. Answers created = true for a new one.
CREATE FUNCTION register_webhook(name text, trigger text DEFAULT NULL, auth text DEFAULT 'hmac',
                                 token_hash text DEFAULT NULL, secret text DEFAULT NULL,
                                 signature_header text DEFAULT NULL, signature_prefix text DEFAULT NULL,
                                 idempotency_header text DEFAULT NULL, max_body_bytes integer DEFAULT NULL,
                                 description text DEFAULT NULL, payload_schema jsonb DEFAULT NULL,
                                 OUT created boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_variable
DECLARE
    trig text;
    old webhook;
    -- An HTTP header name (RFC 9110 token).
    header_re constant text := '^[A-Za-z0-9!#$%&''*+.^_`|~-]{1,255}$';
    name_re constant text := '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_.-]+)?$';
    sig_header text := coalesce(register_webhook.signature_header, 'X-Hub-Signature-256');
    sig_prefix text := coalesce(register_webhook.signature_prefix, 'sha256=');
    key_header text := coalesce(register_webhook.idempotency_header, 'Idempotency-Key');
    body_limit integer := coalesce(register_webhook.max_body_bytes, 1048576);
    kept_secret text;
    kept_hash text;
BEGIN
    IF register_webhook.name IS NULL OR length(register_webhook.name) > 255 OR register_webhook.name !~ name_re THEN
        RAISE EXCEPTION 'invalid webhook name %: letters, digits, _ and - (an optional dotted suffix), '
            'at most 255 characters', quote_nullable(register_webhook.name) USING ERRCODE = 'CVW01';
    END IF;
    -- Two registrations of one name at once: the second waits, then updates what the first
    -- created (rather than failing on the primary key).
    PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.webhook:' || register_webhook.name, 0));
    SELECT * INTO old FROM webhook w WHERE w.name = register_webhook.name FOR UPDATE;
    trig := coalesce(register_webhook.trigger, old.trigger, register_webhook.name);
    IF length(trig) > 255 OR trig !~ name_re THEN
        RAISE EXCEPTION 'invalid trigger name %', quote_literal(trig) USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.auth IS NULL OR register_webhook.auth NOT IN ('none', 'bearer', 'hmac') THEN
        RAISE EXCEPTION 'invalid webhook auth %: none, bearer or hmac', quote_nullable(register_webhook.auth)
            USING ERRCODE = 'CVW01';
    END IF;
    IF sig_header !~ header_re OR key_header !~ header_re THEN
        RAISE EXCEPTION 'invalid header name % or %: an HTTP header name (letters, digits, -), at most 255',
            quote_literal(sig_header), quote_literal(key_header) USING ERRCODE = 'CVW01';
    END IF;
    IF length(sig_prefix) > 64 THEN
        RAISE EXCEPTION 'signature prefix longer than 64 characters' USING ERRCODE = 'CVW01';
    END IF;
    IF body_limit NOT BETWEEN 1 AND 67108864 THEN
        RAISE EXCEPTION 'max_body_bytes % out of range: 1 to 67108864 (64 MiB)', body_limit USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.token_hash IS NOT NULL AND register_webhook.token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'token_hash must be the SHA-256 of the token, as 64 lowercase hex digits'
            USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.secret IS NOT NULL AND length(register_webhook.secret) NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION 'an HMAC secret has 1 to 1024 characters' USING ERRCODE = 'CVW01';
    END IF;
    IF register_webhook.auth <> 'hmac' AND register_webhook.secret IS NOT NULL
       OR register_webhook.auth <> 'bearer' AND register_webhook.token_hash IS NOT NULL THEN
        RAISE EXCEPTION 'auth % takes %', register_webhook.auth,
            CASE register_webhook.auth WHEN 'hmac' THEN 'a secret, not a token'
                                       WHEN 'bearer' THEN 'a token, not a secret'
                                       ELSE 'neither a secret nor a token' END
            USING ERRCODE = 'CVW01';
    END IF;

    -- The trigger first: refused (CVC05) when it exists with another type.
    PERFORM register_trigger(trig, 'webhook', register_webhook.payload_schema, register_webhook.description);

    kept_secret := CASE WHEN register_webhook.auth = 'hmac' THEN
                       coalesce(register_webhook.secret, CASE WHEN old.auth = 'hmac' THEN old.secret END) END;
    kept_hash := CASE WHEN register_webhook.auth = 'bearer' THEN
                     coalesce(register_webhook.token_hash, CASE WHEN old.auth = 'bearer' THEN old.token_hash END) END;
    IF register_webhook.auth = 'hmac' AND kept_secret IS NULL THEN
        RAISE EXCEPTION 'webhook % needs an HMAC secret (auth hmac)', quote_literal(register_webhook.name)
            USING ERRCODE = 'CVW01', HINT = 'generate one: conveyor webhooks create NAME --generate-secret';
    END IF;
    IF register_webhook.auth = 'bearer' AND kept_hash IS NULL THEN
        RAISE EXCEPTION 'webhook % needs a bearer token (auth bearer)', quote_literal(register_webhook.name)
            USING ERRCODE = 'CVW01';
    END IF;
    IF EXISTS (SELECT 1 FROM webhook w WHERE w.trigger = trig AND w.name <> register_webhook.name) THEN
        RAISE EXCEPTION 'trigger % already belongs to another webhook', quote_literal(trig)
            USING ERRCODE = 'CVW01', HINT = 'each webhook has its own trigger';
    END IF;

    IF old.name IS NULL THEN
        INSERT INTO webhook (name, trigger, auth, token_hash, secret, signature_header, signature_prefix,
                             idempotency_header, max_body_bytes, description)
        VALUES (register_webhook.name, trig, register_webhook.auth, kept_hash, kept_secret, sig_header, sig_prefix,
                key_header, body_limit, register_webhook.description);
        created := true;
    ELSE
        UPDATE webhook w
        SET trigger = trig, auth = register_webhook.auth, token_hash = kept_hash, secret = kept_secret,
            signature_header = sig_header, signature_prefix = sig_prefix, idempotency_header = key_header,
            max_body_bytes = body_limit, description = register_webhook.description, updated = now()
        WHERE w.name = register_webhook.name;
        created := false;
    END IF;
END
$$;

-- Deletes the webhook (its door answers 404 from then on), and its trigger too when
-- nothing else holds it: no rule, schedule or event names it (events are kept; so is
-- their trigger, which a webhook registered again under the same name reuses).
CREATE FUNCTION delete_webhook(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    trig text;
BEGIN
    DELETE FROM webhook w WHERE w.name = delete_webhook.name RETURNING w.trigger INTO trig;
    IF trig IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM trigger t
    WHERE t.name = trig AND t.type = 'webhook'
          AND NOT EXISTS (SELECT 1 FROM rule r WHERE r.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM schedule s WHERE s.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM event e WHERE e.trigger = trig)
          AND NOT EXISTS (SELECT 1 FROM webhook w WHERE w.trigger = trig);
    RETURN true;
END
$$;

-- A disabled webhook's door answers 404, as an unknown one. Answers what it was; no row:
-- no such webhook.
CREATE FUNCTION set_webhook_enabled(name text, enabled boolean) RETURNS TABLE (was boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH old AS (SELECT w.name, w.enabled FROM webhook w WHERE w.name = set_webhook_enabled.name FOR UPDATE)
    UPDATE webhook w SET enabled = set_webhook_enabled.enabled, updated = now()
    FROM old WHERE w.name = old.name
    RETURNING old.enabled;
END
$$;
