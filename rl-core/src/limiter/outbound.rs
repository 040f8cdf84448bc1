//! Calls out to an upstream that limits us, one road for every client
//! integration (the tower client layer, the reqwest middleware): a request
//! draws on the shared budget ([`Draw`]), waiting for room
//! ([`Outbound::draw`]); the upstream's answer is heard
//! ([`Outbound::hear`]): a refusal is learned from, then a pause it says is
//! shared; then the call is settled ([`Heard::settle`]): its real cost (a
//! `429`'s is zero; with [`Auto`] it is given back in every group), what an accepted answer teaches a budget that finds
//! its limit, and what the upstream says is left, in that order. The order
//! matters: a budget that finds its limit reads its own count before a
//! hold changes it (a refusal's with the refused call's cost still in it,
//! an accepted call's with its real cost); a pause is shared before the
//! estimate is given back (every instance sees it soon after the refusal);
//! the remaining count after the settlement (an estimate given back cannot
//! reopen room the upstream does not have).

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::limiter::Limiter;
use crate::limiter::auto::Auto;
use crate::limiter::call::{Detached, Keys, Permit};
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::{Counts, Hold};
use crate::limiter::wait::stated_cannot_wait;
use crate::limiter::{room, timer};
use crate::model::clock::later;
use crate::model::rejection::{Rejection, RejectionReason};

/// What one outgoing request draws on: an identity per group of the
/// budget's spec (in order), its cost in each, and how long it may wait
/// for room.
///
/// ```
/// use ratewall::upstream::Draw;
/// use std::time::Duration;
/// // Requests and tokens of one model: 1 request, ~1 500 tokens (settled later).
/// let draw = Draw::new(["gpt-4o", "gpt-4o"]).costs([1, 1_500]).wait(Duration::from_secs(5));
/// assert_eq!(draw, Draw::new(["gpt-4o"; 2]).costs([1, 1_500]).wait(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    identities: SmallVec<[String; 2]>,
    costs: SmallVec<[u64; 2]>,
    wait: Option<Duration>,
}

impl Draw {
    /// Draws on each group with its identity, at each group's own cost.
    pub fn new<I: Into<String>>(identities: impl IntoIterator<Item = I>) -> Self {
        Self {
            identities: identities.into_iter().map(Into::into).collect(),
            costs: SmallVec::new(),
            wait: None,
        }
    }

    /// This request's cost in each group (an estimate, where the real
    /// cost is settled later), one per group.
    pub fn costs(mut self, costs: impl IntoIterator<Item = u64>) -> Self {
        self.costs = costs.into_iter().collect();
        self
    }

    /// How long this request may wait for room, instead of the client's
    /// own wait (e.g. the time left before a deadline).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The identities, as the keys of a call take them.
    fn identities(&self) -> SmallVec<[&(dyn fmt::Display + Sync); 2]> {
        self.identities
            .iter()
            .map(|i| i as &(dyn fmt::Display + Sync))
            .collect()
    }
}

/// A budget for calls out, and how its upstream's answers are heard: what
/// a client integration holds (shared by its clones).
#[derive(Debug)]
pub(crate) struct Outbound {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) spec: CallSpec,
    pub(crate) counts: Vec<Counts>,
    pub(crate) wait: Duration,
    pub(crate) pause_on_refusal: Duration,
    pub(crate) max_pause: Duration,
    pub(crate) auto: Option<Auto>,
}

impl Outbound {
    /// Calls drawing on `spec`'s groups in `limiter`, each group counting
    /// what `counts` says. Waits up to 60 s for room, or not at all when
    /// `spec`'s calls cannot wait; a `429`/`503` without `Retry-After`
    /// pauses the budget for 1 s; a pause is believed up to 5 minutes.
    pub(crate) fn new(
        limiter: Arc<Limiter>,
        spec: CallSpec,
        counts: impl IntoIterator<Item = Counts>,
    ) -> Self {
        // A wait the spec cannot take would refuse every request.
        let wait = match stated_cannot_wait(&spec) {
            Some(_) => Duration::ZERO,
            None => Duration::from_secs(60),
        };
        Self {
            limiter,
            spec,
            counts: counts.into_iter().collect(),
            wait,
            pause_on_refusal: Duration::from_secs(1),
            max_pause: Duration::from_secs(300),
            auto: None,
        }
    }

