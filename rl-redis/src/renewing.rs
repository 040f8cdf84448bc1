//! A Redis Cluster connection that is opened again when it stalls.
//!
//! redis-rs's async cluster client (1.8) can stall for good while slots
//! move under load. Its slot refresh waits for the write half of the lock
//! on its connection map. A request in flight may then hold, or be queued
//! for, a read half of that lock. But the client does not poll its
//! requests in flight while a refresh runs. So the refresh never gets the
//! lock and never ends, and every later call through that client times
//! out. This module does not fix that. It bounds it: a backend that
//! opened its cluster connection itself opens a new one once the calls
//! through it have gone unanswered for a while (`reopen_stalled_cluster`):
//! from the first call that timed out, lost its connection (or found none,
//! or was lost inside redis-rs's client) or was dropped by its caller
//! unfinished, to one as late as the period, no call was answered by a
//! server (an error reply is an answer; a pause with no calls after an
//! answer is not silence). Calls go on through the old connection until the
//! new one is open; one opening at a time, and at most one per period. A
//! connection the application gave the backend is never replaced.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, RedisResult};

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

/// No call unanswered since the last answer.
const ANSWERED: u64 = u64::MAX;

struct Inner<T> {
    current: RwLock<T>,
    /// `None`: the application's connection, never replaced.
    reopen: Option<Reopen<T>>,
    stalled_after: Duration,
    /// The longest an opening may take.
    open_timeout: Duration,
    born: Instant,
    /// When (ms after `born`) the current run of unanswered calls began
    /// (or the last failed opening ended); [`ANSWERED`] when a server
    /// answered since.
    silent_since: AtomicU64,
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
    /// `connection`, opened again by `reopen` (when given, each opening
    /// given at most `open_timeout`) once calls went unanswered for
    /// `stalled_after`.
    pub(crate) fn new(
        connection: T,
        reopen: Option<Reopen<T>>,
        stalled_after: Duration,
        open_timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                current: RwLock::new(connection),
                reopen,
                stalled_after,
                open_timeout,
                born: Instant::now(),
                silent_since: AtomicU64::new(ANSWERED),
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

    /// A guard for one call: unless [`Call::heard`] is told what the call
    /// got, dropping it counts the call as unanswered (its caller dropped
    /// it unfinished, e.g. under a shorter timeout of its own).
    pub(crate) fn call(&self) -> Call<'_, T> {
        Call {
            renewing: self,
            told: false,
        }
    }

    /// Notes what a call got: `None` when it timed out. Opens a new
    /// connection (in a task of the current runtime) when calls went
    /// unanswered for the period.
    fn heard<V>(&self, reply: Option<&RedisResult<V>>) {
        if reply.is_some_and(|reply| reply.as_ref().err().is_none_or(answered)) {
            // Read first: a busy, healthy connection writes nothing.
            if self.inner.silent_since.load(Ordering::Relaxed) != ANSWERED {
                self.inner.silent_since.store(ANSWERED, Ordering::Relaxed);
            }
            return;
        }
        self.unanswered();
    }

