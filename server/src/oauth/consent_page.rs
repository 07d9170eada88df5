//! Kiln's consent page (`GET /oauth/consent`): server-rendered HTML that shows who asks (the client's
//! self-declared name, marked unverified, its id and the host the code goes to, with a warning for loopback
//! and app redirects), what (scopes, resource) and where (a workspace to choose), and sends the decision with
//! `/oauth/consent.js` to `POST /oauth/authorize` with the session's CSRF token, then follows `redirect_to`.
//! The page may not be framed, and its script is a file of this server (the CSP allows no inline script).

use axum::Router;
use axum::http::request::Parts;
use axum::routing::get;
use bytes::Bytes;
use kiln_spec::types;

use super::authorize::ConsentAnswer;
use super::{AuthorizationServer, redirect};
use crate::api::{Binary, OauthConsentPageQuery, OauthConsentPageResponse};

const STYLE: &str = "body{font-family:system-ui,sans-serif;background:#202020;color:#eee;display:grid;\
place-items:center;min-height:100vh;margin:0}main{background:#2b2b2b;padding:2rem;border-radius:8px;\
max-width:34rem;display:grid;gap:.75rem}code{background:#1a1a1a;padding:.1rem .3rem;border-radius:3px}\
.warn{color:#ffcc66}.muted{color:#aaa}button,select{font:inherit;padding:.5rem;border-radius:4px;border:1px \
solid #555}button{cursor:pointer}#allow{background:#3a6ea5;color:#fff;border:0}#error{color:#ff8080}";

const SCRIPT: &str = r#"// Kiln consent page: sends the user's decision, then goes where the server says.
(() => {
  const main = document.querySelector('main');
  const decide = async (decision) => {
    const body = {
      oauth_request_id: main.dataset.request,
      csrf_token: main.dataset.csrf,
      decision,
      workspace_id: document.getElementById('workspace').value,
    };
    const answer = await fetch('/oauth/authorize', {
      method: 'POST',
      credentials: 'same-origin',
      headers: {'Content-Type': 'application/json', 'X-CSRF-Token': main.dataset.csrf},
      body: JSON.stringify(body),
    });
    const result = await answer.json().catch(() => ({}));
    if (answer.ok && result.redirect_to) {
      window.location.assign(result.redirect_to);
    } else {
      document.getElementById('error').textContent = result.message || 'The decision could not be sent.';
    }
  };
  document.getElementById('allow').addEventListener('click', () => decide('allow'));
  document.getElementById('deny').addEventListener('click', () => decide('deny'));
})();
"#;

/// Escapes text for HTML element content and quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn scope_text(scope: &str) -> &'static str {
    match scope {
        super::SCOPE_READ => "see node types, models, and your jobs and their images",
        super::SCOPE_RUN => "queue workflows that run on this server",
        _ => "an unknown permission",
    }
}

fn html(status_page: String) -> Binary {
    Binary { content_type: "text/html; charset=utf-8".to_owned(), bytes: Bytes::from(status_page) }
}

fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · Kiln</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{STYLE}</style></head>\
         <body>{body}</body></html>\n",
        escape(title)
    )
}

/// The page for a challenge.
fn render(challenge: &types::OAuthConsentChallenge) -> String {
    let host = redirect::display_host(&challenge.redirect_uri);
    let loopback = redirect::all_loopback(std::slice::from_ref(&challenge.redirect_uri));
    let app_scheme = !challenge.redirect_uri.starts_with("https://") && !loopback;
    let warning = if loopback {
        "<p class=\"warn\">The code goes to a program on this computer. Any program running here could \
         receive it: allow only if you just started this connection yourself.</p>"
    } else if app_scheme {
        "<p class=\"warn\">The code goes to an application installed on your computer.</p>"
    } else {
        ""
    };
    let scopes: String = challenge
        .scopes
        .iter()
        .map(|s| format!("<li><code>{}</code>: {}</li>", escape(s), scope_text(s)))
        .collect();
    let workspaces: String = challenge
        .workspaces
        .iter()
        .map(|w| format!("<option value=\"{}\">{}</option>", escape(&w.id), escape(&w.name)))
        .collect();
    let body = format!(
        "<main data-request=\"{request}\" data-csrf=\"{csrf}\"><h1>Allow access to Kiln?</h1>\
         <p><strong>{name}</strong> <span class=\"muted\">(the name this application gives itself; Kiln \
         has not verified it)</span> asks for access to <strong>{resource}</strong>.</p>\
         <p class=\"muted\">Client id <code>{client}</code></p>\
         <p>After you decide, your browser goes to <strong>{host}</strong>.</p>{warning}\
         <p>It will be able to:</p><ul>{scopes}</ul>\
         <label>In workspace <select id=\"workspace\">{workspaces}</select></label>\
         <p><button id=\"allow\" type=\"button\">Allow</button> <button id=\"deny\" type=\"button\">Deny\
         </button></p><p id=\"error\" role=\"alert\"></p></main><script src=\"/oauth/consent.js\"></script>",
        request = escape(&challenge.oauth_request_id.to_string()),
        csrf = escape(&challenge.csrf_token),
        name = escape(&challenge.client_display_name),
        resource = escape(&challenge.resource_display_name),
        client = escape(challenge.client_id.as_deref().unwrap_or("")),
        host = escape(&host),
    );
    document("Allow access", &body)
}

fn unusable(message: &str) -> OauthConsentPageResponse {
    let body = format!(
        "<main><h1>This request cannot be used</h1><p>{}</p><p class=\"muted\">Start the connection again \
         from the application.</p></main>",
        escape(message)
    );
    OauthConsentPageResponse::BadRequest(html(document("Authorization", &body)))
}

impl AuthorizationServer {
    /// `GET /oauth/consent`.
    pub(crate) async fn consent_page(
        &self,
        parts: &Parts,
        query: OauthConsentPageQuery,
    ) -> OauthConsentPageResponse {
        let Some(id) = query.oauth_request_id.as_deref() else {
            return unusable("The link has no authorization request.");
        };
        match self.challenge(parts, id).await {
            ConsentAnswer::Challenge(challenge) => {
                OauthConsentPageResponse::Ok(html(render(&challenge)))
            }
            ConsentAnswer::SignIn => {
                let here = format!("/oauth/consent?oauth_request_id={}", clip_id(id));
                let next: String = form_urlencoded::byte_serialize(here.as_bytes()).collect();
                OauthConsentPageResponse::SeeOther { location: Some(format!("/login?next={next}")) }
            }
            ConsentAnswer::Unknown(e) => unusable(&e.to_string()),
        }
    }
}

/// A request id as it may go into a URL again (ids are UUIDs; anything else is cut).
fn clip_id(id: &str) -> String {
    id.chars().filter(|c| c.is_ascii_hexdigit() || *c == '-').take(36).collect()
}

/// The consent page's script.
pub(crate) fn routes() -> Router {
    Router::new().route(
        "/oauth/consent.js",
        get(|| async { crate::cloud::signin::page("text/javascript; charset=utf-8", SCRIPT) }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_names_are_escaped() {
        assert_eq!(
            escape("<img src=x onerror=\"a\">&'"),
            "&lt;img src=x onerror=&quot;a&quot;&gt;&amp;&#39;"
        );
        assert_eq!(clip_id("0f0e-<script>"), "0f0e-c");
    }
}
