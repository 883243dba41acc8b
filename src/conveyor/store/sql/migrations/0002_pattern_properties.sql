-- validate_parameters() treated keys matched by patternProperties as additional
-- properties and refused them under additionalProperties=false, where JSON Schema
-- (and the SDK's client-side check) accepts them.

CREATE OR REPLACE FUNCTION validate_parameters(schema jsonb, params jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    problems text[] := '{}';
    key text;
    prop jsonb;
    val jsonb;
    types jsonb;
BEGIN
    IF jsonb_typeof(params) <> 'object' THEN
        RETURN ARRAY['parameters must be a JSON object'];
    END IF;
    FOR key IN SELECT jsonb_array_elements_text(coalesce(schema -> 'required', '[]')) LOOP
        IF NOT params ? key THEN
            problems := problems || format('%s is required', key);
        END IF;
    END LOOP;
    FOR key, val IN SELECT * FROM jsonb_each(params) LOOP
        prop := schema -> 'properties' -> key;
        IF prop IS NULL THEN
            -- A key matching a patternProperties pattern is declared, not additional
            -- (its value is left to the executor's full validation).
            IF schema -> 'additionalProperties' = 'false'::jsonb AND NOT EXISTS (
                SELECT 1 FROM jsonb_object_keys(coalesce(schema -> 'patternProperties', '{}')) p
                WHERE key ~ p
            ) THEN
                problems := problems || format('%s is not a parameter of this action', key);
            END IF;
            CONTINUE;
        END IF;
        types := CASE jsonb_typeof(prop -> 'type')
            WHEN 'string' THEN jsonb_build_array(prop -> 'type')
            WHEN 'array' THEN prop -> 'type'
            ELSE NULL END;
        IF types IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(types) t WHERE json_type_matches(val, t)
        ) THEN
            problems := problems || format('%s must be of type %s, got %s', key,
                array_to_string(ARRAY(SELECT jsonb_array_elements_text(types)), ' or '), val::text);
            CONTINUE;
        END IF;
        IF prop ? 'enum' AND NOT (prop -> 'enum') @> jsonb_build_array(val) THEN
            problems := problems || format('%s must be one of %s, got %s', key, prop ->> 'enum', val::text);
        END IF;
        IF jsonb_typeof(val) = 'number' THEN
            IF prop ? 'minimum' AND val::text::numeric < (prop ->> 'minimum')::numeric THEN
                problems := problems || format('%s must be >= %s, got %s', key, prop ->> 'minimum', val::text);
            END IF;
            IF prop ? 'maximum' AND val::text::numeric > (prop ->> 'maximum')::numeric THEN
                problems := problems || format('%s must be <= %s, got %s', key, prop ->> 'maximum', val::text);
            END IF;
        END IF;
        IF jsonb_typeof(val) = 'string' THEN
            IF prop ? 'minLength' AND length(val #>> '{}') < (prop ->> 'minLength')::int THEN
                problems := problems || format('%s must be at least %s characters', key, prop ->> 'minLength');
            END IF;
            IF prop ? 'maxLength' AND length(val #>> '{}') > (prop ->> 'maxLength')::int THEN
                problems := problems || format('%s must be at most %s characters', key, prop ->> 'maxLength');
            END IF;
        END IF;
    END LOOP;
    RETURN problems;
END
$$;
