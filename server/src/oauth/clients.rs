//! Registered clients (RFC 7591 dynamic registration, RFC 7592 read): what a registration may ask for, how it
//! is stored (`oauth_clients`), and how clients are found again.
//!
//! Public clients (`none`, the default) get no secret. A request for `client_secret_post` or
//! `client_secret_basic` gets a confidential client with a generated secret (hosted connectors such as
//! claude.ai register that way and fail against public-only servers, oauth.md §1.4); PKCE stays mandatory for
//! them too. Other methods are refused. A client nobody ever approved is forgotten a day after it registered,
//! so the clients some tools register on every connect do not pile up.

use kiln_spec::types::{
    self, OAuthApplicationType, OAuthRegisterResponseTokenEndpointAuthMethod as AuthMethod,
};
use sqlx::AnyPool;
use subtle::ConstantTimeEq as _;

use super::redirect;
use crate::accounts::{new_secret, secret_hash};

/// How long a client that no user approved is kept.
pub(crate) const ORPHAN_SECONDS: i64 = 24 * 60 * 60;

/// The most clients that may wait for their first approval at once.
const MAX_UNAPPROVED: i64 = 10_000;

/// The most redirect URIs a client may register.
const MAX_REDIRECT_URIS: usize = 5;

/// The longest `client_name`.
const MAX_NAME_CHARS: usize = 100;

/// Why a registration was refused (RFC 7591 §3.2.2 codes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    /// A redirect URI is missing or not acceptable (`invalid_redirect_uri`).
    #[error("{0}")]
    RedirectUri(String),
    /// Other metadata is not acceptable (`invalid_client_metadata`).
    #[error("{0}")]
    Metadata(String),
    /// Too many clients wait for a first approval (a flood of registrations).
    #[error("too many clients wait for their first approval")]
    TooManyPending,
    /// The store failed.
    #[error("the client store failed")]
    Store(#[from] StoreError),
}

/// A failure of the database or of the random number generator.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The database failed.
    #[error("the OAuth database failed: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored row could not be read back.
    #[error("a stored OAuth client is corrupt: {0}")]
    Corrupt(String),
    /// The random number generator failed.
    #[error("the system's random number generator failed")]
    Random(#[from] crate::accounts::AccountError),
}

/// A client as the authorization and token endpoints see it.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// The id: a registered id, or a metadata document's URL.
    pub(crate) id: String,
    /// The self-declared name (unverified).
    pub(crate) name: Option<String>,
    /// The redirect URIs it may use.
    pub(crate) redirect_uris: Vec<String>,
    /// How it authenticates at the token endpoint.
    pub(crate) auth_method: AuthMethod,
    /// The SHA-256 (hex) of its secret, for confidential clients.
    pub(crate) secret_hash: Option<String>,
    /// `native` or `web`.
    pub(crate) application_type: OAuthApplicationType,
    /// The grants it may use (`authorization_code`, and `refresh_token` for refresh tokens).
    pub(crate) grant_types: Vec<String>,
}

impl Client {
    /// Whether `secret` is this client's secret (by hash, so the comparison reveals nothing).
    pub(crate) fn secret_matches(&self, secret: &str) -> bool {
        self.secret_hash
            .as_deref()
            .is_some_and(|stored| stored.as_bytes().ct_eq(secret_hash(secret).as_bytes()).into())
    }
}

fn auth_method(text: Option<&str>) -> Result<AuthMethod, RegisterError> {
    match text {
        None | Some("none") => Ok(AuthMethod::None),
        Some("client_secret_post") => Ok(AuthMethod::ClientSecretPost),
        Some("client_secret_basic") => Ok(AuthMethod::ClientSecretBasic),
        Some(other) => Err(RegisterError::Metadata(format!(
            "token_endpoint_auth_method `{other}` is not supported (none, client_secret_post, client_secret_basic)"
        ))),
    }
}

fn check_uri_field(name: &str, value: Option<&String>) -> Result<(), RegisterError> {
    match value {
        Some(uri)
            if url::Url::parse(uri).map_or(true, |u| !matches!(u.scheme(), "https" | "http")) =>
        {
            Err(RegisterError::Metadata(format!("{name} must be an absolute http(s) URI")))
        }
        _ => Ok(()),
    }
}