    /// A call went unanswered.
    fn unanswered(&self) {
        let now = self.now_ms();
        let since = match self.inner.silent_since.compare_exchange(
            ANSWERED,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => now,
            Err(since) => since,
        };
        if !self.silent_long_enough(since, now) {
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
        // Owned by the task from now: dropped with it, polled or not, it
        // lets the next stall open again.
        let opening = Opening(Arc::clone(&self.inner));
        // Still silent, read after winning the flag: an opening that just
        // ended started a new period.
        let since = self.inner.silent_since.load(Ordering::Relaxed);
        if since == ANSWERED || !self.silent_long_enough(since, now) {
            return;
        }
        let renewing = self.clone();
        let quiet = now.saturating_sub(since);
        runtime.spawn(async move {
            let _opening = opening;
            tracing::warn!(
                quiet_ms = quiet,
                "no call through the Redis Cluster connection was answered for {quiet} ms \
                 (redis-rs's cluster client can stall for good while slots move); opening a \
                 new one"
            );
            let opened = tokio::time::timeout(renewing.inner.open_timeout, reopen()).await;
            match opened {
                Ok(Ok(connection)) => {
                    *renewing
                        .inner
                        .current
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = connection;
                    renewing.inner.reopened.fetch_add(1, Ordering::Relaxed);
                    renewing
                        .inner
                        .silent_since
                        .store(ANSWERED, Ordering::Relaxed);
                    tracing::warn!("a new Redis Cluster connection is in use");
                }
                failed => {
                    renewing.inner.failed.fetch_add(1, Ordering::Relaxed);
                    // The next try waits a whole period more, unless a
                    // server answered meanwhile.
                    let now = renewing.now_ms();
                    let _ = renewing.inner.silent_since.fetch_update(
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                        |since| (since != ANSWERED).then_some(now),
                    );
                    let why = match failed {
                        Ok(Err(error)) => error.to_string(),
                        _ => format!("no connection within {:?}", renewing.inner.open_timeout),
                    };
                    tracing::error!(
                        error = %why,
                        "could not open a new Redis Cluster connection; calls go on through \
                         the old one"
                    );
                }
            }
        });
    }

    fn silent_long_enough(&self, since: u64, now: u64) -> bool {
        u128::from(now.saturating_sub(since)) >= self.inner.stalled_after.as_millis()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.born.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
}

/// One call through a [`Renewing`] connection (see [`Renewing::call`]).
pub(crate) struct Call<'a, T: Clone + Send + Sync + 'static> {
    renewing: &'a Renewing<T>,
    told: bool,
}

impl<T: Clone + Send + Sync + 'static> Call<'_, T> {
    /// What the call got: `None` when it timed out.
    pub(crate) fn heard<V>(mut self, reply: Option<&RedisResult<V>>) {
        self.told = true;
        self.renewing.heard(reply);
    }
}

impl<T: Clone + Send + Sync + 'static> Drop for Call<'_, T> {
    fn drop(&mut self) {
        if !self.told {
            self.renewing.unanswered();
        }
    }
}

/// Whether `error` came from a server (an error reply, or a reply that
/// did not convert), not from a connection that lost it, a wait that ran
/// out, or a cluster client with no connection to send it on or whose
/// own task dropped it (`Client`: "request wasn't handled due to internal
/// failure").
fn answered(error: &RedisError) -> bool {
    !(error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound | ErrorKind::Client
        ))
}

/// Clears the flag of an opening under way when dropped.
struct Opening<T>(Arc<Inner<T>>);

impl<T> Drop for Opening<T> {
    fn drop(&mut self) {
        self.0.opening.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;

    /// A fake connection: its number (how many were opened before it).
    type Fake = usize;

    /// Periods long enough that a thread paused on a loaded machine does
    /// not end one early.
    const PERIOD: Duration = Duration::from_secs(1);
    const PAST: Duration = Duration::from_millis(1_050);

    fn renewing(fail: bool) -> (Renewing<Fake>, Arc<AtomicUsize>) {
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
        let renewing = Renewing::new(0, Some(reopen), PERIOD, Duration::from_secs(5));
        (renewing, opened)
    }

    const TIMED_OUT: Option<&RedisResult<()>> = None;

    fn dropped() -> RedisResult<()> {
        Err(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )))
    }

