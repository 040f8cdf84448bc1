//! Allow and deny lists: identities that bypass a limit name, or are refused
//! at once, per name or for every name, with an optional expiry.
//!
//! Entries are held by the limiter's registry of runtime overrides (a change
//! takes effect on the next call), matched on the identity's key form (its
//! `Display`, escaped as in [`crate::Key`]), so an entry names exactly the
//! identity a call would use.

use std::fmt;
use std::time::SystemTime;

use hashbrown::Equivalent;

use crate::model::key::Identity;

/// What a list entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ListKind {
    /// The identity bypasses the limit: its calls are admitted without a
    /// decision (`outcome="allow_listed"`).
    Allow,
    /// The identity is refused at once, without asking the backend
    /// ([`crate::RejectionReason::Denied`]).
    Deny,
}

impl ListKind {
    /// `allow` or `deny`.
    pub const fn name(self) -> &'static str {
        match self {
            ListKind::Allow => "allow",
            ListKind::Deny => "deny",
        }
    }
}

impl fmt::Display for ListKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ListKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(ListKind::Allow),
            "deny" => Ok(ListKind::Deny),
            other => Err(format!("unknown list {other:?}: expected allow or deny")),
        }
    }
}

/// One entry of a list, as listed by [`Settings::list_entries`](crate::settings::Settings::list_entries).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListEntry {
    /// Allow or deny.
    pub kind: ListKind,
    /// The limit name it applies to; `None`: every name.
    pub name: Option<String>,
    /// The identity, in its key form (its `Display`, with `%`, `{`, `}` and
    /// `:` escaped as `%25`, `%7B`, `%7D`, `%3A`).
    pub identity: String,
    /// When it stops applying; `None`: until removed.
    pub expires_at: Option<SystemTime>,
}

impl ListEntry {
    /// An entry for `identity` in its key form (see [`ListEntry::identity`]).
    pub fn new(
        kind: ListKind,
        name: Option<&str>,
        identity: impl Into<String>,
        expires_at: Option<SystemTime>,
    ) -> Self {
        Self {
            kind,
            name: name.map(str::to_owned),
            identity: identity.into(),
            expires_at,
        }
    }

    pub(crate) fn listed(&self) -> Listed {
        Listed {
            kind: self.kind,
            expires_at: self.expires_at,
        }
    }
}

/// A list entry's verdict for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) kind: ListKind,
    pub(crate) expires_at: Option<SystemTime>,
}

/// `(name, identity)`: `name` empty for every name.
type EntryKey = (Box<str>, Box<str>);

/// A borrowed [`EntryKey`], to look one up without allocating.
#[derive(Hash)]
struct EntryRef<'a>(&'a str, &'a str);

impl Equivalent<EntryKey> for EntryRef<'_> {
    fn equivalent(&self, key: &EntryKey) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

/// Every entry of one limiter.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lists {
    entries: hashbrown::HashMap<EntryKey, Listed>,
}

impl Lists {
    /// Adds or replaces the entry of `identity` (key form) under `name`.
    pub(crate) fn insert(&mut self, name: Option<&str>, identity: &str, listed: Listed) {
        self.entries
            .insert((name.unwrap_or("").into(), identity.into()), listed);
    }

    /// Removes the entry; whether there was one.
    pub(crate) fn remove(&mut self, name: Option<&str>, identity: &str) -> bool {
        self.entries
            .remove(&EntryRef(name.unwrap_or(""), identity))
            .is_some()
    }

    /// Drops entries that have expired at `now`.
    pub(crate) fn sweep(&mut self, now: SystemTime) {
        self.entries
            .retain(|_, listed| listed.expires_at.is_none_or(|at| at > now));
    }

    /// Whether any entry of `kind` is held.
    pub(crate) fn any(&self, kind: ListKind) -> bool {
        self.entries.values().any(|l| l.kind == kind)
    }

    /// The entry that applies to `identity` under `name` at `now`: the
    /// name's own, else (for a tier `api@pro`) its group's, else the one
    /// for every name.
    pub(crate) fn check(&self, name: &str, identity: &str, now: SystemTime) -> Option<Listed> {
        ratewall_grammar::inherited(name)
            .chain([""])
            .filter_map(|n| self.entries.get(&EntryRef(n, identity)))
            .find(|listed| listed.expires_at.is_none_or(|at| at > now))
            .copied()
    }