/// Checks a registration request and fills in the defaults; the answer is the registration without id,
/// times and secrets.
fn validate(request: &types::OAuthRegisterRequest) -> Result<Validated, RegisterError> {
    if request.redirect_uris.is_empty() {
        return Err(RegisterError::RedirectUri("redirect_uris must name at least one URI".into()));
    }
    if request.redirect_uris.len() > MAX_REDIRECT_URIS {
        return Err(RegisterError::RedirectUri(format!(
            "at most {MAX_REDIRECT_URIS} redirect URIs may be registered"
        )));
    }
    for uri in &request.redirect_uris {
        redirect::check_registrable(uri).map_err(|e| RegisterError::RedirectUri(e.to_string()))?;
    }
    let auth_method = auth_method(request.token_endpoint_auth_method.as_deref())?;
    let grant_types = if request.grant_types.is_empty() {
        vec!["authorization_code".to_owned(), "refresh_token".to_owned()]
    } else {
        request.grant_types.clone()
    };
    if let Some(bad) =
        grant_types.iter().find(|g| !matches!(g.as_str(), "authorization_code" | "refresh_token"))
    {
        return Err(RegisterError::Metadata(format!(
            "grant type `{bad}` is not supported (authorization_code, refresh_token)"
        )));
    }
    let response_types = if request.response_types.is_empty() {
        vec!["code".to_owned()]
    } else {
        request.response_types.clone()
    };
    if response_types.iter().any(|r| r != "code") {
        return Err(RegisterError::Metadata("the only response type is `code`".into()));
    }
    if let Some(name) = &request.client_name
        && (name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control))
    {
        return Err(RegisterError::Metadata(format!(
            "client_name must have at most {MAX_NAME_CHARS} characters and no control characters"
        )));
    }
    check_uri_field("client_uri", request.client_uri.as_ref())?;
    check_uri_field("logo_uri", request.logo_uri.as_ref())?;
    check_uri_field("tos_uri", request.tos_uri.as_ref())?;
    check_uri_field("policy_uri", request.policy_uri.as_ref())?;
    if request.scope.as_ref().is_some_and(|s| s.len() > 1000) {
        return Err(RegisterError::Metadata("scope is too long".into()));
    }
    let non_empty = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
    Ok(Validated {
        redirect_uris: request.redirect_uris.clone(),
        grant_types,
        response_types,
        auth_method,
        application_type: request.application_type.unwrap_or(OAuthApplicationType::Native),
        client_name: non_empty(&request.client_name),
        client_uri: non_empty(&request.client_uri),
        logo_uri: non_empty(&request.logo_uri),
        scope: non_empty(&request.scope),
    })
}

/// A checked registration.
struct Validated {
    redirect_uris: Vec<String>,
    grant_types: Vec<String>,
    response_types: Vec<String>,
    auth_method: AuthMethod,
    application_type: OAuthApplicationType,
    client_name: Option<String>,
    client_uri: Option<String>,
    logo_uri: Option<String>,
    scope: Option<String>,
}

/// A row of `oauth_clients`.
#[derive(sqlx::FromRow)]
struct ClientRow {
    metadata: String,
    secret_hash: Option<String>,
    registration_token_hash: String,
    created_at: i64,
    approved_at: Option<i64>,
}

/// The clients table.
#[derive(Debug, Clone)]
pub(crate) struct Clients {
    pool: AnyPool,
    issuer: String,
}

impl Clients {
    /// The clients of the server with this issuer, in `pool`'s database.
    pub(crate) fn new(pool: AnyPool, issuer: &str) -> Self {
        Clients { pool, issuer: issuer.to_owned() }
    }

