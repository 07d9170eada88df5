//! Which user each MCP session belongs to.
//!
//! A session id (`Mcp-Session-Id`) is never a credential: every request is authenticated on its own, and a
//! session id presented by anyone but the user whose `initialize` created it is answered as unknown (404).
//! The map holds only the owner's user id, never the caller (workspace, role): tools read the caller from each
//! request.

use std::collections::HashMap;
use std::sync::Mutex;

/// The most sessions one user keeps open; a new one past it ends the user's oldest.
pub(crate) const SESSIONS_PER_USER: usize = 32;

/// A session's owner and when it was bound (a counter: the order of creation).
struct Owner {
    user: String,
    created: u64,
}

/// Session id → the user whose `initialize` created it.
#[derive(Default)]
pub(crate) struct SessionOwners {
    owners: Mutex<(HashMap<String, Owner>, u64)>,
}

impl SessionOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<String, Owner>, u64)> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `user` created `session`; answers the user's oldest session when this one is one too many
    /// ([`SESSIONS_PER_USER`]), now forgotten, for the caller to close.
    pub(crate) fn bind(&self, session: &str, user: &str) -> Option<String> {
        let mut guard = self.lock();
        let (owners, counter) = &mut *guard;
        *counter += 1;
        owners.insert(session.to_owned(), Owner { user: user.to_owned(), created: *counter });
        let theirs = owners.values().filter(|o| o.user == user).count();
        if theirs <= SESSIONS_PER_USER {
            return None;
        }
        let oldest = owners
            .iter()
            .filter(|(_, o)| o.user == user)
            .min_by_key(|(_, o)| o.created)
            .map(|(id, _)| id.clone())?;
        owners.remove(&oldest);
        Some(oldest)
    }

    /// Whether `session` was created by `user` (an unknown session belongs to nobody).
    pub(crate) fn belongs_to(&self, session: &str, user: &str) -> bool {
        self.lock().0.get(session).is_some_and(|owner| owner.user == user)
    }

    /// Forgets `session` (deleted by its owner, or closed by the transport).
    pub(crate) fn unbind(&self, session: &str) {
        self.lock().0.remove(session);
    }

    /// Forgets every session for which `live` says it is gone (closed for idleness by the transport).
    pub(crate) fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().0.retain(|session, _| live(session));
    }

    /// How many sessions are bound.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{SESSIONS_PER_USER, SessionOwners};

    #[test]
    fn a_session_belongs_only_to_the_user_who_created_it() {
        let owners = SessionOwners::default();
        assert_eq!(owners.bind("s1", "alice"), None);
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

    #[test]
    fn a_user_past_the_limit_loses_their_oldest_session() {
        let owners = SessionOwners::default();
        owners.bind("bob-1", "bob");
        for i in 0..SESSIONS_PER_USER {
            assert_eq!(owners.bind(&format!("a{i}"), "alice"), None);
        }
        assert_eq!(owners.bind("a-new", "alice").as_deref(), Some("a0"));
        assert!(!owners.belongs_to("a0", "alice") && owners.belongs_to("a-new", "alice"));
        assert!(owners.belongs_to("bob-1", "bob"), "other users keep theirs");
    }
}
