//! What the in-memory harnesses share (`memory_per_identity`,
//! `memory_identities`, `memory_scaling`): polling a decision that never
//! suspends, and reading the resident set.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls a future that completes without suspending (in memory). Inlined
/// always, so that whether the compiler inlines it (it copies the future
/// when it does not) never moves a measurement: it did, once, by a fifth.
#[inline(always)]
pub fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory decision suspended"),
    }
}

/// The resident set in bytes (Linux: `/proc/self/statm`).
#[allow(dead_code)] // memory_scaling reads no resident set
pub fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}