    /// Registers a client at `now` (unix seconds) and answers its registration, with the secret (confidential
    /// clients) and the registration access token shown this once.
    pub(crate) async fn register(
        &self,
        request: &types::OAuthRegisterRequest,
        now: i64,
    ) -> Result<types::OAuthRegisterResponse, RegisterError> {
        let valid = validate(request)?;
        let client_id = format!("kiln-{}", uuid::Uuid::new_v4());
        let secret = match valid.auth_method {
            AuthMethod::None => None,
            _ => Some(new_secret().map_err(StoreError::Random)?),
        };
        let registration_token = new_secret().map_err(StoreError::Random)?;
        let mut answer = types::OAuthRegisterResponse {
            registration_client_uri: format!("{}/oauth/register/{client_id}", self.issuer),
            client_id,
            client_id_issued_at: now,
            redirect_uris: valid.redirect_uris,
            grant_types: valid.grant_types,
            response_types: valid.response_types,
            token_endpoint_auth_method: valid.auth_method,
            client_secret: None,
            client_secret_expires_at: None,
            registration_access_token: None,
            application_type: valid.application_type,
            client_name: valid.client_name,
            client_uri: valid.client_uri,
            logo_uri: valid.logo_uri,
            scope: valid.scope,
        };
        let metadata = serde_json::to_string(&answer)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode the registration: {e}")))?;
        self.forget_orphans(now).await?;
        let unapproved: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM oauth_clients WHERE approved_at IS NULL")
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::from)?;
        if unapproved >= MAX_UNAPPROVED {
            return Err(RegisterError::TooManyPending);
        }
        sqlx::query(
            "INSERT INTO oauth_clients (client_id, metadata, auth_method, secret_hash, \
             registration_token_hash, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&answer.client_id)
        .bind(metadata)
        .bind(answer.token_endpoint_auth_method.to_string())
        .bind(secret.as_deref().map(secret_hash))
        .bind(secret_hash(&registration_token))
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(StoreError::from)?;
        if secret.is_some() {
            answer.client_secret_expires_at = Some(0);
        }
        answer.client_secret = secret;
        answer.registration_access_token = Some(registration_token);
        Ok(answer)
    }

    /// Removes the clients registered more than [`ORPHAN_SECONDS`] before `now` that no user approved.
    async fn forget_orphans(&self, now: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM oauth_clients WHERE approved_at IS NULL AND created_at < $1")
            .bind(now - ORPHAN_SECONDS)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The stored registration of `client_id` (without secrets), if it exists at `now`.
    async fn metadata(
        &self,
        client_id: &str,
        now: i64,
    ) -> Result<Option<(types::OAuthRegisterResponse, Option<String>, String)>, StoreError> {
        let row: Option<ClientRow> = sqlx::query_as(
            "SELECT metadata, secret_hash, registration_token_hash, created_at, approved_at \
             FROM oauth_clients WHERE client_id = $1",
        )
        .bind(client_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        if row.approved_at.is_none() && row.created_at < now - ORPHAN_SECONDS {
            return Ok(None);
        }
        let (metadata, secret_hash, token_hash) =
            (row.metadata, row.secret_hash, row.registration_token_hash);
        let metadata = serde_json::from_str(&metadata)
            .map_err(|e| StoreError::Corrupt(format!("client {client_id}: {e}")))?;
        Ok(Some((metadata, secret_hash, token_hash)))
    }

    /// The registered client `client_id` at `now`.
    pub(crate) async fn find(
        &self,
        client_id: &str,
        now: i64,
    ) -> Result<Option<Client>, StoreError> {
        Ok(self.metadata(client_id, now).await?.map(|(m, secret_hash, _)| Client {
            id: m.client_id,
            name: m.client_name,
            redirect_uris: m.redirect_uris,
            auth_method: m.token_endpoint_auth_method,
            secret_hash,
            application_type: m.application_type,
            grant_types: m.grant_types,
        }))
    }

    /// The registration of `client_id` for the holder of its registration access token (RFC 7592 read);
    /// `None` when the client is unknown or the token is not its own.
    pub(crate) async fn read(
        &self,
        client_id: &str,
        registration_token: &str,
        now: i64,
    ) -> Result<Option<types::OAuthRegisterResponse>, StoreError> {
        let Some((metadata, _, token_hash)) = self.metadata(client_id, now).await? else {
            return Ok(None);
        };
        let matches: bool =
            token_hash.as_bytes().ct_eq(secret_hash(registration_token).as_bytes()).into();
        Ok(matches.then_some(metadata))
    }

    /// Records that a user approved the client (it is no longer an orphan).
    pub(crate) async fn approved(&self, client_id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE oauth_clients SET approved_at = $1 WHERE client_id = $2 AND approved_at IS NULL",
        )
        .bind(now)
        .bind(client_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
