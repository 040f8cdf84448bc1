//! What an upstream says about the budget a call drew on ([`Hold`], read
//! from its headers in `read.rs`), and how the limiter makes every instance
//! sharing that budget hear it ([`Limiter::hold`]): a pause until the
//! upstream's `Retry-After` (or until its count resets, when nothing is
//! left), and a correction of the remaining amount down to the upstream's
//! own count.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::layer::ALL;
use crate::limiter::Limiter;
use crate::limiter::attempt::{Attempt, OwnedAttempt};
use crate::limiter::call::Keys;
use crate::limiter::resolve::{self, Targets};
use crate::limiter::room::{PausedKeys, Pauses};
use crate::limiter::settle::{applied, rate_targets};
use crate::limiter::spec::CallSpec;
use crate::model::clock::micros;
use crate::model::error::{Error, LimitError};
use crate::store::target::Op;

mod read;

/// What a group of a call counts, to read an upstream's rate-limit headers
/// for it ([`Hold::from_headers`], which lists the headers read for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counts {
    /// Requests: OpenAI's `x-ratelimit-*-requests`, Anthropic's
    /// `anthropic-ratelimit-requests-*`, the IETF `RateLimit` and
    /// `RateLimit-Policy` fields, `RateLimit-Remaining` / `-Limit` /
    /// `-Reset`, `x-ratelimit-remaining` / `-limit`.
    Requests,
    /// Tokens: OpenAI's `x-ratelimit-*-tokens`, Anthropic's
    /// `anthropic-ratelimit-tokens-*` (the most restrictive of its input
    /// and output token limits).
    Tokens,
    /// Input tokens: Anthropic's `anthropic-ratelimit-input-tokens-*`.
    InputTokens,
    /// Output tokens: Anthropic's `anthropic-ratelimit-output-tokens-*`.
    OutputTokens,
    /// Nothing the upstream reports on (a limit of our own).
    Nothing,
}

/// What an upstream said about a budget a call drew on: a pause (its
/// `429`/`503` with `Retry-After`), and per group of the call's spec how
/// much it says is left, its limit, and when its count resets.
/// [`Limiter::hold`] writes it into the budget every instance shares,
/// through the store: each state only ever goes up (a budget already that
/// full is left as it is).
///
/// ```
/// use ratewall::upstream::{Counts, Hold};
/// use std::time::Duration;
/// // A 429 with `retry-after: 20` and OpenAI-style remaining counts.
/// let headers = [
///     ("retry-after", &b"20"[..]),
///     ("x-ratelimit-remaining-requests", b"0"),
///     ("x-ratelimit-reset-requests", b"1m30s"),
///     ("x-ratelimit-remaining-tokens", b"1200"),
///     ("x-ratelimit-reset-tokens", b"850ms"),
/// ];
/// let hold = Hold::from_headers(headers, &[Counts::Requests, Counts::Tokens]);
/// assert_eq!(hold.paused(), Some(Duration::from_secs(20)));
/// assert_eq!((hold.left_in(0), hold.reset_in(0)), (Some(0), Some(Duration::from_secs(90))));
/// assert_eq!((hold.left_in(1), hold.reset_in(1)), (Some(1200), Some(Duration::from_millis(850))));
/// // Nothing left in the requests until they reset: that group is paused 90 s.
/// assert_eq!(hold.paused_in(0), Some(Duration::from_secs(90)));
/// assert_eq!(hold.paused_in(1), Some(Duration::from_secs(20)));
/// assert_eq!(Hold::new().pause(Duration::from_secs(5)).left(1, 10), Hold::new().left(1, 10).pause(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    pause: Option<Duration>,
    /// Units left now, per group (by index).
    left: SmallVec<[Option<u64>; 2]>,
    /// The upstream's own limit, per group (by index).
    limit: SmallVec<[Option<u64>; 2]>,
    /// When the upstream's count resets, per group (by index).
    reset: SmallVec<[Option<Duration>; 2]>,
}

