//! The future of one call ([`CallFuture`]) and of its admission alone
//! ([`Admitted`]).

use super::*;

/// The future of [`Limiter::call`]: already decided when the store is in
/// memory (no state, no allocation), boxed for a remote store (one
/// allocation next to a network round trip) and for a call that waits for
/// room ([`Keys::wait`](crate::Keys::wait)). `Send`.
#[must_use = "futures do nothing unless awaited"]
pub struct CallFuture<'l> {
    state: CallState<'l>,
}

pub(crate) type Decided<'l> = Result<Permit<'l>, Rejection>;

enum CallState<'l> {
    /// Admitted on the direct lane (one rate limit in memory, nothing
    /// around it but observation): the permit is made only when asked for.
    Direct {
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        decision: Decision,
        /// The limit it applied (what the tower layer's `RateLimit` fields
        /// describe).
        #[cfg_attr(
            not(any(feature = "tower", feature = "actix")),
            allow(dead_code, reason = "read by the route layer only")
        )]
        limit: Limit,
    },
    Ready(Option<Decided<'l>>),
    Remote(Pin<Box<dyn Future<Output = Decided<'l>> + Send + 'l>>),
    /// Polled to completion.
    Done,
}

impl<'l> CallFuture<'l> {
    #[inline]
    pub(crate) fn ready(result: Decided<'l>) -> Self {
        Self {
            state: CallState::Ready(Some(result)),
        }
    }

    pub(crate) fn remote(future: impl Future<Output = Decided<'l>> + Send + 'l) -> Self {
        Self {
            state: CallState::Remote(Box::pin(future)),
        }
    }

    /// A call admitted on the direct lane with `decision` under `limit`.
    #[inline(always)]
    pub(crate) fn direct(
        limiter: &'l Limiter,
        spec: &'l CallSpec,
        decision: Decision,
        limit: Limit,
    ) -> Self {
        Self {
            state: CallState::Direct {
                limiter,
                spec,
                decision,
                limit,
            },
        }
    }

    /// The result, when the call was decided without waiting (in memory, and
    /// not waiting for room).
    pub fn now(self) -> Option<Decided<'l>> {
        match self.state {
            CallState::Direct {
                limiter,
                spec,
                decision,
                ..
            } => Some(Ok(direct_permit(limiter, spec, decision))),
            CallState::Ready(result) => result,
            CallState::Remote(_) | CallState::Done => None,
        }
    }

    /// The result when decided now, handed to `admitted` (the decision and
    /// its limit) for a call admitted on the direct lane, else to `decided`:
    /// what the tower layer makes of an in-memory call without building a
    /// permit it does not need.
    #[cfg(any(feature = "tower", feature = "actix"))]
    #[inline(always)]
    pub(crate) fn now_with<R>(
        self,
        admitted: impl FnOnce(&Decision, &Limit) -> R,
        decided: impl FnOnce(Decided<'l>) -> R,
    ) -> Option<R> {
        match self.state {
            CallState::Direct {
                decision, limit, ..
            } => Some(admitted(&decision, &limit)),
            CallState::Ready(Some(result)) => Some(decided(result)),
            CallState::Ready(None) | CallState::Remote(_) | CallState::Done => None,
        }
    }
}

/// The permit of a call the direct lane admitted with `decision`.
#[inline(always)]
fn direct_permit<'l>(limiter: &'l Limiter, spec: &'l CallSpec, decision: Decision) -> Permit<'l> {
    Permit {
        limiter,
        spec,
        admission: Admission::Backend(Decisions::one(decision)),
        skipped: 0,
        settle: None,
        waited: Duration::ZERO,
        tiers: None,
        in_flight: None,
    }
}

impl<'l> CallFuture<'l> {
    /// The call's admission or refusal, without the permit: dropped at once
    /// (an unsettled permit keeps what it took, as a call that counts every
    /// admission does). What `#[rate_limit]` awaits when it keeps no
    /// permit: the function's future then holds a small value across the
    /// wait, not the permit.
    #[inline]
    pub fn admitted(self) -> Admitted<'l> {
        Admitted {
            state: match self.state {
                CallState::Direct { .. } => AdmittedState::Ready(Some(Ok(()))),
                CallState::Ready(result) => AdmittedState::Ready(result.map(|r| r.map(drop))),
                CallState::Remote(future) => AdmittedState::Remote(future),
                CallState::Done => AdmittedState::Ready(None),
            },
        }
    }
}

/// The future of a call awaited for its admission only
/// (`__private::admitted`): `Ok(())` when admitted, the refusal otherwise.
#[must_use = "futures do nothing unless awaited"]
pub struct Admitted<'l> {
    state: AdmittedState<'l>,
}

enum AdmittedState<'l> {
    Ready(Option<Result<(), Rejection>>),
    Remote(Pin<Box<dyn Future<Output = Decided<'l>> + Send + 'l>>),
}

impl fmt::Debug for Admitted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            AdmittedState::Ready(result) => f.debug_tuple("Ready").field(result).finish(),
            AdmittedState::Remote(_) => f.write_str("Remote(..)"),
        }
    }
}

impl<'l> Admitted<'l> {
    /// The answer when it is decided already (the memory store), else the
    /// future to await for it.
    #[inline]
    pub(crate) fn decided(self) -> Result<Result<(), Rejection>, Self> {
        match self.state {
            AdmittedState::Ready(Some(result)) => Ok(result),
            state => Err(Self { state }),
        }
    }
}

impl Future for Admitted<'_> {
    type Output = Result<(), Rejection>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            AdmittedState::Ready(result) => {
                Poll::Ready(result.take().expect("Admitted polled after completion"))
            }
            AdmittedState::Remote(future) => future.as_mut().poll(cx).map(|r| r.map(drop)),
        }
    }
}

impl fmt::Debug for CallFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            CallState::Direct { decision, .. } => f.debug_tuple("Direct").field(decision).finish(),
            CallState::Ready(result) => f.debug_tuple("Ready").field(result).finish(),
            CallState::Remote(_) => f.write_str("Remote(..)"),
            CallState::Done => f.write_str("Done"),
        }
    }
}

impl<'l> Future for CallFuture<'l> {
    type Output = Decided<'l>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let state = &mut self.get_mut().state;
        match state {
            CallState::Direct {
                limiter,
                spec,
                decision,
                ..
            } => {
                let permit = direct_permit(limiter, spec, *decision);
                *state = CallState::Done;
                Poll::Ready(Ok(permit))
            }
            CallState::Ready(result) => {
                Poll::Ready(result.take().expect("CallFuture polled after completion"))
            }
            CallState::Remote(future) => future.as_mut().poll(cx),
            CallState::Done => panic!("CallFuture polled after completion"),
        }
    }
}