    /// Sets the wait, logging (once, here) a non-zero wait over a spec
    /// that cannot wait, with the reason.
    pub(crate) fn set_wait(&mut self, wait: Duration, client: &str) {
        if !wait.is_zero()
            && let Some(why) = stated_cannot_wait(&self.spec)
        {
            tracing::warn!(call = %self.spec.name(), error = %why, "{client}: a wait over a spec that cannot wait");
        }
        self.wait = wait;
    }

    /// Draws `draw` on the budget, waiting for room (its own wait, or the
    /// client's). Refused, a budget that finds its limit reads the shared
    /// scale first when the budget is paused, perhaps by another instance
    /// (not asked of a store that could not decide).
    ///
    /// A budget that finds its limit and waits by retrying (its limits are
    /// windows) waits in steps of at most [`Auto::every`], reading the
    /// shared scale between them when it is due: a call that slept through
    /// a pause another instance heard tries again with the limits learned
    /// from that refusal, not with those it had before it. Otherwise every
    /// caller of an instance that heard no refusal wakes at the pause's
    /// end with the old limits and spends them at once, drawing the next
    /// refusal from an upstream that has room for a few calls only.
    pub(crate) async fn draw(&self, draw: &Draw) -> Result<Permit<'_>, Rejection> {
        let identities = draw.identities();
        let wait = draw.wait.unwrap_or(self.wait);
        let keys = |wait| Keys::new(&identities).costs(&draw.costs).wait(wait);
        let auto = match &self.auto {
            Some(auto) if self.retries() && timer::available() => auto,
            _ => {
                return match self.limiter.call_with(&self.spec, keys(wait)).await {
                    Ok(permit) => Ok(permit),
                    Err(refused) => {
                        self.refresh(&refused).await;
                        Err(refused)
                    }
                };
            }
        };
        let started = Instant::now();
        let deadline = later(started, wait);
        let freed = self.limiter.room.of(self.spec.name());
        let mut woken = false;
        loop {
            let attempt = Instant::now();
            let left = deadline.saturating_duration_since(attempt);
            match self
                .limiter
                .call_with(&self.spec, keys(left.min(auto.every_read())))
                .await
            {
                Ok(mut permit) => {
                    // The steps before this one, and the wait within it.
                    permit.waited += attempt.duration_since(started);
                    if woken {
                        // Room was given back: it may fit the next one too.
                        self.limiter.room.freed(self.spec.name());
                    }
                    return Ok(permit);
                }
                Err(refused) => {
                    let next = match (refused.reason(), refused.retry_after()) {
                        (RejectionReason::Limited { .. }, Some(retry)) => {
                            Some(later(Instant::now(), retry.max(Duration::from_micros(1))))
                        }
                        _ => None,
                    };
                    let Some(next) = next.filter(|at| *at <= deadline) else {
                        self.refresh(&refused).await;
                        return Err(refused);
                    };
                    woken = room::sleep_or_told(next, pin!(freed.notified())).await;
                    self.refresh(&refused).await;
                }
            }
        }
    }

    /// Whether the budget's calls wait by retrying after each refusal (no
    /// limit of it queues, as GCRA and the buckets do).
    fn retries(&self) -> bool {
        !self
            .spec
            .groups()
            .iter()
            .flat_map(|g| g.limits())
            .any(|l| l.algorithm().reserves())
    }

    /// A budget that finds its limit reads the shared scale when the budget
    /// refused a call with a time to come back (not a store that could not
    /// decide).
    async fn refresh(&self, refused: &Rejection) {
        if let Some(auto) = &self.auto
            && refused.retry_after().is_some()
            && let Err(error) = self.limiter.refresh_learned(&self.spec, auto).await
        {
            tracing::warn!(call = self.spec.name(), %error, "the upstream's learned limit could not be read");
        }
    }

    /// Hears the upstream's answer to the call `permit` admitted: its
    /// status and headers ([`Hold::from_headers`]). A `429`/`503` that
    /// pauses nothing pauses the budget for `pause_on_refusal`; a pause is
    /// believed up to `max_pause`, and shared at once. What is left to do
    /// is [`Heard::settle`]'s.
    pub(crate) async fn hear<'h>(
        &self,
        permit: Permit<'_>,
        draw: &Draw,
        status: u16,
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    ) -> Heard {
        let mut hold = Hold::from_headers(headers, &self.counts);
        if matches!(status, 429 | 503) && !hold.pauses() {
            hold = hold.pause(self.pause_on_refusal);
        }
        let hold = hold.capped(self.max_pause);
        let accepted = !matches!(status, 429 | 503);
        if !accepted {
            self.learn(draw, accepted, &hold).await;
        }
        let pauses = hold.pauses();
        if pauses {
            self.share(draw, &self.shared(&hold)).await;
        }
        Heard {
            permit: permit.detach(),
            hold,
            pauses,
            status,
        }
    }

    /// A budget that finds its limit hears an answer ([`Limiter::learn`]);
    /// a failure is logged.
    async fn learn(&self, draw: &Draw, accepted: bool, hold: &Hold) {
        let Some(auto) = &self.auto else {
            return;
        };
        let identities = draw.identities();
        let keys = Keys::new(&identities).costs(&draw.costs);
        if let Err(error) = self
            .limiter
            .learn(&self.spec, keys, auto, accepted, hold)
            .await
        {
            tracing::warn!(call = self.spec.name(), %error, "the upstream's limit could not be learned");
        }
    }

    /// What of `heard` is shared: all of it, or for a budget that finds
    /// its limit, all but the counts said to be left above zero (they
    /// taught it the limit; written into its window as well, each one
    /// answered a moment after the budget admitted more, they would fill
    /// it with units the upstream never counted, and a later refusal would
    /// read them as the upstream's).
    fn shared(&self, heard: &Hold) -> Hold {
        match &self.auto {
            Some(_) => heard.clone().without_room_left(),
            None => heard.clone(),
        }
    }

    /// Makes every instance hear `hold` ([`Limiter::hold`]); a failure is
    /// logged.
    async fn share(&self, draw: &Draw, hold: &Hold) {
        let identities = draw.identities();
        if let Err(error) = self
            .limiter
            .hold(&self.spec, Keys::new(&identities), hold)
            .await
        {
            tracing::warn!(call = self.spec.name(), %error, "the upstream's rate-limit word could not be shared");
        }
    }
}

