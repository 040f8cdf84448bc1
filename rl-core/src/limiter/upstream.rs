//! What an upstream says about the budget a call drew on ([`Hold`]), and
//! how the limiter makes every instance sharing that budget hear it
//! ([`Limiter::hold`]): a pause until the upstream's `Retry-After`, and a
//! correction of the remaining amount down to the upstream's own count.

use std::time::{Duration, Instant, SystemTime};

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

/// What a group of a call counts, to read an upstream's rate-limit headers
/// for it ([`Hold::from_headers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counts {
    /// Requests: `x-ratelimit-remaining-requests`,
    /// `anthropic-ratelimit-requests-remaining`, `RateLimit: ..;r=N`,
    /// `RateLimit-Remaining`, `x-ratelimit-remaining`.
    Requests,
    /// Tokens: `x-ratelimit-remaining-tokens`,
    /// `anthropic-ratelimit-tokens-remaining`.
    Tokens,
    /// Nothing the upstream reports on (a limit of our own).
    Nothing,
}

/// What an upstream said about a budget a call drew on: a pause (its
/// `429`/`503` with `Retry-After`), and how much it says is left, per group
/// of the call's spec. [`Limiter::hold`] writes it into the budget every
/// instance shares, through the store: each state only ever goes up (a
/// budget already that full is left as it is).
///
/// ```
/// use ratewall::upstream::{Counts, Hold};
/// use std::time::Duration;
/// // A 429 with `retry-after: 20` and OpenAI-style remaining counts.
/// let headers = [
///     ("retry-after", &b"20"[..]),
///     ("x-ratelimit-remaining-requests", b"0"),
///     ("x-ratelimit-remaining-tokens", b"1200"),
/// ];
/// let hold = Hold::from_headers(headers, &[Counts::Requests, Counts::Tokens]);
/// assert_eq!(hold.paused(), Some(Duration::from_secs(20)));
/// assert_eq!(hold.left_in(0), Some(0));
/// assert_eq!(hold.left_in(1), Some(1200));
/// assert_eq!(Hold::new().pause(Duration::from_secs(5)).left(1, 10), Hold::new().left(1, 10).pause(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    pause: Option<Duration>,
    /// Units left now, per group (by index).
    left: SmallVec<[Option<u64>; 2]>,
    /// The upstream's own limit, per group (by index).
    limit: SmallVec<[Option<u64>; 2]>,
}