impl Hold {
    /// The longest pause a hold carries: one day (an upstream's daily
    /// quota spent). A longer one, said or given ([`Hold::pause`],
    /// [`Hold::reset`]), is held for this long; the upstream's next refusal
    /// pauses the budget again. No header value or duration can make a
    /// hold panic or overflow.
    pub const MAX_PAUSE: Duration = Duration::from_secs(86_400);

    /// Nothing said.
    pub fn new() -> Self {
        Self::default()
    }

    /// No call passes in any group of the call for `pause` (the upstream's
    /// `Retry-After`), by the store's clock, on every algorithm, however
    /// many windows or slots it spans. Then calls resume: GCRA and the
    /// buckets at their rate, not in a burst (1 µs after the pause's end);
    /// the window algorithms at the pause's end, on their counts (what
    /// the current window or slots hold then). The longest of two pauses
    /// holds; a pause past [`Hold::MAX_PAUSE`] is held for that long.
    pub fn pause(mut self, pause: Duration) -> Self {
        let pause = pause.min(Self::MAX_PAUSE);
        self.pause = Some(self.pause.map_or(pause, |p| p.max(pause)));
        self
    }

    /// At most `units` are left now in group `group` (by index in the
    /// spec): the upstream's own remaining count. The smallest of two counts
    /// holds. A group past the most a spec can have
    /// ([`MAX_GROUPS`](crate::call::MAX_GROUPS)) is ignored.
    pub fn left(mut self, group: usize, units: u64) -> Self {
        merge(&mut self.left, group, units, u64::min);
        self
    }

    /// The upstream's limit for group `group` is `units` (its
    /// `x-ratelimit-limit-*` headers): what a budget that finds its limit
    /// ([`crate::upstream::Auto`]) takes as it is. The smallest of two holds; a group
    /// past [`MAX_GROUPS`](crate::call::MAX_GROUPS) is ignored.
    pub fn limit(mut self, group: usize, units: u64) -> Self {
        merge(&mut self.limit, group, units, u64::min);
        self
    }

    /// The upstream's count for group `group` resets in `resets_in` (its
    /// `x-ratelimit-reset-*` headers): the units it says are left
    /// ([`Hold::left`]) are all there is until then. With none left, the
    /// group is paused until the reset ([`Hold::paused_in`]); with some
    /// left, the reset is only recorded (the count bounds the budget now,
    /// which then refills at its own rate). The earliest of two resets
    /// holds; one past [`Hold::MAX_PAUSE`] is taken as that; a group past
    /// [`MAX_GROUPS`](crate::call::MAX_GROUPS) is ignored.
    pub fn reset(mut self, group: usize, resets_in: Duration) -> Self {
        merge(
            &mut self.reset,
            group,
            resets_in.min(Self::MAX_PAUSE),
            Duration::min,
        );
        self
    }

    /// The upstream's limit said for group `group`, if any.
    pub fn limit_in(&self, group: usize) -> Option<u64> {
        self.limit.get(group).copied().flatten()
    }

    /// The pause said for every group, if any.
    pub fn paused(&self) -> Option<Duration> {
        self.pause
    }

    /// The units said to be left in group `group`, if any.
    pub fn left_in(&self, group: usize) -> Option<u64> {
        self.left.get(group).copied().flatten()
    }

    /// When group `group`'s count resets, if said.
    pub fn reset_in(&self, group: usize) -> Option<Duration> {
        self.reset.get(group).copied().flatten()
    }

    /// How long group `group` is held paused: the longest of the pause said
    /// ([`Hold::paused`]) and, when nothing is left in it
    /// ([`Hold::left`] `0`), the time until its count resets
    /// ([`Hold::reset`]).
    pub fn paused_in(&self, group: usize) -> Option<Duration> {
        let until_reset = match self.left_in(group) {
            Some(0) => self.reset_in(group),
            _ => None,
        };
        match (self.pause, until_reset) {
            (Some(pause), Some(reset)) => Some(pause.max(reset)),
            (pause, reset) => pause.or(reset),
        }
    }

    /// Whether some group is held paused ([`Hold::paused_in`]).
    pub(crate) fn pauses(&self) -> bool {
        self.pause.is_some() || (0..self.left.len()).any(|group| self.paused_in(group).is_some())
    }

