//! Which user each MCP session belongs to.
//!
//! A session id (`Mcp-Session-Id`) is never a credential: every request is authenticated on its own, and a
//! session id presented by anyone but the user whose `initialize` created it is answered as unknown (404).
//! The map holds only the owner's user id, never the caller (workspace, role): tools read the caller from each
//! request.

use std::collections::HashMap;
use std::sync::Mutex;

/// Session id → the user whose `initialize` created it.
#[derive(Default)]
pub(crate) struct SessionOwners {
    owners: Mutex<HashMap<String, String>>,
}

impl SessionOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `user` created `session`.
    pub(crate) fn bind(&self, session: &str, user: &str) {
        self.lock().insert(session.to_owned(), user.to_owned());
    }

    /// Whether `session` was created by `user` (an unknown session belongs to nobody).
    pub(crate) fn belongs_to(&self, session: &str, user: &str) -> bool {
        self.lock().get(session).is_some_and(|owner| owner == user)
    }

    /// Forgets `session` (deleted by its owner, or closed by the transport).
    pub(crate) fn unbind(&self, session: &str) {
        self.lock().remove(session);
    }

    /// Forgets every session for which `live` says it is gone (closed for idleness by the transport).
    pub(crate) fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|session, _| live(session));
    }

    /// How many sessions are bound.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::SessionOwners;

    #[test]
    fn a_session_belongs_only_to_the_user_who_created_it() {
        let owners = SessionOwners::default();
        owners.bind("s1", "alice");
        assert!(owners.belongs_to("s1", "alice"));
        assert!(!owners.belongs_to("s1", "bob"));
        assert!(!owners.belongs_to("s2", "alice"), "unknown sessions belong to nobody");
        owners.unbind("s1");
        assert!(!owners.belongs_to("s1", "alice"));
        owners.bind("s3", "alice");
        owners.bind("s4", "bob");
        owners.retain(|s| s == "s4");
        assert_eq!(owners.len(), 1);
        assert!(owners.belongs_to("s4", "bob"));
    }
}