impl Hold {
    /// The longest pause a hold carries: one day (an upstream's daily
    /// quota spent). A longer one, said or given ([`Hold::pause`]), is held
    /// for this long; the upstream's next refusal pauses the budget again.
    /// No header value or duration can make a hold panic or overflow.
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
        at_most(&mut self.left, group, units);
        self
    }

    /// The upstream's limit for group `group` is `units` (its
    /// `x-ratelimit-limit-*` headers): what a budget that finds its limit
    /// ([`crate::upstream::Auto`]) takes as it is. The smallest of two holds; a group
    /// past [`MAX_GROUPS`](crate::call::MAX_GROUPS) is ignored.
    pub fn limit(mut self, group: usize, units: u64) -> Self {
        at_most(&mut self.limit, group, units);
        self
    }

    /// The upstream's limit said for group `group`, if any.
    pub fn limit_in(&self, group: usize) -> Option<u64> {
        self.limit.get(group).copied().flatten()
    }

    /// The pause said, if any.
    pub fn paused(&self) -> Option<Duration> {
        self.pause
    }

    /// The units said to be left in group `group`, if any.
    pub fn left_in(&self, group: usize) -> Option<u64> {
        self.left.get(group).copied().flatten()
    }

    /// This hold with its pause no longer than `max` (an upstream asking
    /// for a pause of days is not believed past it).
    pub fn capped(mut self, max: Duration) -> Self {
        self.pause = self.pause.map(|pause| pause.min(max));
        self
    }

    /// Whether nothing was said.
    pub fn is_empty(&self) -> bool {
        self.holds_nothing() && self.limit.iter().all(Option::is_none)
    }

    /// Whether nothing was said that holds a budget (no pause, no count
    /// left; a limit said is for [`crate::upstream::Auto`]).
    fn holds_nothing(&self) -> bool {
        self.pause.is_none() && self.left.iter().all(Option::is_none)
    }

    /// What an upstream's response headers say, for a spec whose groups
    /// count what `counts` says (one per group, in order; a group past its
    /// end counts [`Counts::Nothing`]). Names are matched without regard to
    /// case. Read: `Retry-After` (seconds, or an HTTP date), `retry-after-ms`;
    /// the remaining counts of [`Counts`]; the IETF `RateLimit` field's `r`
    /// (and `t`, a pause when `r=0`); the limits ([`Hold::limit`]):
    /// `x-ratelimit-limit-requests` / `-tokens`,
    /// `anthropic-ratelimit-requests-limit` / `-tokens-limit`,
    /// `RateLimit-Limit`, `x-ratelimit-limit` (requests), and the IETF
    /// `RateLimit-Policy` field's `q`. Values that cannot be read are
    /// ignored (logged at debug level).
    pub fn from_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
        counts: &[Counts],
    ) -> Self {
        let mut hold = Hold::new();
        let groups_counting = |what: Counts| {
            counts
                .iter()
                .enumerate()
                .filter(move |(_, c)| **c == what)
                .map(|(g, _)| g)
        };
        for (name, value) in headers {
            let Ok(value) = std::str::from_utf8(value) else {
                continue;
            };
            let value = value.trim();
            let name = name.to_ascii_lowercase();
            let remaining = match name.as_str() {
                "retry-after" => {
                    if let Some(pause) = retry_after(value) {
                        hold = hold.pause(pause);
                    }
                    continue;
                }
                "retry-after-ms" => {
                    if let Some(pause) = seconds(value, 1_000) {
                        hold = hold.pause(pause);
                    }
                    continue;
                }
                "ratelimit" => {
                    if let Some((left, reset)) = ietf_ratelimit(value) {
                        if left == 0
                            && let Some(reset) = reset
                        {
                            hold = hold.pause(reset);
                        }
                        for g in groups_counting(Counts::Requests) {
                            hold = hold.left(g, left);
                        }
                    }
                    continue;
                }
                "ratelimit-policy" => {
                    if let Some(quota) = ietf_quota(value) {
                        for g in groups_counting(Counts::Requests) {
                            hold = hold.limit(g, quota);
                        }
                    }
                    continue;
                }
                "x-ratelimit-remaining-requests"
                | "anthropic-ratelimit-requests-remaining"
                | "ratelimit-remaining"
                | "x-ratelimit-remaining" => (Counts::Requests, false),
                "x-ratelimit-remaining-tokens" | "anthropic-ratelimit-tokens-remaining" => {
                    (Counts::Tokens, false)
                }
                "x-ratelimit-limit-requests"
                | "anthropic-ratelimit-requests-limit"
                | "ratelimit-limit"
                | "x-ratelimit-limit" => (Counts::Requests, true),
                "x-ratelimit-limit-tokens" | "anthropic-ratelimit-tokens-limit" => {
                    (Counts::Tokens, true)
                }
                _ => continue,
            };
            match value.parse::<u64>() {
                Ok(units) => {
                    let (counts, is_limit) = remaining;
                    for g in groups_counting(counts) {
                        hold = if is_limit {
                            hold.limit(g, units)
                        } else {
                            hold.left(g, units)
                        };
                    }
                }
                Err(_) => {
                    tracing::debug!(header = name, value, "unreadable rate-limit header ignored")
                }
            }
        }
        hold
    }
}

