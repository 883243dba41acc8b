-- compatible-from: 34
-- Four verbs that were not one SQL function (issue #26): a schedule's PATCH (an unlocked
-- read, a patch in Python, then a replace: two concurrent PATCHes of different fields lost
-- one change), a dead letter's replay (three statements composed in Python), a token's
-- creation and revocation, and the operator's purge of dead letters (raw DML). Each is one
-- function here; the SDK, the API and the CLI call it and nothing else writes these rows.
-- Only functions are added: the code of version 33 runs unchanged on this schema.

-- Change the fields named in p_fields of a schedule, leaving the others as they are now.
-- The caller checks the values with the domain's rules (conveyor.domain.schedules: the
-- cron expression, the time zone, the durations) and passes them typed; here the row is
-- locked FOR UPDATE first, so a concurrent PATCH of other fields is read after its commit
-- and kept, then the merged row goes through create_schedule(replace => true) -- its
-- checks of the action and parameters, its trigger, its wake-up. The kind, cron, every
-- and at are one field (the timing): naming any of them replaces all four.
CREATE FUNCTION patch_schedule(p_name text, p_fields text[], p_kind text DEFAULT NULL, p_cron text DEFAULT NULL,
                               p_timezone text DEFAULT NULL, p_every interval DEFAULT NULL,
                               p_at timestamptz DEFAULT NULL, p_starts timestamptz DEFAULT NULL,
                               p_ends timestamptz DEFAULT NULL, p_action_ref text DEFAULT NULL,
                               p_parameters jsonb DEFAULT NULL, p_catchup text DEFAULT NULL,
                               p_catchup_window interval DEFAULT NULL, p_overlap text DEFAULT NULL,
                               p_description text DEFAULT NULL)
RETURNS TABLE (schedule_id bigint, created boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    cur schedule;
    unknown text[];
    timing boolean := p_fields && ARRAY['kind', 'cron', 'every', 'at'];
BEGIN
    unknown := ARRAY(SELECT f FROM unnest(p_fields) f
                     WHERE f <> ALL (ARRAY['kind', 'cron', 'timezone', 'every', 'at', 'starts', 'ends',
                                           'action_ref', 'parameters', 'catchup', 'catchup_window',
                                           'overlap', 'description']));
    IF cardinality(unknown) > 0 THEN
        RAISE EXCEPTION 'unknown schedule fields: %', array_to_string(unknown, ', ') USING ERRCODE = '22023';
    END IF;
    SELECT * INTO cur FROM schedule s WHERE s.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM schedule_not_found(p_name);
    END IF;
    RETURN QUERY SELECT c.schedule_id, c.created FROM create_schedule(
        name => p_name,
        kind => CASE WHEN timing THEN p_kind ELSE cur.kind END,
        cron => CASE WHEN timing THEN p_cron ELSE cur.cron END,
        every => CASE WHEN timing THEN p_every ELSE cur.every END,
        at => CASE WHEN timing THEN p_at ELSE cur.at END,
        timezone => CASE WHEN 'timezone' = ANY(p_fields) THEN p_timezone ELSE cur.timezone END,
        starts => CASE WHEN 'starts' = ANY(p_fields) THEN p_starts ELSE cur.starts END,
        ends => CASE WHEN 'ends' = ANY(p_fields) THEN p_ends ELSE cur.ends END,
        action_ref => CASE WHEN 'action_ref' = ANY(p_fields) THEN p_action_ref ELSE cur.action_ref END,
        parameters => CASE WHEN 'parameters' = ANY(p_fields) THEN p_parameters ELSE cur.parameters END,
        catchup => CASE WHEN 'catchup' = ANY(p_fields) THEN p_catchup ELSE cur.catchup END,
        catchup_window => CASE WHEN 'catchup_window' = ANY(p_fields) THEN p_catchup_window
                               ELSE cur.catchup_window END,
        overlap => CASE WHEN 'overlap' = ANY(p_fields) THEN p_overlap ELSE cur.overlap END,
        description => CASE WHEN 'description' = ANY(p_fields) THEN p_description ELSE cur.description END,
        replace => true) c;
END
$$;

-- Replay one dead letter: lock it, publish the message again through the transport in
-- use (replay_message: a NOTIFY, or an outbox row for the relay), mark it replayed -- in
-- the caller's transaction, so the publish and the mark commit together. Whether the
-- letter's body is a Conveyor message that its consumers would take is checked by the
-- caller first (conveyor.replay.replayable: the consumers' own decoder), which passes
-- what to publish; the body and routing key of a letter never change, the resolution
-- does, so it is read again here under the lock. outcome: replayed, skipped (replayed
-- meanwhile, p_skip_replayed) or missing (no such letter).
CREATE FUNCTION replay_dead_letter(p_id bigint, p_by text, p_skip_replayed boolean, p_routing_key text,
                                   p_message_type text, p_payload jsonb)
RETURNS TABLE (outcome text, transport text, detail text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    previous text;
    route text;
    said text;
BEGIN
    SELECT coalesce(d.resolution, 'pending') INTO previous FROM dead_letter d WHERE d.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    IF p_skip_replayed AND previous = 'replayed' THEN
        RETURN QUERY SELECT 'skipped'::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    route := replay_message(p_routing_key, p_message_type, p_payload);
    said := format('published again to %s on the %s transport; was %s', p_routing_key,
                   coalesce(route, '?'), previous);
    UPDATE dead_letter d SET resolution = 'replayed', resolved = now(), resolved_by = p_by, detail = said
    WHERE d.id = p_id;
    RETURN QUERY SELECT 'replayed'::text, route, said;
END
$$;

-- The operator's purge of dead letters, with the listing's filters; pending (unresolved)
-- letters only when p_include_pending. The ids deleted.
CREATE FUNCTION purge_dead_letters(p_reason text, p_resolution text, p_execution bigint, p_queue text,
                                   p_older_than float8, p_include_pending boolean)
RETURNS TABLE (id bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    DELETE FROM dead_letter d
    WHERE (p_reason IS NULL OR d.reason = p_reason)
      AND (p_resolution IS NULL OR d.resolution IS NOT DISTINCT FROM nullif(p_resolution, 'pending'))
      AND (p_execution IS NULL OR d.execution = p_execution)
      AND (p_queue IS NULL OR d.queue = p_queue)
      AND (p_older_than IS NULL OR d.first_seen < now() - make_interval(secs => p_older_than))
      AND (coalesce(p_include_pending, false) OR d.resolution IS NOT NULL)
    RETURNING d.id
$$;

-- A new API token: its name, role, the SHA-256 of the secret and the secret's first
-- characters (the secret itself is made and shown by the caller, never stored).
CREATE FUNCTION create_api_token(p_name text, p_role text, p_hash bytea, p_prefix text)
RETURNS TABLE (id bigint, name text, role text, prefix text, created timestamptz)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO api_token AS t (name, role, token_hash, prefix)
    VALUES (p_name, p_role, p_hash, p_prefix)
    RETURNING t.id, t.name, t.role, t.prefix, t.created
$$;

-- Revoke a live token (guarded: revoked once; a token is never deleted). The id revoked,
-- no row if there is no live token of that id.
CREATE FUNCTION revoke_api_token(p_id bigint)
RETURNS TABLE (id bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE api_token t SET revoked = now() WHERE t.id = p_id AND t.revoked IS NULL RETURNING t.id
$$;