/// An answered call out, its pause shared, to be settled.
#[derive(Debug)]
pub(crate) struct Heard {
    permit: Detached,
    hold: Hold,
    /// Whether the hold pauses a group (shared when heard).
    pauses: bool,
    status: u16,
}

impl Heard {
    /// Whether the real cost is to be read from the answer: not from a
    /// `429`, which took nothing upstream.
    pub(crate) fn reads_cost(&self) -> bool {
        self.status != 429
    }

    /// Settles the call `outbound` admitted for `draw`: `actual` is its
    /// real cost (`None` keeps the estimate; a `429`'s is zero, given back
    /// in a spec whose groups settle their cost). Then a budget that finds
    /// its limit hears an accepted answer ([`Limiter::learn`]; a refusal's
    /// was heard before its pause), and what the upstream said is shared
    /// (again, after a pause: an estimate given back cannot reopen it).
    pub(crate) async fn settle(self, outbound: &Outbound, draw: &Draw, actual: Option<u64>) {
        let actual = if self.reads_cost() { actual } else { Some(0) };
        let permit = self.permit.attach(&outbound.limiter, &outbound.spec);
        let settled = match actual {
            // A budget that finds its limit reads the upstream's count in
            // its own: a `429`, which the upstream did not count, is given
            // back in every group (requests too, not only the groups that
            // settle their cost). Otherwise the refused calls of a burst
            // stay in the count and the limit is found high.
            _ if self.status == 429 && outbound.auto.is_some() && permit.settle.is_some() => {
                permit.refund().await;
                true
            }
            Some(actual) if permit.settle.is_some() => {
                permit.settle_cost(actual).await;
                true
            }
            _ => {
                drop(permit);
                false
            }
        };
        let accepted = !matches!(self.status, 429 | 503);
        if accepted && outbound.auto.is_some() {
            outbound.learn(draw, accepted, &self.hold).await;
        }
        let hold = outbound.shared(&self.hold);
        if !self.pauses || settled {
            outbound.share(draw, &hold).await;
        }
    }
}
