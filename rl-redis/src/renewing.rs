//! A Redis Cluster connection that is opened again when it stalls.
//!
//! redis-rs's async cluster client (1.8) can stall for good while slots
//! move under load. Its slot refresh waits for the write half of the lock
//! on its connection map. A request in flight may then hold, or be queued
//! for, a read half of that lock. But the client does not poll its
//! requests in flight while a refresh runs. So the refresh never gets the
//! lock and never ends, and every later call through that client times
//! out. This module does not fix that. It bounds it: a backend that
//! opened its cluster connection itself opens a new one once calls through
//! it have found no server for a while (`reopen_stalled_cluster`: every call
//! timed out or lost its connection, none was answered, not even with an
//! error). Calls go on through the old connection until the new one is
//! open; one opening at a time, and at most one per period. A connection
//! the application gave the backend is never replaced.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{RedisError, RedisResult};

/// Opens a new connection.
pub(crate) type Reopen<T> =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = RedisResult<T>> + Send>> + Send + Sync>;

/// A connection, and how to open it again when it stalls (see the module
/// docs). Clones share it.
pub(crate) struct Renewing<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Renewing<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<T> {
    current: RwLock<T>,
    /// `None`: the application's connection, never replaced.
    reopen: Option<Reopen<T>>,
    stalled_after: Duration,
    born: Instant,
    /// When (ms after `born`) the current quiet span started: the last
    /// reply from a server, the last connection installed, or the last
    /// try to open one.
    quiet_since: AtomicU64,
    opening: AtomicBool,
    /// Connections opened again and installed.
    reopened: AtomicU64,
    /// Tries to open one that failed.
    failed: AtomicU64,
}

/// How often a stalled connection was opened again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reopened {
    pub(crate) installed: u64,
    pub(crate) failed: u64,
}