/// Sets group `group`'s count in `counts` to at most `units` (the
/// smallest said holds); a group past [`MAX_GROUPS`](crate::call::MAX_GROUPS) is
/// ignored.
fn at_most(counts: &mut SmallVec<[Option<u64>; 2]>, group: usize, units: u64) {
    if group >= crate::limiter::spec::MAX_GROUPS {
        return;
    }
    if counts.len() <= group {
        counts.resize(group + 1, None);
    }
    let count = &mut counts[group];
    *count = Some(count.map_or(units, |u| u.min(units)));
}

/// `Retry-After`: delay-seconds (fractions read too), or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    if let Some(pause) = seconds(value, 1) {
        return Some(pause);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A non-negative number of `1 / per_second` seconds, fractions allowed.
fn seconds(value: &str, per_second: u32) -> Option<Duration> {
    let number: f64 = value.parse().ok()?;
    (number.is_finite() && number >= 0.0)
        .then(|| Duration::try_from_secs_f64(number / f64::from(per_second)).ok())
        .flatten()
}

/// The IETF `RateLimit` field (`"default";r=50;t=30`): the first item's
/// remaining `r` and reset `t` (seconds).
fn ietf_ratelimit(value: &str) -> Option<(u64, Option<Duration>)> {
    let first = value.split(',').next()?;
    let mut remaining = None;
    let mut reset = None;
    for parameter in first.split(';').skip(1) {
        let Some((key, value)) = parameter.trim().split_once('=') else {
            continue;
        };
        match key.trim() {
            "r" => remaining = value.trim().parse::<u64>().ok(),
            "t" => reset = seconds(value.trim(), 1),
            _ => {}
        }
    }
    Some((remaining?, reset))
}

/// The IETF `RateLimit-Policy` field (`"default";q=100;w=60`): the first
/// item's quota `q`.
fn ietf_quota(value: &str) -> Option<u64> {
    let first = value.split(',').next()?;
    first.split(';').skip(1).find_map(|parameter| {
        let (key, value) = parameter.trim().split_once('=')?;
        (key.trim() == "q")
            .then(|| value.trim().parse::<u64>().ok())
            .flatten()
    })
}

