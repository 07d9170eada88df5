-- The cloud runtime's accounts and OAuth server on Postgres: the tables of the SQLite migrations 0004
-- (accounts) and 0006 (OAuth), whose SQL is portable, unchanged. Times in unix seconds; secrets are never
-- stored, only the SHA-256 (hex) of each.
CREATE TABLE users (
    id TEXT PRIMARY KEY NOT NULL,
    username TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE workspaces (
    id TEXT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

-- The workspace the existing queue and history rows and the local runtime belong to.
INSERT INTO workspaces (id, name, created_at) VALUES ('default', 'default', 0);

CREATE TABLE memberships (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('owner', 'member')),
    PRIMARY KEY (workspace_id, user_id)
);

CREATE INDEX memberships_by_user ON memberships (user_id);

CREATE TABLE web_sessions (
    id_hash TEXT PRIMARY KEY NOT NULL,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    absolute_expires_at BIGINT NOT NULL
);

CREATE INDEX web_sessions_by_user ON web_sessions (user_id);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY NOT NULL,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT,
    revoked_at BIGINT
);

CREATE INDEX api_keys_by_user ON api_keys (user_id);

CREATE TABLE oauth_clients (
    client_id TEXT PRIMARY KEY NOT NULL,
    -- The registered metadata as answered at registration (JSON, RFC 7591 names), without secrets.
    metadata TEXT NOT NULL,
    auth_method TEXT NOT NULL CHECK (auth_method IN ('none', 'client_secret_post', 'client_secret_basic')),
    secret_hash TEXT,
    registration_token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- When a user first approved it; a client never approved is removed a day after registration.
    approved_at BIGINT
);

CREATE TABLE oauth_grants (
    id TEXT PRIMARY KEY NOT NULL,
    -- A registered client id, or the URL of a client ID metadata document.
    client_id TEXT NOT NULL,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    scope TEXT NOT NULL,
    resource TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- The family's absolute end: no refresh token of the grant outlives it.
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE INDEX oauth_grants_by_user ON oauth_grants (user_id);

CREATE TABLE oauth_refresh_tokens (
    token_hash TEXT PRIMARY KEY NOT NULL,
    grant_id TEXT NOT NULL REFERENCES oauth_grants (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    -- Set when the token was rotated: then the hash of its successor, and the successor sealed with a pad
    -- derived from this token, so a concurrent refresh with this token can be given the same successor.
    used_at BIGINT,
    successor_hash TEXT,
    successor_sealed TEXT
);

CREATE INDEX oauth_refresh_tokens_by_grant ON oauth_refresh_tokens (grant_id);