    /// This hold with its pause and its resets no longer than `max` (an
    /// upstream asking for a pause of days is not believed past it).
    pub fn capped(mut self, max: Duration) -> Self {
        self.pause = self.pause.map(|pause| pause.min(max));
        for reset in self.reset.iter_mut().flatten() {
            *reset = (*reset).min(max);
        }
        self
    }

    /// This hold without the counts left that are above zero: what a
    /// budget that finds its limit shares of an answer (the counts
    /// taught it the limit instead; written into its window as well, each
    /// one answered a moment after the budget admitted more, they would
    /// fill it with units the upstream never counted). A pause, a reset
    /// and a count of zero stay (a count of zero is written only where no
    /// pause holds the group, see [`Limiter::hold`]).
    pub(crate) fn without_room_left(mut self) -> Self {
        for left in &mut self.left {
            if left.is_some_and(|units| units > 0) {
                *left = None;
            }
        }
        self
    }

    /// Whether nothing was said.
    pub fn is_empty(&self) -> bool {
        self.holds_nothing()
            && self.limit.iter().all(Option::is_none)
            && self.reset.iter().all(Option::is_none)
    }

    /// Whether nothing was said that holds a budget (no pause, no count
    /// left; a limit or a reset said alone is for
    /// [`crate::upstream::Auto`]).
    fn holds_nothing(&self) -> bool {
        self.pause.is_none() && self.left.iter().all(Option::is_none)
    }
}

/// Sets group `group`'s value in `values` to `value`, or to `keep` of it and
/// the one there; a group past [`MAX_GROUPS`](crate::call::MAX_GROUPS) is
/// ignored.
fn merge<T: Copy>(
    values: &mut SmallVec<[Option<T>; 2]>,
    group: usize,
    value: T,
    keep: fn(T, T) -> T,
) {
    if group >= crate::limiter::spec::MAX_GROUPS {
        return;
    }
    if values.len() <= group {
        values.resize(group + 1, None);
    }
    let slot = &mut values[group];
    *slot = Some(slot.map_or(value, |there| keep(there, value)));
}

impl Limiter {
    /// Makes every instance sharing `spec`'s budgets for `keys` hear what
    /// the upstream said ([`Hold`]): each group of the call is held paused
    /// for [`Hold::paused_in`] (the pause said, or until the group's count
    /// resets when the upstream says nothing is left in it) and down to its
    /// [`Hold::left`] count (a count of zero only in a group no pause holds:
    /// the pause holds it), through the store (one operation per kind of
    /// hold and group), so every instance's next call sees it. A count with
    /// units left is held as it is now, and the budget refills at its own
    /// rate from there: its reset is recorded ([`Hold::reset_in`]), not
    /// held. Allow-listed groups and in-flight limits are left alone;
    /// nothing said, nothing done.
    ///
    /// A call of this process sleeping until a slot it reserved before the
    /// pause (a waiting call on GCRA or a bucket), inside it, reserves again
    /// and goes after the pause; the slot it had stays taken, as the pause
    /// took it. Another process does not hear the pause this way: its
    /// reserved calls go at their slots, and its next calls see the pause.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter, upstream::{Counts, Hold}};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().build()?;
    /// let chat = CallSpec::owned("chat", vec![
    ///     GroupSpec::owned("chat_rpm", vec![Limit::per_minute(500)?]),
    ///     GroupSpec::owned("chat_tpm", vec![Limit::per_minute(60_000)?]).settled(),
    /// ]);
    /// // The upstream answered 429, `retry-after: 2`.
    /// let said = Hold::from_headers([("retry-after", &b"2"[..])], &[Counts::Requests, Counts::Tokens]);
    /// limiter.hold(&chat, Keys::new(&[&"gpt", &"gpt"]), &said).await?;
    /// let refused = limiter.call_with(&chat, Keys::new(&[&"gpt", &"gpt"]).costs(&[1, 100])).await.unwrap_err();
    /// assert!(refused.retry_after().unwrap() > std::time::Duration::from_secs(1)); // most of the 2 s
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    ///
    /// The keys are read before this returns: the future borrows none of
    /// them (it is `Send` whatever form they take).
    ///
    /// # Errors
    /// [`Error::Limit`] when `keys` cannot be decided for `spec` (not one
    /// identity per group and one tier per tiered group, not one cost per
    /// group, a tier none of its group's),
    /// before anything is held; [`Error::Backend`] when the store fails a hold
    /// (the groups held before it stay held).
    pub fn hold<'a>(
        &'a self,
        spec: &'a CallSpec,
        keys: Keys<'_>,
        hold: &'a Hold,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send + 'a {
        let owned = if hold.holds_nothing() {
            Ok(None)
        } else {
            self.hold_attempt(spec, keys).map(Some)
        };
        async move {
            match owned? {
                Some(owned) => self.hold_groups(spec, &owned, hold, Instant::now()).await,
                None => Ok(()),
            }
        }
    }