impl Limiter {
    /// Makes every instance sharing `spec`'s budgets for `keys` hear what
    /// the upstream said ([`Hold`]): each group of the call is held paused
    /// for [`Hold::pause`] and down to its [`Hold::left`] count, through the
    /// store (one operation per kind of hold and group), so every instance's
    /// next call sees it. Allow-listed groups and in-flight limits are left
    /// alone; nothing said, nothing done.
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
    /// assert!(refused.retry_after().unwrap() > std::time::Duration::from_millis(1_900));
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
        let mut paused = PausedKeys::new();
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
            let holds = [
                hold.pause.map(|pause| (micros(pause), 0)),
                hold.left_in(group).map(|left| (0, left)),
            ];
            for (after, left) in holds.into_iter().flatten() {
                let mut call = attempt.call(spec, Op::Hold { after, left }, &targets);
                applied(self.pipeline.run(&mut call, ALL).await)?;
                if after > 0 {
                    paused.extend(Pauses::keys(&targets));
                }
            }
        }
        if let Some(pause) = hold.pause
            && !paused.is_empty()
        {
            self.pauses.heard(paused, at, pause);
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
mod tests {
    use super::*;

    fn read(headers: &[(&str, &str)], counts: &[Counts]) -> Hold {
        Hold::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), counts)
    }

    const LLM: [Counts; 2] = [Counts::Requests, Counts::Tokens];

    #[test]
    fn retry_after_is_read_in_seconds_fractions_milliseconds_and_http_dates() {
        assert_eq!(
            read(&[("Retry-After", "20")], &LLM).paused(),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            read(&[("retry-after", "1.5")], &LLM).paused(),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(
            read(&[("retry-after-ms", "250")], &LLM).paused(),
            Some(Duration::from_millis(250))
        );
        let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(61));
        let pause = read(&[("retry-after", &in_a_minute)], &LLM)
            .paused()
            .unwrap();
        assert!(
            pause > Duration::from_secs(55) && pause <= Duration::from_secs(61),
            "{pause:?}"
        );
        let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(600));
        assert_eq!(
            read(&[("retry-after", &past)], &LLM).paused(),
            Some(Duration::ZERO)
        );
        // The longest of two says.
        let both = read(&[("retry-after", "2"), ("retry-after-ms", "3500")], &LLM);
        assert_eq!(both.paused(), Some(Duration::from_millis(3_500)));
    }

    #[test]
    fn remaining_counts_go_to_the_groups_that_count_them() {
        let openai = read(
            &[
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-remaining-tokens", "149984"),
            ],
            &LLM,
        );
        assert_eq!(
            (openai.left_in(0), openai.left_in(1)),
            (Some(59), Some(149_984))
        );
        let anthropic = read(
            &[
                ("anthropic-ratelimit-requests-remaining", "3"),
                ("anthropic-ratelimit-tokens-remaining", "900"),
            ],
            &[Counts::Tokens, Counts::Nothing, Counts::Requests],
        );
        assert_eq!(
            (
                anthropic.left_in(0),
                anthropic.left_in(1),
                anthropic.left_in(2)
            ),
            (Some(900), None, Some(3))
        );
        let ietf = read(
            &[("RateLimit", "\"default\";r=0;t=30, \"daily\";r=100;t=3600")],
            &LLM,
        );
        assert_eq!(
            (ietf.left_in(0), ietf.paused()),
            (Some(0), Some(Duration::from_secs(30)))
        );
        assert_eq!(
            read(&[("RateLimit-Remaining", "7")], &LLM).left_in(0),
            Some(7)
        );
        let limits = read(
            &[
                ("x-ratelimit-limit-requests", "600"),
                ("x-ratelimit-limit-tokens", "60000"),
            ],
            &LLM,
        );
        assert_eq!(
            (limits.left_in(1), limits.limit_in(0), limits.limit_in(1)),
            (None, Some(600), Some(60_000))
        );
        assert!(!limits.is_empty() && limits.holds_nothing());
        let anthropic_limits = read(
            &[
                ("anthropic-ratelimit-tokens-limit", "80000"),
                (
                    "RateLimit-Policy",
                    "\"burst\";q=100;w=60, \"day\";q=1000;w=86400",
                ),
            ],
            &LLM,
        );
        assert_eq!(
            (anthropic_limits.limit_in(0), anthropic_limits.limit_in(1)),
            (Some(100), Some(80_000))
        );
        // A parameter without a value is skipped, not the field.
        let flagged = read(&[("ratelimit", "\"default\";r=4;partial;t=9")], &LLM);
        assert_eq!(flagged.left_in(0), Some(4));
    }

    #[test]
    fn what_cannot_be_read_says_nothing() {
        for (name, value) in [
            ("retry-after", "soon"),
            ("retry-after", "-3"),
            ("retry-after-ms", "NaN"),
            ("x-ratelimit-remaining-tokens", "lots"),
            ("ratelimit", "\"default\";t=30"),
            ("x-unrelated", "5"),
            ("x-ratelimit-limit-tokens", "-1"),
            ("ratelimit-policy", "\"default\";w=60"),
        ] {
            assert!(read(&[(name, value)], &LLM).is_empty(), "{name}: {value}");
        }
        let invalid_utf8 = Hold::from_headers([("retry-after", &[0xff, 0xfe][..])], &LLM);
        assert!(invalid_utf8.is_empty());
        assert!(
            read(
                &[("x-ratelimit-remaining-tokens", "5")],
                &[Counts::Requests]
            )
            .is_empty()
        );
        assert!(Hold::new().left(usize::MAX, 3).is_empty(), "no such group");
        let long = Hold::new()
            .pause(Duration::from_secs(86_400))
            .capped(Duration::from_secs(300));
        assert_eq!(long.paused(), Some(Duration::from_secs(300)));
    }
}
