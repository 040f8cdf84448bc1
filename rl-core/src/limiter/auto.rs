//! Finding an upstream's limit ([`Auto`], [`Limiter::learn`]): a budget
//! whose stated limits are a starting point, scaled by what every instance
//! learns of the upstream and shares through the store
//! ([`crate::backend::Backend::adjust`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::limiter::Limiter;
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::Hold;
use crate::model::error::{Error, LimitError};
use crate::model::learned::{Adjust, SCALE_CEILING, SCALE_FLOOR, SCALE_ONE};
use crate::model::limit::Limit;
use crate::store::Store;

/// How a budget finds its upstream's limit (`upstream_limit = "auto"`):
/// its groups' stated limits are where it starts and the most it goes to;
/// each answer of the upstream, heard through [`Limiter::learn`], moves
/// one scale per group that every instance shares through the store:
///
/// - the upstream **says** its limit (`x-ratelimit-limit-*`, see
///   [`Hold::limit`]): the group's first rate limit becomes that, times the
///   [`Auto::margin`] (other limits of the group in proportion; the
///   upstream's count is taken for that limit's period, e.g. a minute for
///   OpenAI's headers); while it says its limit, refusals do not lower it
///   (its remaining counts, [`Limiter::hold`], bound the budget then);
/// - otherwise a **refusal** (`429`/`503`) keeps [`Auto::keep`] of the
///   scale, or less when the upstream asks for a long pause: a pause of
///   `p` in the first limit's period `P` keeps at most `(P - p) / P` (its
///   window filled that soon, so calls went `P / (P - p)` times too fast;
///   at least a tenth is kept). Once per pause (the refusals of one
///   overload lower it once), down to [`Auto::floor`];
/// - and an **accepted** call adds [`Auto::raise`] of the scale, at most
///   once per [`Auto::every`] across all instances (additive while it is
///   accepted, multiplicative on refusal), up to the stated limits.
///
/// Each instance applies the shared scale to its own limits of the group
/// (as [`crate::settings::Settings::set_limits`] would, logged at debug level) when
/// it hears an answer, and reads it at least once per [`Auto::every`]
/// while its calls are answered; an instance its budget refuses (paused by
/// another one's refusal) reads it with [`Limiter::refresh_learned`] before
/// it calls again, as the client layer does. In-flight limits are left as
/// stated; a tiered group has no limits of its own and is left alone. The
/// learned limits replace a runtime override
/// ([`crate::settings::Settings::set_limits`]) of the group: scaling starts from the
/// compiled-in (stated) ones.
///
/// ```
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, upstream::{Auto, Hold}};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().build()?;
/// let spec = CallSpec::owned("llm", vec![GroupSpec::owned("llm_tpm", vec![Limit::per_minute(240_000)?])]);
/// let auto = Auto::new();
/// // The upstream refused with `Retry-After: 2`: the budget keeps 70 %.
/// limiter.learn(&spec, &auto, false, &Hold::new().pause(Duration::from_secs(2))).await?;
/// assert_eq!(limiter.settings().limits("llm_tpm").unwrap()[0].threshold(), 168_000);
/// // It says its limit: 60 000 tokens a minute.
/// limiter.learn(&spec, &auto, true, &Hold::new().limit(0, 60_000)).await?;
/// assert_eq!(limiter.settings().limits("llm_tpm").unwrap()[0].threshold(), 60_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Debug)]
pub struct Auto {
    keep: u64,
    raise: u64,
    every: Duration,
    margin: u64,
    floor: u64,
    /// Per group name: the scale this instance applies, and when it last
    /// read the shared one.
    known: Mutex<HashMap<Arc<str>, Known>>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    scale: u64,
    read_at: Instant,
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
    /// Keeps 70 % on a refusal, adds 1 % of the scale per second while
    /// accepted, takes a said limit as it is (margin 1), never below 1 % of
    /// the stated limits.
    pub fn new() -> Self {
        Self {
            keep: 700_000,
            raise: 10_000,
            every: Duration::from_secs(1),
            margin: SCALE_ONE,
            floor: 10_000,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The share of the scale a refusal keeps (in `(0, 1]`; default 0.7).
    ///
    /// # Errors
    /// [`LimitError::BadCall`], naming the setting and the value, when
    /// `share_kept` is not in `(0, 1]` (zero, negative, above 1 or not a
    /// number).
    pub fn keep(mut self, share_kept: f64) -> Result<Self, LimitError> {
        self.keep = share("keep", share_kept, false)?;
        Ok(self)
    }

    /// The share of the scale added per [`Auto::every`] while the upstream
    /// accepts (in `[0, 1]`; default 0.01).
    ///
    /// # Errors
    /// [`LimitError::BadCall`], naming the setting and the value, when
    /// `share_added` is not in `[0, 1]` (negative, above 1 or not a number).
    pub fn raise(mut self, share_added: f64) -> Result<Self, LimitError> {
        self.raise = share("raise", share_added, true)?;
        Ok(self)
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
    /// [`LimitError::BadCall`], naming the setting and the value, when
    /// `share_taken` is not in `(0, 1]` (zero, negative, above 1 or not a
    /// number).
    pub fn margin(mut self, share_taken: f64) -> Result<Self, LimitError> {
        self.margin = share("margin", share_taken, false)?;
        Ok(self)
    }

    /// The least share of the stated limits a budget keeps (in `(0, 1]`;
    /// default 0.01): a call's cost must fit it, or it is refused as
    /// invalid.
    ///
    /// # Errors
    /// [`LimitError::BadCall`], naming the setting and the value, when `least`
    /// is not in `(0, 1]` (zero, negative, above 1 or not a number).
    pub fn floor(mut self, least: f64) -> Result<Self, LimitError> {
        self.floor = share("floor", least, false)?;
        Ok(self)
    }

    /// The scale this instance applies to `group`'s stated limits, in parts
    /// per million ([`crate::upstream::SCALE_ONE`]: as stated), if it learned one.
    pub fn scale(&self, group: &str) -> Option<u64> {
        self.known.lock().get(group).map(|k| k.scale)
    }

    /// What to ask the store, for a group whose upstream answered
    /// `accepted` (or not) and said `said` of its limit, with `first` its
    /// first stated limit; `None`: nothing to ask now.
    fn adjustment(
        &self,
        group: &str,
        first: &Limit,
        accepted: bool,
        said: Option<u64>,
        pause: Option<Duration>,
    ) -> Option<Adjust> {
        let known = self.known.lock().get(group).copied();
        if let Some(said) = said {
            let scale = (u128::from(said) * u128::from(self.margin)
                / u128::from(first.threshold().max(1)))
            .min(u128::from(SCALE_CEILING)) as u64;
            let scale = scale.max(SCALE_FLOOR);
            return (known.map(|k| k.scale) != Some(scale)).then_some(Adjust::Set { scale });
        }
        if !accepted {
            let pause = pause.unwrap_or_default();
            return Some(Adjust::Lower {
                keep: self.keep.min(filled_share(first, pause)),
                cooldown: pause.max(self.every),
                floor: self.floor,
            });
        }
        let due = known.is_none_or(|k| k.read_at.elapsed() >= self.every);
        due.then_some(Adjust::Raise {
            step: self.raise,
            every: self.every,
        })
    }

    /// A read of `group`'s shared scale, when this instance last read it
    /// [`Auto::every`] or more ago (or never).
    fn read_if_due(&self, group: &str) -> Option<Adjust> {
        let known = self.known.lock().get(group).copied();
        let due = known.is_none_or(|k| k.read_at.elapsed() >= self.every);
        due.then_some(Adjust::Read)
    }
}

/// The share of `first`'s period in which the upstream's window filled,
/// in parts per million: a refusal asking for `pause` in a window of
/// period `P` says the window was full `P - pause` after it began, so
/// calls went `P / (P - pause)` times faster than it allows (as from an
/// empty window at a steady rate). At least a tenth; a pause of a period
/// or more says only that.
fn filled_share(first: &Limit, pause: Duration) -> u64 {
    let period = u128::from(first.period_micros().max(1));
    let pause = pause.as_micros().min(period);
    let share = ((period - pause) * u128::from(SCALE_ONE) / period) as u64;
    share.max(SCALE_ONE / 10)
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
    /// budget that finds its limit ([`Auto`]): `accepted` is whether the
    /// upstream took the call (not a `429`/`503`), `said` what its headers
    /// said ([`Hold::from_headers`]: its limits, its pause). Each group's
    /// shared scale is adjusted or read in the store (at most one operation
    /// per group, none when nothing is due) and applied to this instance's
    /// limits of the group. Answers how many store operations it made.
    /// Pausing the budget is [`Limiter::hold`]'s.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store cannot keep a learned scale (a
    /// custom [`crate::backend::Backend`] without
    /// [`crate::backend::Backend::adjust`] answers
    /// [`BackendError::Protocol`](crate::error::BackendError::Protocol)) or
    /// cannot be reached, and [`Error::Limit`] when a scale makes a group's
    /// limits invalid; that group keeps the limits it had (the groups before
    /// it in `spec` have theirs applied).
    pub async fn learn(
        &self,
        spec: &CallSpec,
        auto: &Auto,
        accepted: bool,
        said: &Hold,
    ) -> Result<usize, Error> {
        self.adjust_learned(spec, auto, |index, name, first| {
            auto.adjustment(name, first, accepted, said.limit_in(index), said.paused())
        })
        .await
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
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, upstream::{Auto, Hold}};
    /// use std::sync::Arc;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // Two instances sharing one store.
    /// let store: Arc<dyn ratewall::backend::Backend> = Arc::new(ratewall::backend::MemoryBackend::new());
    /// let (one, other) = (
    ///     Limiter::builder().shared_backend(store.clone()).build()?,
    ///     Limiter::builder().shared_backend(store).build()?,
    /// );
    /// let spec = CallSpec::owned("llm", vec![GroupSpec::owned("llm_tpm", vec![Limit::per_minute(240_000)?])]);
    /// let (heard, resumed) = (Auto::new(), Auto::new());
    /// // One instance hears the upstream say its limit; the other heard nothing.
    /// one.learn(&spec, &heard, true, &Hold::new().limit(0, 60_000)).await?;
    /// assert_eq!(resumed.scale("llm_tpm"), None);
    /// other.refresh_learned(&spec, &resumed).await?;
    /// assert_eq!(other.settings().limits("llm_tpm").unwrap()[0].threshold(), 60_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// ```
    ///
    /// # Errors
    /// As [`Limiter::learn`]: [`Error::Backend`] when the store cannot keep a
    /// learned scale or cannot be reached, [`Error::Limit`] when a scale makes a
    /// group's limits invalid; that group keeps the limits it had (the groups
    /// before it in `spec` have theirs applied).
    pub async fn refresh_learned(&self, spec: &CallSpec, auto: &Auto) -> Result<usize, Error> {
        self.adjust_learned(spec, auto, |_, name, _| auto.read_if_due(name))
            .await
    }

    /// Asks the store for each of `spec`'s groups' `adjust` (given the
    /// group's index, name and first rate limit; `None`: nothing to ask)
    /// and applies the scale it answers to this instance's limits.
    async fn adjust_learned(
        &self,
        spec: &CallSpec,
        auto: &Auto,
        adjust: impl Fn(usize, &str, &Limit) -> Option<Adjust>,
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
            let before = known.get(name).map(|k| k.scale);
            if before != Some(scale) || self.registry.limits(name).is_none() {
                let limits = scaled(stated, scale).map_err(Error::Limit)?;
                tracing::debug!(limit = name, scale, ?adjust, "learned limit applied");
                self.settings().apply_learned(name, limits)?;
            }
            known.insert(
                Arc::from(name),
                Known {
                    scale,
                    read_at: Instant::now(),
                },
            );
        }
        Ok(operations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_in_flight_limits_and_at_least_one_unit() {
        let stated = [
            Limit::per_minute(60_000).unwrap(),
            Limit::per_second(1_000)
                .unwrap()
                .with_algorithm(crate::Algorithm::Gcra)
                .unwrap()
                .with_burst(5_000)
                .unwrap(),
            Limit::in_flight(4).unwrap(),
        ];
        let half = scaled(&stated, SCALE_ONE / 2).unwrap();
        assert_eq!(half[0].threshold(), 30_000);
        assert_eq!((half[1].threshold(), half[1].burst()), (500, 2_500));
        assert_eq!(half[2], stated[2]);
        let tiny = scaled(&stated, 1).unwrap();
        assert_eq!((tiny[0].threshold(), tiny[1].burst()), (1, 1));
        // Rounded, not floored twice: 100 said for a threshold of 3.
        let said = (100 * SCALE_ONE) / 3;
        assert_eq!(
            scaled(&[Limit::per_minute(3).unwrap()], said).unwrap()[0].threshold(),
            100
        );
    }

    #[test]
    fn a_lease_that_no_longer_fits_is_dropped_and_one_that_fits_is_kept() {
        let leasing = Limit::per_minute(240_000)
            .unwrap()
            .with_lease(50_000)
            .unwrap();
        let low = scaled(&[leasing], 168_070).unwrap();
        assert_eq!((low[0].threshold(), low[0].lease()), (40_337, None));
        let half = scaled(&[leasing], SCALE_ONE / 2).unwrap();
        assert_eq!(
            (half[0].threshold(), half[0].lease()),
            (120_000, Some(50_000))
        );
        // A scale the limit cannot take is an error, not a panic.
        let log = Limit::per_minute(10_000)
            .unwrap()
            .with_algorithm(crate::Algorithm::SlidingLog)
            .unwrap();
        assert!(scaled(&[log], crate::upstream::SCALE_CEILING).is_err());
    }

    #[test]
    fn a_long_pause_lowers_the_scale_as_much_as_the_window_filled_early() {
        let minute = Limit::per_minute(240_000).unwrap();
        let lower = |pause: u64| match Auto::new().adjustment(
            "tpm",
            &minute,
            false,
            None,
            Some(Duration::from_secs(pause)),
        ) {
            Some(Adjust::Lower { keep, .. }) => keep,
            other => panic!("{other:?}"),
        };
        // Full 15 s into the minute (a pause of 45 s): 4 times too fast.
        assert_eq!(lower(45), 250_000);
        // A short pause keeps the usual 70 %; a pause past the period, a tenth.
        assert_eq!(lower(1), 700_000);
        assert_eq!(lower(600), 100_000);
    }

    #[test]
    fn shares_outside_their_range_are_refused() {
        assert!(Auto::new().keep(0.0).is_err());
        assert!(Auto::new().keep(1.5).is_err());
        assert!(Auto::new().raise(f64::NAN).is_err());
        assert!(Auto::new().raise(0.0).is_ok());
        assert!(Auto::new().margin(-0.1).is_err());
        assert!(Auto::new().floor(0.05).is_ok());
    }
}