    /// Every entry, sorted by name, then identity.
    pub(crate) fn entries(&self) -> Vec<ListEntry> {
        let mut all: Vec<ListEntry> = self
            .entries
            .iter()
            .map(|((name, identity), listed)| ListEntry {
                kind: listed.kind,
                name: (!name.is_empty()).then(|| name.to_string()),
                identity: identity.to_string(),
                expires_at: listed.expires_at,
            })
            .collect();
        all.sort_by(|a, b| (&a.name, &a.identity).cmp(&(&b.name, &b.identity)));
        all
    }

    /// Replaces every entry (e.g. with a backend's shared copy).
    pub(crate) fn replace(&mut self, entries: impl IntoIterator<Item = ListEntry>) {
        self.entries = entries
            .into_iter()
            .map(|e| {
                let key: EntryKey = (e.name.unwrap_or_default().into(), e.identity.into());
                let listed = Listed {
                    kind: e.kind,
                    expires_at: e.expires_at,
                };
                (key, listed)
            })
            .collect();
    }
}

/// The key form of an identity (what list entries match).
pub(crate) fn key_form(identity: &dyn fmt::Display) -> String {
    Identity::render(identity).as_ref().to_string()
}

/// The text an identity in key form was written as: [`key_form`] undone
/// (`%3A` back to `:`, `%7B` to `{`, `%7D` to `}`, `%25` to `%`), so that
/// `key_form(written_form(k)) == k` for every key form `k`. A limits file
/// writes its lists with it.
#[cfg(feature = "serde")]
pub(crate) fn written_form(key_form: &str) -> String {
    let mut out = String::with_capacity(key_form.len());
    let mut rest = key_form;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let (char, skip) = match rest.get(at..at + 3) {
            Some("%25") => ('%', 3),
            Some("%7B") => ('{', 3),
            Some("%7D") => ('}', 3),
            Some("%3A") => (':', 3),
            // Not an escape key_form writes: kept as it is.
            _ => ('%', 1),
        };
        out.push(char);
        rest = &rest[at + skip..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn listed(kind: ListKind, expires_at: Option<SystemTime>) -> Listed {
        Listed { kind, expires_at }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_written_form_undoes_the_key_form() {
        for written in [
            "+33612345678",
            "a:b{c}d%e",
            "%3A",
            "x%",
            "100%25",
            "007",
            "2001:db8::1",
            "",
        ] {
            let key = key_form(&written);
            assert_eq!(key_form(&written_form(&key)), key, "{written:?}");
        }
        assert_eq!(written_form("a%3Ab%7Bc%7Dd%25e"), "a:b{c}d%e");
    }

    #[test]
    fn a_name_s_own_entry_wins_over_the_entry_for_every_name_and_expired_ones_do_not_apply() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut lists = Lists::default();
        lists.insert(None, "mallory", listed(ListKind::Deny, None));
        lists.insert(Some("sms"), "mallory", listed(ListKind::Allow, None));
        lists.insert(
            Some("sms"),
            "trudy",
            listed(ListKind::Deny, Some(now - Duration::from_secs(1))),
        );
        assert_eq!(
            lists.check("sms", "mallory", now).unwrap().kind,
            ListKind::Allow
        );
        assert_eq!(
            lists.check("login", "mallory", now).unwrap().kind,
            ListKind::Deny
        );
        assert_eq!(lists.check("sms", "trudy", now), None, "expired");
        assert_eq!(lists.check("sms", "alice", now), None);
        lists.sweep(now);
        assert_eq!(lists.entries().len(), 2);
        assert!(lists.remove(None, "mallory"));
        assert!(!lists.remove(None, "mallory"));
        assert!(lists.any(ListKind::Allow) && !lists.any(ListKind::Deny));
    }

    #[test]
    fn identities_are_matched_in_their_key_form() {
        assert_eq!(key_form(&"a:{b}"), "a%3A%7Bb%7D");
        assert_eq!(key_form(&42u64), "42");
    }
}