impl<T: Clone + Send + Sync + 'static> Renewing<T> {
    /// `connection`, opened again by `reopen` (when given) after
    /// `stalled_after` with no server heard.
    pub(crate) fn new(connection: T, reopen: Option<Reopen<T>>, stalled_after: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                current: RwLock::new(connection),
                reopen,
                stalled_after,
                born: Instant::now(),
                quiet_since: AtomicU64::new(0),
                opening: AtomicBool::new(false),
                reopened: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
        }
    }

    /// The connection to send a call on now.
    pub(crate) fn get(&self) -> T {
        self.inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How often the connection was opened again so far.
    pub(crate) fn reopened(&self) -> Reopened {
        Reopened {
            installed: self.inner.reopened.load(Ordering::Relaxed),
            failed: self.inner.failed.load(Ordering::Relaxed),
        }
    }

    /// Notes what a call got: `None` when it timed out. Opens a new
    /// connection (in a task of the current runtime) when no server was
    /// heard for the period it was made with.
    pub(crate) fn heard<V>(&self, reply: Option<&RedisResult<V>>) {
        let now = self.now_ms();
        if reply.is_some_and(|reply| reply.as_ref().err().is_none_or(answered)) {
            // A server answered: at most one store per 100 ms (or a
            // quarter of the period, if shorter), so busy callers do not
            // all write one cache line.
            let since = self.inner.quiet_since.load(Ordering::Relaxed);
            let step = (self.inner.stalled_after.as_millis() / 4).min(100);
            if u128::from(now.saturating_sub(since)) >= step {
                self.inner.quiet_since.store(now, Ordering::Relaxed);
            }
            return;
        }
        let quiet = now.saturating_sub(self.inner.quiet_since.load(Ordering::Relaxed));
        if u128::from(quiet) < self.inner.stalled_after.as_millis() {
            return;
        }
        let Some(reopen) = self.inner.reopen.clone() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.opening.swap(true, Ordering::AcqRel) {
            return;
        }
        let renewing = self.clone();
        runtime.spawn(async move {
            // Lets the next stall open again even when this task is
            // dropped with its runtime.
            let _opening = Opening(&renewing.inner.opening);
            tracing::warn!(
                quiet_ms = quiet,
                "no Redis Cluster node answered through the cluster connection for {quiet} ms \
                 (a redis-rs cluster client can stall for good while slots move); opening a \
                 new one"
            );
            match reopen().await {
                Ok(connection) => {
                    *renewing
                        .inner
                        .current
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = connection;
                    renewing.inner.reopened.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("a new Redis Cluster connection is in use");
                }
                Err(error) => {
                    renewing.inner.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(%error, "could not open a new Redis Cluster connection; \
                        calls go on through the old one");
                }
            }
            // The next quiet span starts now, whatever came of it.
            let now = renewing.now_ms();
            renewing.inner.quiet_since.store(now, Ordering::Relaxed);
        });
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Whether `error` came from a server (an error reply), not from a
/// connection that lost it or a wait that ran out.
fn answered(error: &RedisError) -> bool {
    !(error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error())
}

/// Clears the flag of an opening under way when dropped.
struct Opening<'a>(&'a AtomicBool);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;

    /// A fake connection: its number (how many were opened before it).
    type Fake = usize;

    fn renewing(stalled_after: Duration, fail: bool) -> (Renewing<Fake>, Arc<AtomicUsize>) {
        let opened = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&opened);
        let reopen: Reopen<Fake> = Arc::new(move || {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                if fail {
                    Err(RedisError::from(std::io::Error::from(
                        std::io::ErrorKind::ConnectionRefused,
                    )))
                } else {
                    Ok(n)
                }
            })
        });
        (Renewing::new(0, Some(reopen), stalled_after), opened)
    }

    const TIMED_OUT: Option<&RedisResult<()>> = None;

    /// Lets the spawned opening run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn calls_that_time_out_for_the_whole_period_open_one_new_connection() {
        let (renewing, opened) = renewing(Duration::from_millis(500), false);
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 0, "not quiet long enough yet");
        tokio::time::sleep(Duration::from_millis(550)).await;
        renewing.heard(TIMED_OUT);
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1, "one opening at a time");
        assert_eq!(renewing.get(), 1, "the new connection is in use");
        assert_eq!(
            renewing.reopened(),
            Reopened {
                installed: 1,
                failed: 0
            }
        );
        // A new quiet span starts with the new connection.
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 1);
    }

    #[tokio::test]
    async fn a_reply_from_a_server_even_an_error_keeps_the_connection() {
        let (renewing, opened) = renewing(Duration::from_millis(50), false);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let error_reply: RedisResult<()> = Err(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "WRONGTYPE",
        )));
        renewing.heard(Some(&error_reply));
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 0);
        assert_eq!(renewing.get(), 0);
    }

    #[tokio::test]
    async fn lost_connections_count_as_silence_and_a_failed_opening_keeps_the_old_one() {
        let (renewing, opened) = renewing(Duration::from_millis(50), true);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let dropped: RedisResult<()> = Err(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        renewing.heard(Some(&dropped));
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        assert_eq!(renewing.get(), 0, "the old connection stays");
        assert_eq!(
            renewing.reopened(),
            Reopened {
                installed: 0,
                failed: 1
            }
        );
        // At most one try per period.
        renewing.heard(Some(&dropped));
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(60)).await;
        renewing.heard(Some(&dropped));
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_applications_connection_is_never_replaced() {
        let renewing: Renewing<Fake> = Renewing::new(7, None, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 7);
        assert_eq!(renewing.reopened(), Reopened::default());
    }

    #[test]
    fn an_opening_whose_runtime_is_dropped_lets_the_next_stall_open_again() {
        let (renewing, _) = renewing(Duration::from_millis(10), false);
        // Never resolves: the opening is dropped with its runtime.
        let stuck: Reopen<Fake> = Arc::new(|| Box::pin(std::future::pending()));
        let renewing = Renewing {
            inner: Arc::new(Inner {
                reopen: Some(stuck),
                ..Arc::into_inner(renewing.inner).expect("one owner")
            }),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            renewing.heard(TIMED_OUT);
            settle().await;
        });
        assert!(renewing.inner.opening.load(Ordering::Acquire));
        drop(runtime);
        assert!(!renewing.inner.opening.load(Ordering::Acquire));
    }
}
