//! Finding an upstream's limit ([`Auto`], [`Limiter::learn`]): a budget
//! whose stated limits are a starting point, scaled by what every instance
//! learns of the upstream and shares through the store
//! ([`crate::backend::Backend::adjust`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::layer::{ALL, Answer};
use crate::limiter::Limiter;
use crate::limiter::attempt::OwnedAttempt;
use crate::limiter::call::Keys;
use crate::limiter::resolve::Targets;
use crate::limiter::settle::rate_targets;
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::Hold;
use crate::model::decision::Decision;
use crate::model::error::{Error, LimitError};
use crate::model::learned::{Adjust, SCALE_CEILING, SCALE_FLOOR, SCALE_ONE};
use crate::model::limit::Limit;
use crate::store::Store;
use crate::store::target::Op;

/// How a budget finds its upstream's limit: its groups' stated limits are
/// where it starts and the most it goes to; each answer of the upstream,
/// heard through [`Limiter::learn`], moves one scale per group that every
/// instance shares through the store, the way TCP CUBIC finds a link's
/// capacity: fast far from the last known limit, a plateau near it.
///
/// - The upstream **says** its limit (`x-ratelimit-limit-*`, see
///   [`Hold::limit`]): the group's first rate limit becomes that, times
///   [`Auto::margin`] (other limits of the group in proportion; the
///   upstream's count is taken for that limit's period). While it says its
///   limit, refusals do not lower it (its remaining counts,
///   [`Limiter::hold`], bound the budget then).
/// - It **refuses** (`429`/`503`) with a pause `p` (`Retry-After`) shorter
///   than the first limit's period: the budget reads, in the store, how many
///   units its own window will still hold `p` from now (the refused call's
///   own cost still in it) — what the upstream counts when it has room
///   for that call again — and takes that as the upstream's limit: the
///   **ceiling** (when they hold at least a tenth of its limit then: a
///   refusal the budget's own calls cannot explain is not read as one). The
///   scale goes to [`Auto::headroom`] of it, never lower: a refusal a burst drew in a
///   window whose count was right does not cut the budget below that
///   count, and a limit halved under a full window is found from what the
///   window will hold when the upstream frees room. A refusal without a
///   usable pause (none, or one past the period: a quota of another
///   window) keeps [`Auto::keep`] of the scale and takes the scale that
///   drew it as the ceiling. Once per pause (the refusals of one overload
///   lower it once: the later ones read a count the first one's pause
///   changed), down to [`Auto::floor`]. When one refusal
///   is about several groups (none has room for the call), the pause is
///   the time until the last of them has room, and another group's count
///   then says less than its limit: groups refused together are taken as
///   lowered alike, each to at least the largest share of its stated limit
///   its peers' counts say, and at most what it holds now. The client
///   integrations give a refused call back in every group of such a budget
///   (the upstream never counted it), so a refusal after the pause reads a
///   count without the calls the upstream refused before it. A group the refusal was not
///   about (the upstream says it still has room for the call's cost in
///   it) is not lowered: what it says is left is heard as below.
/// - It **says how much is left** (`x-ratelimit-remaining-*`, the IETF
///   `r`), accepting: the budget's count now plus what is left is the
///   upstream's limit, found without a refusal; the ceiling becomes that,
///   and a scale above [`Auto::headroom`] of it comes down (at most once per
///   [`Auto::every`] per instance and group: one store read each).
/// - It **accepts**, saying nothing: at most once per [`Auto::every`]
///   across all instances, the scale climbs toward [`Auto::headroom`] of
///   the ceiling by [`Auto::approach`] of the gap and stops there, below the
///   level that drew the refusal, for [`Auto::believe_for`] (10 minutes by
///   default: a steady demand meets no refusal in that time). With no
///   ceiling believed it probes upward by [`Auto::raise`] of the scale per
///   [`Auto::every`], up to the stated limits.
///
/// The budget's count is the upstream's when its first limit counts like
/// the upstream does: a window algorithm of the upstream's period (a
/// `sliding_window` for a sliding window, with the upstream's buckets as
/// slots), shared by every instance that calls it.
///
/// Each instance applies the shared scale to its own limits of the group
/// (as [`Settings::set_limits`](crate::settings::Settings::set_limits)
/// would, logged at debug level) when it hears an answer, and reads it at
/// least once per [`Auto::every`] while its calls are answered; an instance
/// its budget refuses (paused by another one's refusal) reads it with
/// [`Limiter::refresh_learned`] before it calls again, as the client layer
/// does. In-flight limits are left as stated; a tiered group has no limits
/// of its own and is left alone. The learned limits replace a runtime
/// override of the group: scaling starts from the compiled-in (stated)
/// ones.
///
/// ```
/// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter, upstream::{Auto, Hold}};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().build()?;
/// let spec = CallSpec::owned("llm", vec![GroupSpec::owned("llm_tpm", vec![Limit::per_minute(240_000)?])]);
/// let auto = Auto::new();
/// let keys = || Keys::new(&[&"gpt"]);
/// // The upstream refused with no pause said: the budget keeps 70 %.
/// limiter.learn(&spec, keys(), &auto, false, &Hold::new()).await?;
/// assert_eq!(limiter.settings().limits("llm_tpm").unwrap()[0].threshold(), 168_000);
/// // It says its limit: 60 000 tokens a minute.
/// limiter.learn(&spec, keys(), &auto, true, &Hold::new().limit(0, 60_000)).await?;
/// assert_eq!(limiter.settings().limits("llm_tpm").unwrap()[0].threshold(), 60_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Debug)]
pub struct Auto {
    keep: u64,
    raise: u64,
    approach: u64,
    headroom: u64,
    believe_for: Duration,
    every: Duration,
    margin: u64,
    floor: u64,
    /// Per group name: the scale this instance applies, when it last read
    /// the shared one, and when it last heard a remaining count.
    known: Mutex<HashMap<Arc<str>, Known>>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    scale: u64,
    read_at: Instant,
    found_at: Option<Instant>,
}