    /// The attempt a hold applies to: `keys` checked and resolved.
    pub(crate) fn hold_attempt(
        &self,
        spec: &CallSpec,
        keys: Keys<'_>,
    ) -> Result<OwnedAttempt, Error> {
        if let Err(rejection) = keys.check(spec) {
            return Err(cannot_hold(spec, &rejection.to_string()));
        }
        keys.with_tiers(|tiers| {
            keys.with_identities(|identities| {
                resolve::with(self, spec, |resolved| {
                    Attempt::new(self, spec, resolved, identities, tiers, &[])
                        .map(|attempt| attempt.to_owned())
                        .map_err(|decided| match *decided {
                            Err(rejection) => cannot_hold(spec, &rejection.to_string()),
                            Ok(_) => cannot_hold(spec, "it was decided instead"),
                        })
                })
            })
        })
    }

    /// Holds each group of `owned` at `hold` (asked at `at`). A call of
    /// this process sleeping until a slot it reserved before, inside the
    /// pause, reserves again ([`Pauses`]).
    async fn hold_groups(
        &self,
        spec: &CallSpec,
        owned: &OwnedAttempt,
        hold: &Hold,
        at: Instant,
    ) -> Result<(), Error> {
        let attempt = owned.attempt();
        let mut paused: SmallVec<[(PausedKeys, Duration); 2]> = SmallVec::new();
        let resolved = attempt.resolved;
        for group in 0..resolved.groups.len() {
            if attempt.skipped & (1 << group) != 0 {
                continue;
            }
            let mut targets = Targets::new();
            if attempt.chosen.is_empty() {
                resolved.fill_targets(attempt.identities, &[], |i, _| i == group, &mut targets);
            } else {
                resolved.fill_tiered(
                    attempt.identities,
                    &[],
                    &attempt.chosen,
                    |i| i == group,
                    &mut targets,
                );
            }
            let targets = rate_targets(&targets);
            if targets.is_empty() {
                continue;
            }
            let pause = hold.paused_in(group);
            // A count of zero in a paused group is held by the pause: written
            // as a count too, it would hold a window past the pause (up to a
            // whole period), with units the upstream never counted.
            let holds = [
                pause.map(|pause| (micros(pause), 0)),
                hold.left_in(group)
                    .filter(|&left| left > 0 || pause.is_none())
                    .map(|left| (0, left)),
            ];
            for (after, left) in holds.into_iter().flatten() {
                let mut call = attempt.call(spec, Op::Hold { after, left }, &targets);
                applied(self.pipeline.run(&mut call, ALL).await)?;
            }
            if let Some(pause) = pause
                && micros(pause) > 0
            {
                paused.push((Pauses::keys(&targets), pause));
            }
        }
        for (keys, pause) in paused {
            self.pauses.heard(keys, at, pause);
        }
        Ok(())
    }
}

/// Why a hold could not be applied.
fn cannot_hold(spec: &CallSpec, why: &str) -> Error {
    Error::Limit(LimitError::BadCall(format!(
        "call `{}` cannot be held at its upstream's word: {why}",
        spec.name()
    )))
}

#[cfg(test)]
mod tests;
