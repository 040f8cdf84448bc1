//! Sleeping for waiting calls, on any executor: one background thread
//! (`rl-timer`, started on the first wait) keeps the deadlines of pending
//! sleeps and wakes each task when its deadline passes.
//!
//! Why not `tokio::time`: its sleep panics outside a runtime with timers
//! enabled, and the limiter's futures run wherever the caller polls them
//! (a tokio runtime built without `enable_time`, another executor, a test's
//! `block_on`). The thread wakes within tens of microseconds of a deadline
//! (a futex wait), finer than tokio's millisecond wheel. If the thread
//! cannot be started, [`available`] is false and calls do not wait.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// The pending deadlines and who waits for them.
#[derive(Default)]
struct Pending {
    /// Deadlines with their entry ids, earliest first (an entry dropped
    /// before its deadline stays here until then, without a waker).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: HashMap<u64, Waker>,
    next: u64,
}

struct Timer {
    pending: Mutex<Pending>,
    changed: Condvar,
}

/// The timer, with whether its thread runs.
static TIMER: LazyLock<(&'static Timer, bool)> = LazyLock::new(|| {
    let timer: &'static Timer = Box::leak(Box::new(Timer {
        pending: Mutex::new(Pending::default()),
        changed: Condvar::new(),
    }));
    let started = std::thread::Builder::new()
        .name("rl-timer".into())
        .spawn(move || timer.run())
        .is_ok();
    if !started {
        tracing::error!("could not start the rate limiter's timer thread: calls will not wait");
    }
    (timer, started)
});

impl Timer {
    /// The thread: wakes every entry whose deadline has passed, then sleeps
    /// until the next deadline or a new earlier one.
    fn run(&self) {
        let mut due: Vec<Waker> = Vec::new();
        let mut pending = self.pending.lock();
        loop {
            let now = Instant::now();
            while let Some(&Reverse((at, id))) = pending.deadlines.peek() {
                if at > now {
                    break;
                }
                pending.deadlines.pop();
                if let Some(waker) = pending.wakers.remove(&id) {
                    due.push(waker);
                }
            }
            if !due.is_empty() {
                drop(pending);
                due.drain(..).for_each(Waker::wake);
                pending = self.pending.lock();
                continue;
            }
            match pending.deadlines.peek() {
                Some(&Reverse((at, _))) => {
                    self.changed.wait_until(&mut pending, at);
                }
                None => self.changed.wait(&mut pending),
            }
        }
    }
}

/// Whether calls can wait (the timer thread runs).
pub(crate) fn available() -> bool {
    TIMER.1
}

/// A future that completes at `deadline`.
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline, id: None }
}

/// See [`sleep_until`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub(crate) struct Sleep {
    deadline: Instant,
    /// The entry in the timer, once registered.
    id: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline || !available() {
            this.forget();
            return Poll::Ready(());
        }
        let timer = TIMER.0;
        let mut pending = timer.pending.lock();
        match this.id {
            Some(id) => match pending.wakers.get_mut(&id) {
                Some(waker) => waker.clone_from(cx.waker()),
                // Woken already (the deadline passed between the check above
                // and the lock): poll again at once.
                None => {
                    drop(pending);
                    this.id = None;
                    cx.waker().wake_by_ref();
                }
            },
            None => {
                let id = pending.next;
                pending.next += 1;
                let earliest = pending
                    .deadlines
                    .peek()
                    .is_none_or(|&Reverse((at, _))| this.deadline < at);
                pending.deadlines.push(Reverse((this.deadline, id)));
                pending.wakers.insert(id, cx.waker().clone());
                this.id = Some(id);
                if earliest {
                    timer.changed.notify_one();
                }
            }
        }
        Poll::Pending
    }
}

impl Sleep {
    /// Removes this sleep's waker from the timer.
    fn forget(&mut self) {
        if let Some(id) = self.id.take() {
            TIMER.0.pending.lock().wakers.remove(&id);
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sleeps_end_at_their_deadline_in_order_without_a_runtime() {
        let start = Instant::now();
        let ends: Vec<Duration> = std::thread::scope(|scope| {
            let handles: Vec<_> = [30u64, 10, 20]
                .into_iter()
                .map(|ms| {
                    scope.spawn(move || {
                        block_on(sleep_until(start + Duration::from_millis(ms)));
                        start.elapsed()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (end, ms) in ends.iter().zip([30u64, 10, 20]) {
            assert!(*end >= Duration::from_millis(ms), "{end:?} < {ms} ms");
        }
    }

    /// A minimal executor: parks the thread until woken.
    fn block_on<F: Future>(future: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    }
}