impl Default for Auto {
    fn default() -> Self {
        Self::new()
    }
}

/// A share in `(0, 1]` as parts per million, or why not.
fn share(what: &str, value: f64, zero_ok: bool) -> Result<u64, LimitError> {
    let ok = value.is_finite() && value <= 1.0 && (value > 0.0 || (zero_ok && value == 0.0));
    if !ok {
        return Err(LimitError::BadCall(format!(
            "auto: {what} must be a share in {} 1], got {value}",
            if zero_ok { "[0," } else { "(0," }
        )));
    }
    Ok((value * SCALE_ONE as f64).round() as u64)
}

impl Auto {
    /// Keeps 70 % on a refusal without an estimate, stays 5 % under a
    /// found limit (believed 10 minutes), closes a quarter of the gap to it
    /// per second, probes 1 % of the scale per second when none is
    /// believed, takes a said limit as it is (margin 1), never below 1 % of
    /// the stated limits.
    pub fn new() -> Self {
        Self {
            keep: 700_000,
            raise: 10_000,
            approach: 250_000,
            headroom: 950_000,
            believe_for: Duration::from_secs(600),
            every: Duration::from_secs(1),
            margin: SCALE_ONE,
            floor: 10_000,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The share of the scale a refusal without an estimate keeps (in
    /// `(0, 1]`; default 0.7).
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `(0, 1]`.
    pub fn keep(mut self, share_kept: f64) -> Result<Self, LimitError> {
        self.keep = share("keep", share_kept, false)?;
        Ok(self)
    }

    /// The share of the scale added per [`Auto::every`] while probing: the
    /// upstream accepts and no found limit is believed (in `[0, 1]`;
    /// default 0.01).
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `[0, 1]`.
    pub fn raise(mut self, share_added: f64) -> Result<Self, LimitError> {
        self.raise = share("raise", share_added, true)?;
        Ok(self)
    }

    /// The share of the gap to [`Auto::headroom`] of a believed limit the
    /// scale closes per [`Auto::every`] (in `[0, 1]`; default 0.25): fast
    /// far below it, slowly near it.
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `[0, 1]`.
    pub fn approach(mut self, share_closed: f64) -> Result<Self, LimitError> {
        self.approach = share("approach", share_closed, true)?;
        Ok(self)
    }

    /// The share of a found limit (by a refusal, or by what the upstream
    /// says is left) the budget stays at or under (in `(0, 1]`; default
    /// 0.95): room for the calls decided but not yet counted by the
    /// upstream, and for a window counted a little unlike the upstream's.
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `(0, 1]`.
    pub fn headroom(mut self, share_kept: f64) -> Result<Self, LimitError> {
        self.headroom = share("headroom", share_kept, false)?;
        Ok(self)
    }

    /// How long a found limit is believed (default 10 minutes): the scale
    /// stays under it that long, then probes upward again (and a lower
    /// limit is found again by the refusal the probe draws).
    pub fn believe_for(mut self, believe_for: Duration) -> Self {
        self.believe_for = believe_for;
        self
    }

    /// How often the scale is raised (across all instances) and read by
    /// each instance (default 1 s).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// The share of a said limit the budget takes (in `(0, 1]`; default 1:
    /// e.g. 0.98 leaves 2 % to calls this budget does not see).
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `(0, 1]`.
    pub fn margin(mut self, share_taken: f64) -> Result<Self, LimitError> {
        self.margin = share("margin", share_taken, false)?;
        Ok(self)
    }

    /// The least share of the stated limits a budget keeps (in `(0, 1]`;
    /// default 0.01): a call's cost must fit it, or it is refused as
    /// invalid.
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for a share outside `(0, 1]`.
    pub fn floor(mut self, least: f64) -> Result<Self, LimitError> {
        self.floor = share("floor", least, false)?;
        Ok(self)
    }

    /// The scale this instance applies to `group`'s stated limits, in parts
    /// per million ([`crate::upstream::SCALE_ONE`]: as stated), if it
    /// learned one.
    pub fn scale(&self, group: &str) -> Option<u64> {
        self.known.lock().get(group).map(|k| k.scale)
    }

    fn known(&self, group: &str) -> Option<Known> {
        self.known.lock().get(group).copied()
    }

    /// How often an instance reads a group's shared scale at most
    /// ([`Auto::every`]).
    pub(crate) fn every_read(&self) -> Duration {
        self.every
    }

    /// Whether this instance last read `group`'s scale [`Auto::every`] or
    /// more ago (or never).
    fn due(&self, group: &str) -> bool {
        self.known(group)
            .is_none_or(|k| k.read_at.elapsed() >= self.every)
    }

    /// Whether this instance last heard a remaining count for `group`
    /// [`Auto::every`] or more ago (or never).
    fn found_due(&self, group: &str) -> bool {
        self.known(group)
            .and_then(|k| k.found_at)
            .is_none_or(|at| at.elapsed() >= self.every)
    }

    /// A raise, as this budget makes them.
    fn raising(&self) -> Adjust {
        Adjust::Raise {
            step: self.raise,
            approach: self.approach,
            headroom: self.headroom,
            every: self.every,
            believe_for: self.believe_for,
        }
    }

    /// A refusal's lowering, with the estimate of the upstream's limit its
    /// count gave (parts per million; 0: none), after a pause of `pause`.
    fn lowering(&self, estimate: u64, pause: Duration) -> Adjust {
        Adjust::Lower {
            keep: self.keep,
            estimate,
            headroom: self.headroom,
            cooldown: pause.max(self.every),
            floor: self.floor,
        }
    }

    /// The scale an upstream's said limit `said` sets for a group whose
    /// first stated limit is `first`.
    fn said_scale(&self, first: &Limit, said: u64) -> u64 {
        let scale = (u128::from(said) * u128::from(self.margin)
            / u128::from(first.threshold().max(1)))
        .min(u128::from(SCALE_CEILING)) as u64;
        scale.max(SCALE_FLOOR)
    }
}

/// What [`Limiter::learn`] does for one group, before asking the store.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Nothing now.
    Nothing,
    /// This change, as it is.
    Adjust(Adjust),
    /// A refusal with a usable pause: the budget's count `pause` from now
    /// is the estimate (the refused call's own cost still in it: what the
    /// upstream will have room for then).
    Refused { pause: Duration },
    /// The upstream has `left` units now: the budget's count now, plus
    /// them, is the estimate.
    Left { left: u64 },
}

/// What a group's own count says after a refusal ([`Limiter::learn`]).
#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// The units it holds when the upstream has room again (the estimate).
    units: u64,
    /// Its first limit's capacity now.
    capacity: u64,
    /// The units it holds now (the refused call's among them), when read.
    now: Option<u64>,
}

impl Refusal {
    /// Whether the budget's own calls explain the refusal: they hold at
    /// least a tenth of its limit when the upstream has room again.
    fn explains(&self) -> bool {
        self.units.saturating_mul(10) >= self.capacity
    }
}

/// `units` of a group whose first stated limit is `first`, as a scale in
/// parts per million (at least one part).
fn scale_of(units: u64, first: &Limit) -> u64 {
    let scale = u128::from(units) * u128::from(SCALE_ONE) / u128::from(first.capacity().max(1));
    u64::try_from(scale)
        .unwrap_or(u64::MAX)
        .clamp(1, SCALE_CEILING)
}

/// The units a decision says are taken now: its limit's capacity less what
/// remains (a window's count, a bucket's level).
fn taken(decision: &Decision) -> u64 {
    decision.limit().saturating_sub(decision.remaining())
}

/// `stated` scaled by `scale` parts per million, rounded (thresholds and
/// bursts at least 1; in-flight limits as stated; a lease that no longer
/// fits the scaled capacity is dropped). Fails for a scale the limits
/// cannot take (e.g. a sliding log past its most entries).
fn scaled(stated: &[Limit], scale: u64) -> Result<Vec<Limit>, LimitError> {
    let times = |n: u64| {
        let scaled =
            (u128::from(n) * u128::from(scale) + u128::from(SCALE_ONE / 2)) / u128::from(SCALE_ONE);
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    };
    stated
        .iter()
        .map(|limit| {
            if limit.is_in_flight() {
                return Ok(*limit);
            }
            let bare = limit.without_lease();
            let burst = times(bare.burst());
            let mut scaled = bare.with_threshold(times(bare.threshold()))?;
            if scaled.burst() != burst {
                scaled = scaled.with_burst(burst)?;
            }
            Ok(match limit.lease() {
                Some(lease) => scaled.with_lease(lease).unwrap_or(scaled),
                None => scaled,
            })
        })
        .collect()
}

impl Limiter {
    /// Hears one answer of the upstream `spec`'s budget stands for, for a
    /// budget that finds its limit ([`Auto`]), drawn on for `keys` (the
    /// identities and costs the call was made with): `accepted` is whether
    /// the upstream took the call (not a `429`/`503`), `said` what its
    /// headers said ([`Hold::from_headers`]: its limits, its pause, what it
    /// has left). Each group's shared scale is adjusted or read in the
    /// store, after reading the budget's own count where an estimate needs
    /// it (see [`Auto`]), and applied to this instance's limits of the
    /// group. Answers how many store operations it made. Pausing the budget
    /// is [`Limiter::hold`]'s: learn before holding what the upstream said
    /// (a hold changes the count read), from a refusal before settling the
    /// refused call (its cost is part of the count read), from an accepted
    /// call after settling it (its real cost is).
    ///
    /// # Errors
    /// [`Error::Limit`] when `keys` do not fit `spec`, or a learned scale is
    /// one the group's limits cannot take; [`Error::Backend`] when the
    /// store cannot keep a learned scale (a custom
    /// [`crate::backend::Backend`] without
    /// [`crate::backend::Backend::adjust`]) or cannot be reached. Groups
    /// adjusted before the failing one keep their new scale; the failing
    /// group and those after it are left as they were.
    pub fn learn<'a>(
        &'a self,
        spec: &'a CallSpec,
        keys: Keys<'_>,
        auto: &'a Auto,
        accepted: bool,
        said: &Hold,
    ) -> impl std::future::Future<Output = Result<usize, Error>> + Send + 'a {
        // Everything the keys say is read here: the future borrows none of
        // them (it is `Send` whatever form they take).
        let costs = keys.given_costs();
        let steps: Vec<Step> = spec
            .groups()
            .iter()
            .enumerate()
            .map(|(index, group)| {
                let Some(first) = group.limits().iter().find(|l| !l.is_in_flight()) else {
                    return Step::Nothing;
                };
                let name = group.name();
                let cost = costs.get(index).copied().unwrap_or(group.cost());
                if let Some(limit) = said.limit_in(index) {
                    let scale = auto.said_scale(first, limit);
                    return match auto.known(name) {
                        Some(k) if k.scale == scale => Step::Nothing,
                        _ => Step::Adjust(Adjust::Set { scale }),
                    };
                }
                let left = said.left_in(index);
                if !accepted {
                    return match (left, said.paused()) {
                        // Room left for the call here: not this group's refusal.
                        (Some(left), _) if left >= cost => Step::Left { left },
                        (_, Some(pause)) if pause < first.period() => Step::Refused { pause },
                        (_, pause) => Step::Adjust(auto.lowering(0, pause.unwrap_or_default())),
                    };
                }
                match left {
                    Some(left) if auto.found_due(name) => Step::Left { left },
                    _ if auto.due(name) => Step::Adjust(auto.raising()),
                    _ => Step::Nothing,
                }
            })
            .collect();
        let needs_count = steps
            .iter()
            .any(|s| matches!(s, Step::Refused { .. } | Step::Left { .. }));
        let owned = needs_count
            .then(|| self.hold_attempt(spec, keys))
            .transpose();
        async move {
            let owned = owned?;
            let mut operations = 0;
            // The refused groups' counts first: groups refused together are
            // read together (see `together`).
            let mut refusals: Vec<Option<Refusal>> = vec![None; steps.len()];
            for (index, step) in steps.iter().enumerate() {
                if let (Step::Refused { pause }, Some(owned)) = (*step, owned.as_ref()) {
                    let (refusal, reads) = self.refused_count(spec, owned, index, pause).await;
                    operations += reads;
                    refusals[index] = refusal;
                }
            }
            let together = self
                .together(spec, owned.as_ref(), &mut refusals, &mut operations)
                .await;
            let mut adjusts = Vec::with_capacity(steps.len());
            for (index, step) in steps.iter().enumerate() {
                let first = spec.groups()[index]
                    .limits()
                    .iter()
                    .find(|l| !l.is_in_flight());
                let adjust = match (*step, owned.as_ref(), first) {
                    (Step::Adjust(adjust), _, _) => Some(adjust),
                    (Step::Refused { pause }, Some(_), Some(first)) => {
                        let estimate = match refusals[index] {
                            Some(refusal) if refusal.explains() => {
                                let own = scale_of(refusal.units, first);
                                // Never above what the group holds now: the
                                // upstream refused it there.
                                let most = refusal.now.map_or(own, |now| scale_of(now, first));
                                own.max(together.min(most))
                            }
                            _ => 0,
                        };
                        Some(auto.lowering(estimate, pause))
                    }
                    (Step::Left { left }, Some(owned), Some(first)) => {
                        operations += 1;
                        self.count_of(spec, owned, index, Duration::ZERO)
                            .await
                            .map(|(units, _)| Adjust::Found {
                                estimate: scale_of(units.saturating_add(left), first),
                                headroom: auto.headroom,
                            })
                    }
                    _ => None,
                };
                adjusts.push(adjust);
            }
            let found: Vec<bool> = steps
                .iter()
                .map(|s| matches!(s, Step::Left { .. }))
                .collect();
            operations += self
                .adjust_learned(spec, auto, |index, _, _| adjusts[index], &found)
                .await?;
            Ok(operations)
        }
    }

    /// The share of its stated limit the upstream's limit is at least, for
    /// every group one refusal was about, when it was about more than one
    /// (parts per million; 0 otherwise). The upstream's `Retry-After` is
    /// the time until its *last* refused group has room: that group's count
    /// then is its limit, but another group had room earlier, and its count
    /// then says less than its limit. Groups refused together are taken to
    /// have been lowered together: each is at least the largest share its
    /// peers' counts say, and at most what it holds now (read here when
    /// the pause was too short to read it before).
    async fn together(
        &self,
        spec: &CallSpec,
        owned: Option<&OwnedAttempt>,
        refusals: &mut [Option<Refusal>],
        operations: &mut usize,
    ) -> u64 {
        let explained = refusals.iter().flatten().filter(|r| r.explains()).count();
        let Some(owned) = owned.filter(|_| explained > 1) else {
            return 0;
        };
        let mut share = 0;
        for (index, refusal) in refusals.iter_mut().enumerate() {
            let Some(refusal) = refusal.as_mut().filter(|r| r.explains()) else {
                continue;
            };
            let Some(first) = spec.groups()[index]
                .limits()
                .iter()
                .find(|l| !l.is_in_flight())
            else {
                continue;
            };
            if refusal.now.is_none() {
                *operations += 1;
                refusal.now = self
                    .count_of(spec, owned, index, Duration::ZERO)
                    .await
                    .map(|(units, _)| units);
            }
            share = share.max(scale_of(refusal.units, first));
        }
        share
    }

    /// What the budget's own count says of the upstream's limit, after a
    /// refusal asking for `pause`: the units group `index` will hold when
    /// the upstream has room again, its capacity and, for a pause in whole
    /// seconds, what it holds now; and how many store reads that took. A
    /// `Retry-After` in whole seconds is rounded up by
    /// its server: the upstream has room some time in the second before
    /// `pause` ends, and the limit is between what the window holds then
    /// and what it holds at the second's start. Which end: when none of the
    /// window's units leave between now and that second (they are all
    /// younger than the window: the budget sent its whole count lately, as
    /// when its limits were stated too high), the refusal came as the
    /// upstream's count reached its limit, and the count at the second's
    /// start (at most the count now) is the limit; otherwise older units
    /// leave first (a limit lowered under a full window) and the count at
    /// the end is (what the upstream holds when it admits again).
    async fn refused_count(
        &self,
        spec: &CallSpec,
        owned: &OwnedAttempt,
        index: usize,
        pause: Duration,
    ) -> (Option<Refusal>, usize) {
        let then = self.count_of(spec, owned, index, pause).await;
        let second = Duration::from_secs(1);
        let refusal = |(units, capacity): (u64, u64), now| Refusal {
            units,
            capacity,
            now,
        };
        if pause < second || pause.subsec_nanos() != 0 {
            return (then.map(|then| refusal(then, None)), 1);
        }
        let before = self.count_of(spec, owned, index, pause - second).await;
        let now = self.count_of(spec, owned, index, Duration::ZERO).await;
        let at_now = now.map(|(units, _)| units);
        match (then, before, now) {
            // Under 2 % of the count leaves before the second: all young.
            (Some(_), Some((before, capacity)), Some((now, _)))
                if now.saturating_sub(before).saturating_mul(50) <= now =>
            {
                (Some(refusal((before.min(now), capacity), at_now)), 3)
            }
            _ => (then.map(|then| refusal(then, at_now)), 3),
        }
    }

    /// The units group `index` of `owned`'s call holds `ahead` from now in
    /// its first rate limit, and that limit's capacity now, as the store
    /// decides it (a peek: nothing is taken), or `None` when the store
    /// cannot tell (logged).
    async fn count_of(
        &self,
        spec: &CallSpec,
        owned: &OwnedAttempt,
        index: usize,
        ahead: Duration,
    ) -> Option<(u64, u64)> {
        let attempt = owned.attempt();
        if attempt.skipped & (1 << index) != 0 {
            return None;
        }
        let mut targets = Targets::new();
        if attempt.chosen.is_empty() {
            attempt.resolved.fill_targets(
                attempt.identities,
                attempt.costs,
                |i, _| i == index,
                &mut targets,
            );
        } else {
            attempt.resolved.fill_tiered(
                attempt.identities,
                attempt.costs,
                &attempt.chosen,
                |i| i == index,
                &mut targets,
            );
        }
        let targets = rate_targets(&targets);
        let first = targets.first()?;
        let one = [*first];
        let ahead = crate::model::clock::micros(ahead);
        let mut call = attempt.call(spec, Op::Peek(ahead), &one);
        call.every_decision = true;
        match self.pipeline.run(&mut call, ALL).await {
            Answer::Decided { decisions, .. } | Answer::Shadowed { decisions, .. } => {
                decisions.iter().next().map(|d| (taken(d), d.limit()))
            }
            Answer::Failed(error) | Answer::FailedOpen(error) | Answer::Unavailable(error) => {
                tracing::debug!(call = spec.name(), %error, "the budget's count could not be read; learning without it");
                None
            }
            _ => None,
        }
    }

    /// Reads each of `spec`'s shared scales that this instance last read
    /// [`Auto::every`] or more ago (one store read per such group) and
    /// applies it, as [`Limiter::learn`] does after an answer. Call it when
    /// the budget itself refused a call, before trying again: an instance
    /// whose calls were all answered before another one heard the upstream
    /// refuse (and paused the budget, [`Limiter::hold`]) hears no answer
    /// during the pause, and would otherwise resume with the limits it had
    /// before it, until its first answer. Answers how many store
    /// operations it made.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter, backend::{Backend, MemoryBackend}, upstream::{Auto, Hold}};
    /// use std::sync::Arc;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // Two instances sharing one store.
    /// let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    /// let (one, other) = (
    ///     Limiter::builder().shared_backend(store.clone()).build()?,
    ///     Limiter::builder().shared_backend(store).build()?,
    /// );
    /// let spec = CallSpec::owned("llm", vec![GroupSpec::owned("llm_tpm", vec![Limit::per_minute(240_000)?])]);
    /// let (heard, resumed) = (Auto::new(), Auto::new());
    /// // One instance hears the upstream say its limit; the other heard nothing.
    /// one.learn(&spec, Keys::new(&[&"gpt"]), &heard, true, &Hold::new().limit(0, 60_000)).await?;
    /// assert_eq!(resumed.scale("llm_tpm"), None);
    /// other.refresh_learned(&spec, &resumed).await?;
    /// assert_eq!(other.settings().limits("llm_tpm").unwrap()[0].threshold(), 60_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    ///
    /// # Errors
    /// As [`Limiter::learn`]'s.
    pub async fn refresh_learned(&self, spec: &CallSpec, auto: &Auto) -> Result<usize, Error> {
        self.adjust_learned(
            spec,
            auto,
            |_, name, _| auto.due(name).then_some(Adjust::Read),
            &[],
        )
        .await
    }

    /// Asks the store for each of `spec`'s groups' `adjust` (given the
    /// group's index, name and first rate limit; `None`: nothing to ask)
    /// and applies the scale it answers to this instance's limits; a group
    /// marked in `found` records that a remaining count was heard now.
    async fn adjust_learned(
        &self,
        spec: &CallSpec,
        auto: &Auto,
        adjust: impl Fn(usize, &str, &Limit) -> Option<Adjust>,
        found: &[bool],
    ) -> Result<usize, Error> {
        let mut operations = 0;
        for (index, group) in spec.groups().iter().enumerate() {
            let stated = group.limits();
            let Some(first) = stated.iter().find(|l| !l.is_in_flight()) else {
                continue;
            };
            let name = group.name();
            let Some(adjust) = adjust(index, name, first) else {
                continue;
            };
            let scale = match &self.pipeline.store {
                Store::Memory(memory) => memory.adjust_sync(&self.prefix, name, adjust),
                Store::Remote(backend) => backend
                    .adjust(&self.prefix, name, adjust)
                    .await
                    .map_err(Error::Backend)?,
            };
            operations += 1;
            // Applied under the lock, so `known` says what is applied; a
            // scale the limits cannot take is not recorded (asked again).
            let mut known = auto.known.lock();
            let before = known.get(name).copied();
            if before.map(|k| k.scale) != Some(scale) || self.registry.limits(name).is_none() {
                let limits = scaled(stated, scale).map_err(Error::Limit)?;
                tracing::debug!(limit = name, scale, ?adjust, "learned limit applied");
                self.settings().apply_learned(name, limits)?;
            }
            let now = Instant::now();
            let found_at = match found.get(index) {
                Some(true) => Some(now),
                _ => before.and_then(|k| k.found_at),
            };
            known.insert(
                Arc::from(name),
                Known {
                    scale,
                    read_at: now,
                    found_at,
                },
            );
        }
        Ok(operations)
    }
}

#[cfg(test)]
mod tests;
