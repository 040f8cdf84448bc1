//! Storage keys: a prefix, then a hash tag holding the scope and the identity.
//!
//! Layout: `prefix:{scope:identity}`; backends append their own suffix per
//! limit. Scope and identity are escaped so that no byte of user input can
//! end the hash tag early (moving the Redis Cluster slot) or make two
//! different identities render to the same key: `%`, `{`, `}` and `:` become
//! `%25`, `%7B`, `%7D` and `%3A`. The escaped parts contain no `:`, so the
//! split between scope and identity is unambiguous and the encoding is
//! injective.

use std::fmt::{self, Write};

/// The storage key of one identity under one scope.
///
/// ```
/// use rl_core::Key;
/// let a = Key::new("rl", "login", "al{ice}");
/// let b = Key::new("rl", "login", "al:ice");
/// assert_eq!(a.as_str(), "rl:{login:al%7Bice%7D}");
/// assert_ne!(a, b);
/// assert_eq!(a.hash_tag(), "login:al%7Bice%7D");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    text: String,
}

impl Key {
    /// The key for `identity` under `scope`, with the limiter's `prefix`.
    pub fn new(prefix: &str, scope: &str, identity: &str) -> Self {
        let mut text = String::with_capacity(prefix.len() + scope.len() + identity.len() + 4);
        text.push_str(prefix);
        text.push_str(":{");
        escape_into(&mut text, scope);
        text.push(':');
        escape_into(&mut text, identity);
        text.push('}');
        Self { text }
    }

    /// Like [`Key::new`], formatting the identity from any `Display` value
    /// without an intermediate string.
    pub fn from_display(prefix: &str, scope: &str, identity: &dyn fmt::Display) -> Self {
        let mut text = String::with_capacity(prefix.len() + scope.len() + 24);
        text.push_str(prefix);
        text.push_str(":{");
        escape_into(&mut text, scope);
        text.push(':');
        let _ = write!(Escaper(&mut text), "{identity}");
        text.push('}');
        Self { text }
    }

    /// The rendered key.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The part between the braces: Redis Cluster hashes only this, so all
    /// keys of one identity share one slot.
    pub fn hash_tag(&self) -> &str {
        let open = self.text.find('{').map_or(0, |i| i + 1);
        let close = self.text[open..]
            .find('}')
            .map_or(self.text.len(), |i| open + i);
        &self.text[open..close]
    }
}

impl Key {
    /// The escaped identity part of the hash tag (what logs mask).
    pub fn identity(&self) -> &str {
        let tag = self.hash_tag();
        tag.split_once(':').map_or(tag, |(_, identity)| identity)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Checks a key prefix: non-empty, no braces (they would become the hash tag)
/// and no whitespace.
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && !prefix.contains(['{', '}']) && !prefix.contains(char::is_whitespace)
}

fn escape_into(out: &mut String, part: &str) {
    let _ = Escaper(out).write_str(part);
}

/// Escapes what is written through it.
struct Escaper<'a>(&'a mut String);

impl Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !s.bytes().any(|b| matches!(b, b'%' | b'{' | b'}' | b':')) {
            self.0.push_str(s);
            return Ok(());
        }
        for c in s.chars() {
            match c {
                '%' => self.0.push_str("%25"),
                '{' => self.0.push_str("%7B"),
                '}' => self.0.push_str("%7D"),
                ':' => self.0.push_str("%3A"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hostile_identities_cannot_leave_the_hash_tag() {
        let key = Key::new("rl", "sms", "}{x:y}%");
        assert_eq!(key.hash_tag(), "sms:%7D%7Bx%3Ay%7D%25");
        assert_eq!(key.as_str().matches('{').count(), 1);
        assert_eq!(key.as_str().matches('}').count(), 1);
    }

    #[test]
    fn the_identity_part_excludes_the_scope() {
        assert_eq!(Key::new("rl", "sms:x", "+86:1").identity(), "+86%3A1");
    }

    #[test]
    fn display_identities_are_escaped_like_strings() {
        assert_eq!(
            Key::from_display("p", "s", &"a:{b}"),
            Key::new("p", "s", "a:{b}")
        );
        assert_eq!(
            Key::from_display("p", "s", &42u64),
            Key::new("p", "s", "42")
        );
    }

    #[test]
    fn prefixes_with_braces_or_spaces_are_invalid() {
        assert!(valid_prefix("rl"));
        assert!(valid_prefix("app:rl"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("a{b"));
        assert!(!valid_prefix("a b"));
    }

    proptest! {
        #[test]
        fn distinct_scope_identity_pairs_never_share_a_key(
            s1 in ".{0,6}", i1 in ".{0,12}", s2 in ".{0,6}", i2 in ".{0,12}"
        ) {
            let a = Key::new("rl", &s1, &i1);
            let b = Key::new("rl", &s2, &i2);
            prop_assert_eq!(a == b, s1 == s2 && i1 == i2);
        }

        #[test]
        fn the_hash_tag_is_exactly_the_escaped_scope_and_identity(s in ".{0,6}", i in ".{0,20}") {
            let key = Key::new("rl", &s, &i);
            prop_assert_eq!(key.as_str(), format!("rl:{{{}}}", key.hash_tag()));
            let braces_inside = key.hash_tag().contains(['{', '}']);
            prop_assert!(!braces_inside);
        }
    }
}