    /// Lets a spawned opening run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn calls_unanswered_for_the_whole_period_open_one_new_connection() {
        let (renewing, opened) = renewing(false);
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 0, "silent for no time yet");
        tokio::time::sleep(PAST).await;
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
        // A new run of silence starts after the new connection.
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 1);
    }

    #[tokio::test]
    async fn a_pause_with_no_calls_is_not_silence() {
        let (renewing, opened) = renewing(false);
        renewing.heard(Some(&Ok::<(), RedisError>(())));
        tokio::time::sleep(PAST).await;
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 0);
        assert_eq!(renewing.get(), 0);
    }

    #[tokio::test]
    async fn a_reply_from_a_server_even_an_error_ends_the_silence() {
        let (renewing, opened) = renewing(false);
        renewing.heard(TIMED_OUT);
        tokio::time::sleep(PAST).await;
        let error_reply: RedisResult<()> = Err(RedisError::from((
            ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "WRONGTYPE",
        )));
        renewing.heard(Some(&error_reply));
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 0);
        assert_eq!(renewing.get(), 0);
    }

    #[tokio::test]
    async fn a_call_its_caller_dropped_unfinished_counts_as_unanswered() {
        let (renewing, opened) = renewing(false);
        drop(renewing.call());
        tokio::time::sleep(PAST).await;
        drop(renewing.call());
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        assert_eq!(renewing.get(), 1);
        // A call told what it got counts as that.
        renewing.call().heard(Some(&Ok::<(), RedisError>(())));
        tokio::time::sleep(PAST).await;
        renewing.call().heard(TIMED_OUT);
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn lost_connections_are_silence_and_a_failed_opening_keeps_the_old_one() {
        let (renewing, opened) = renewing(true);
        renewing.heard(Some(&dropped()));
        tokio::time::sleep(PAST).await;
        renewing.heard(Some(&dropped()));
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
        renewing.heard(Some(&dropped()));
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        tokio::time::sleep(PAST).await;
        renewing.heard(Some(&dropped()));
        settle().await;
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }

    /// An opening that never ends, counted.
    fn stuck() -> (Reopen<Fake>, Arc<AtomicUsize>) {
        let tries = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&tries);
        let reopen: Reopen<Fake> = Arc::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::pending())
        });
        (reopen, tries)
    }

    #[tokio::test]
    async fn an_opening_that_takes_too_long_fails_and_the_next_stall_opens_again() {
        let (stuck, tries) = stuck();
        let renewing = Renewing::new(0, Some(stuck), PERIOD, Duration::from_millis(50));
        renewing.heard(TIMED_OUT);
        tokio::time::sleep(PAST).await;
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while renewing.reopened().failed == 0 {
            assert!(Instant::now() < deadline, "the opening never timed out");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        settle().await;
        assert!(!renewing.inner.opening.load(Ordering::Acquire));
        tokio::time::sleep(PAST).await;
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(
            tries.load(Ordering::SeqCst),
            2,
            "the next stall opened again"
        );
    }

    #[tokio::test]
    async fn the_applications_connection_is_never_replaced() {
        let renewing: Renewing<Fake> = Renewing::new(7, None, PERIOD, Duration::from_secs(5));
        renewing.heard(TIMED_OUT);
        tokio::time::sleep(PAST).await;
        renewing.heard(TIMED_OUT);
        settle().await;
        assert_eq!(renewing.get(), 7);
        assert_eq!(renewing.reopened(), Reopened::default());
    }

    #[test]
    fn an_opening_dropped_with_its_runtime_unpolled_lets_the_next_stall_open() {
        let (stuck, tries) = stuck();
        let renewing = Renewing::new(0, Some(stuck), PERIOD, Duration::from_secs(60));
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime")
        };
        let first = runtime();
        first.block_on(async {
            renewing.heard(TIMED_OUT);
            tokio::time::sleep(PAST).await;
            // Spawned, never polled: this task does not yield after.
            renewing.heard(TIMED_OUT);
        });
        assert!(renewing.inner.opening.load(Ordering::Acquire));
        assert_eq!(tries.load(Ordering::SeqCst), 0, "never polled");
        drop(first);
        assert!(!renewing.inner.opening.load(Ordering::Acquire));
        // Still silent: the next unanswered call opens.
        runtime().block_on(async {
            renewing.heard(TIMED_OUT);
            settle().await;
        });
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
