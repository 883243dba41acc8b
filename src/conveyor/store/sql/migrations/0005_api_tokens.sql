-- API tokens: bearer tokens for the REST API and the dashboard, stored hashed.
CREATE TABLE api_token (
    id         bigserial PRIMARY KEY,
    name       text NOT NULL,
    role       text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    -- SHA-256 of the token. Tokens are 256 random bits, so a slow password hash would
    -- add nothing but latency to every request.
    token_hash bytea NOT NULL UNIQUE,
    -- The first characters, shown in listings to tell tokens apart.
    prefix     text NOT NULL,
    created    timestamptz NOT NULL DEFAULT now(),
    last_used  timestamptz,
    revoked    timestamptz
);
