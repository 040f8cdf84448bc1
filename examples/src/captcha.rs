//! The `login` service's captcha stand-in: single-use tokens, each bound to
//! the username it was issued for and valid for a fixed time.
//!
//! A real deployment asks its captcha provider where [`Captchas::redeem`]
//! is called; what this module keeps is what such a provider guarantees: a
//! solved captcha unlocks one attempt, for one username, for a while.
//!
//! Issuing and redeeming cost O(1): tokens all live for the same time, so
//! they expire in the order they were issued, and each issue first drops
//! the expired tokens at the front of that order (every token is dropped
//! once, so this is O(1) amortised) — never a sweep of everything
//! outstanding. Memory is bounded: at most [`Captchas::capacity`] tokens are
//! kept; when that many are outstanding, issuing one drops the oldest.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Outstanding tokens kept at most, by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// How long a token is valid, by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Captcha tokens: issued for a username, redeemed once, expiring.
///
/// ```
/// use ratewall_examples::captcha::Captchas;
/// let captchas = Captchas::default();
/// let token = captchas.issue("alice");
/// assert!(!captchas.redeem(&token, "bob"), "bound to alice");
/// assert!(captchas.redeem(&token, "alice"));
/// assert!(!captchas.redeem(&token, "alice"), "single use");
/// ```
#[derive(Debug)]
pub struct Captchas {
    store: Mutex<Store>,
    /// Keys the username hashes, so stored usernames take 8 bytes each and
    /// a collision cannot be aimed at.
    hasher: std::collections::hash_map::RandomState,
    ttl: Duration,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Store {
    /// Outstanding tokens: the username's hash and the expiry.
    issued: HashMap<u128, (u64, Instant)>,
    /// Every token kept, in the order issued (so of expiry); redeemed ones
    /// stay until they reach the front.
    order: VecDeque<(u128, Instant)>,
}

impl Default for Captchas {
    fn default() -> Self {
        Self::new(DEFAULT_TTL, DEFAULT_CAPACITY)
    }
}

impl Captchas {
    /// Tokens valid for `ttl`, at most `capacity` (at least 1) kept.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            store: Mutex::default(),
            hasher: std::collections::hash_map::RandomState::new(),
            ttl,
            capacity: capacity.max(1),
        }
    }

    /// How long a token stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many tokens are kept at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens kept (outstanding, plus redeemed ones not yet dropped).
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether no token is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Issues a token for `username` (as the login compares it: normalised).
    pub fn issue(&self, username: &str) -> String {
        let token = rand::random::<u128>();
        let now = Instant::now();
        let user = self.hasher.hash_one(username);
        let mut store = self.lock();
        while let Some(&(oldest, expires)) = store.order.front() {
            if expires > now && store.order.len() < self.capacity {
                break;
            }
            store.order.pop_front();
            store.issued.remove(&oldest);
        }
        let expires = now + self.ttl;
        store.order.push_back((token, expires));
        store.issued.insert(token, (user, expires));
        format!("{token:032x}")
    }

    /// Whether `token` was issued for `username`, is still valid and was not
    /// used before; it is used up if so. A token shown with another
    /// username stays valid for its own.
    pub fn redeem(&self, token: &str, username: &str) -> bool {
        let Some(token) = (token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u128::from_str_radix(token, 16).ok())
            .flatten()
        else {
            return false;
        };
        let user = self.hasher.hash_one(username);
        let now = Instant::now();
        let mut store = self.lock();
        match store.issued.get(&token) {
            Some(&(issued_for, expires)) if issued_for == user && expires > now => {
                store.issued.remove(&token);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_single_use_and_bound_to_their_username() {
        let captchas = Captchas::default();
        let token = captchas.issue("alice");
        assert!(!captchas.redeem(&token, "bob"));
        assert!(captchas.redeem(&token, "alice"));
        assert!(!captchas.redeem(&token, "alice"));
        assert!(!captchas.redeem("forged", "alice"));
        assert!(!captchas.redeem(&"f".repeat(32), "alice"));
    }

    #[test]
    fn tokens_expire() {
        let captchas = Captchas::new(Duration::ZERO, 10);
        let token = captchas.issue("alice");
        assert!(!captchas.redeem(&token, "alice"));
    }

    #[test]
    fn at_most_capacity_tokens_are_kept_and_the_oldest_go_first() {
        let captchas = Captchas::new(DEFAULT_TTL, 100);
        let tokens: Vec<String> = (0..1_000)
            .map(|i| captchas.issue(&format!("u{i}")))
            .collect();
        assert_eq!(captchas.len(), 100);
        assert!(!captchas.redeem(&tokens[0], "u0"), "dropped to make room");
        assert!(captchas.redeem(&tokens[999], "u999"));
        assert!(captchas.redeem(&tokens[900], "u900"));
    }

    #[test]
    fn expired_tokens_are_dropped_as_new_ones_are_issued() {
        let captchas = Captchas::new(Duration::ZERO, 100);
        for i in 0..50 {
            captchas.issue(&format!("u{i}"));
        }
        assert_eq!(captchas.len(), 1, "only the newest, issued expired");
    }
}
