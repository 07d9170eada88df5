-- The OAuth 2.1 authorization server of the cloud runtime: registered clients, grants (one per completed
-- consent) and the refresh tokens of each grant. Portable SQL (SQLite and Postgres), times in unix seconds.
-- Secrets are never stored: client secrets, registration access tokens and refresh tokens are found by the
-- SHA-256 (hex) of their value. Authorization codes and pending consent requests live in memory only (minutes).
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
