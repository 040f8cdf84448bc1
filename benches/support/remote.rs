//! A remote backend in all but name, shared by the benches and the
//! instruction-count examples that measure the limiter's remote path.

use ratewall::{
    backend::{Backend, BoxFuture, Decisions, MemoryBackend, Request},
    error::BackendError,
};

/// The memory backend behind the `Backend` trait (only the required
/// methods), so a limiter built on it takes its remote path: breaker,
/// publishing, deny cache, and everything but the network.
#[derive(Debug, Default)]
pub struct Remote(pub MemoryBackend);

impl Backend for Remote {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.0.acquire(requests)
    }
    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.0.peek(requests)
    }
    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.refund(requests, at_micros)
    }
    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.reset(requests)
    }
}
