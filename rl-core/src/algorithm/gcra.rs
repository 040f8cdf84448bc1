//! GCRA: one theoretical arrival time (TAT) per identity.
//!
//! `I = ceil(P / T)` µs (rounded up: never faster than configured),
//! `τ = I·B`, `tat = max(stored, now)`, `new_tat = tat + c·I`.
//! Allowed iff `new_tat <= now + τ`; then store `new_tat`, expiring at
//! `new_tat`; `remaining = floor((now + τ - new_tat) / I)`,
//! `reset_after = new_tat - now`.
//! Refused: `retry_after = new_tat - τ - now`, nothing stored,
//! `remaining = floor((now + τ - tat) / I)`, `reset_after = tat - now`.
//!
//! A reservation at slot `s` (a waiting call) stores `max(tat, s) + c·I`;
//! taking back the last one made stores `tat - c·I` again.
//!
//! The state remembers the interval it was measured in and when it was
//! written. Under a limit whose interval differs (changed at run time) the
//! time the last write left ahead is converted, `tat' = w + ceil((tat - w)
//! · I_new / I_old)` (in `f64`, exactly as the Lua script computes it): the
//! calls made still count, as units of the new limit, draining at the new
//! rate from the last write, until the expiry that write set (a state never
//! outlives its key). The conversion depends on the state alone, so
//! `retry_after` stays exact. The time converted is kept to [`DEBT_CAP`]
//! (only debt reaches it).

use std::fmt;

use super::{DEBT_CAP, State};
use crate::model::decision::{Decision, Figures};
use crate::model::limit::Limit;

/// The TAT (any value `<= now`, 0 included, is a fresh state), when it was
/// written, and the emission interval it was measured in: 20 bytes aligned
/// to 4, so that with the memory store's 4-byte partition and an 8-byte
/// number an identity takes 32 bytes of table (half a cache line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tat {
    tat: Micros,
    written: Micros,
    measure: Measure,
}

/// A time in µs, held as its bytes: a `u64` that needs no 8-byte alignment
/// (see [`Tat`]); read and written whole.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Micros([u8; 8]);

impl Micros {
    #[inline(always)]
    fn new(micros: u64) -> Self {
        Micros(micros.to_ne_bytes())
    }

    #[inline(always)]
    fn get(self) -> u64 {
        u64::from_ne_bytes(self.0)
    }
}

impl fmt::Debug for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// The emission interval a TAT was measured in, exactly, in 4 bytes: the
/// interval itself below 2^31 µs (about 36 minutes); a longer one as the
/// threshold it came from, tagged with [`Measure::BY_THRESHOLD`]. A state is
/// only ever decided under limits of its own period (the period is part of
/// its key), so `ceil(P / T)` gives that interval back; and an interval
/// that long comes from a threshold below 2^21 (capacity × period is at
/// most 2^52 µs, so the period is too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Measure(u32);

impl Measure {
    /// The tag of a [`Measure`] that holds a threshold.
    const BY_THRESHOLD: u32 = 1 << 31;

    /// The measure of `limit`'s interval. Two limits of one period have
    /// the same measure if and only if they have the same interval.
    #[inline]
    fn of(limit: &Limit) -> Self {
        match u32::try_from(limit.emission_interval_micros()) {
            Ok(interval) if interval < Self::BY_THRESHOLD => Measure(interval),
            // Below 2^21 (see the type's docs): the tag bit stays clear.
            _ => Measure(Self::BY_THRESHOLD | (limit.threshold() as u32 & !Self::BY_THRESHOLD)),
        }
    }

    /// The interval this measure stands for, under `limit`'s period.
    fn interval(self, limit: &Limit) -> u64 {
        if self.0 & Self::BY_THRESHOLD == 0 {
            u64::from(self.0)
        } else {
            limit
                .period_micros()
                .div_ceil(u64::from(self.0 & !Self::BY_THRESHOLD))
        }
    }
}

impl Tat {
    #[inline(always)]
    fn new(tat: u64, written: u64, measure: Measure) -> Self {
        Tat {
            tat: Micros::new(tat),
            written: Micros::new(written),
            measure,
        }
    }

    /// Its parts, as the memory store packs them: the TAT, when it was
    /// written, and the raw bits of the interval it was measured in.
    #[inline(always)]
    pub(crate) fn parts(&self) -> (u64, u64, u32) {
        (self.tat.get(), self.written.get(), self.measure.0)
    }

    /// The state of these [`Tat::parts`].
    #[inline(always)]
    pub(crate) fn from_parts(tat: u64, written: u64, measure: u32) -> Self {
        Tat::new(tat, written, Measure(measure))
    }

    /// The TAT measured in `limit`'s interval (see the module docs), or the
    /// stored one when it is fresh at `now` or measured in that interval
    /// already.
    #[inline]
    fn measured_in(&self, limit: &Limit, now: u64) -> u64 {
        let (tat, written) = (self.tat.get(), self.written.get());
        if self.measure == Measure::of(limit) || tat <= now || tat <= written {
            return tat;
        }
        self.converted(limit)
    }

    /// The TAT converted to `limit`'s interval from the one it was measured
    /// in (rare: once a limit changed at run time).
    #[cold]
    fn converted(&self, limit: &Limit) -> u64 {
        let (tat, written) = (self.tat.get(), self.written.get());
        let (was, interval) = (
            self.measure.interval(limit),
            limit.emission_interval_micros(),
        );
        let ahead = (tat - written) as f64 * interval as f64 / was as f64;
        // Debt converted to a longer interval stays within the cap (and
        // exact in Lua's doubles).
        written + (ahead.ceil() as u64).min(DEBT_CAP)
    }

    /// Where a call of `cost` at `now` would move the TAT.
    #[inline]
    fn step(&self, limit: &Limit, now: u64, cost: u64) -> Step {
        let interval = limit.emission_interval_micros();
        let tat = self.measured_in(limit, now).max(now);
        Step {
            interval,
            burst: limit.burst(),
            tat,
            new_tat: tat + cost * interval,
        }
    }

    /// Takes the call `step` fits under `limit`, written at `now`.
    #[inline]
    fn take(&mut self, limit: &Limit, step: &Step, now: u64) {
        *self = Tat::new(step.new_tat, now, Measure::of(limit));
    }
}

/// A call: the limit's interval and burst, the TAT as of now, and the TAT
/// the call would move it to.
struct Step {
    interval: u64,
    burst: u64,
    tat: u64,
    new_tat: u64,
}

impl Step {
    /// `τ`, the tolerance.
    #[inline]
    fn tau(&self) -> u64 {
        self.interval * self.burst
    }

    /// Whether the call fits the limit at `now`.
    #[inline]
    fn fits(&self, now: u64) -> bool {
        self.new_tat <= now + self.tau()
    }

    /// The call's refusal at `now` (nothing taken).
    #[inline]
    fn refusal(&self, now: u64) -> Decision {
        let tau = self.tau();
        Decision::new(Figures {
            allowed: false,
            limit: self.burst,
            remaining: (now + tau).saturating_sub(self.tat) / self.interval,
            retry_after_us: self.new_tat - tau - now,
            reset_after_us: self.tat - now,
            at_micros: now,
        })
    }
}

impl State for Tat {
    #[inline]
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, commit: bool) -> Decision {
        let step = self.step(limit, now, cost);
        if !step.fits(now) {
            return step.refusal(now);
        }
        let kept = if commit {
            self.take(limit, &step, now);
            step.new_tat
        } else {
            step.tat
        };
        Decision::new(Figures {
            allowed: true,
            limit: step.burst,
            remaining: (now + step.tau() - kept) / step.interval,
            retry_after_us: 0,
            reset_after_us: kept - now,
            at_micros: now,
        })
    }

    #[inline]
    fn admit(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), Decision> {
        let step = self.step(limit, now, cost);
        if !step.fits(now) {
            return Err(step.refusal(now));
        }
        self.take(limit, &step, now);
        Ok(())
    }

    fn refund(&mut self, limit: &Limit, now: u64, cost: u64, _at: u64) {
        let interval = limit.emission_interval_micros();
        let back = self
            .measured_in(limit, now)
            .saturating_sub(cost.saturating_mul(interval));
        *self = if back <= now {
            Tat::default()
        } else {
            Tat::new(back, now, Measure::of(limit))
        };
    }

    fn charge(&mut self, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let interval = limit.emission_interval_micros();
        let ahead = self.measured_in(limit, now).max(now) - now;
        let ahead = ahead
            .saturating_add(units.saturating_mul(interval))
            .min(DEBT_CAP);
        *self = Tat::new(now + ahead, now, Measure::of(limit));
    }

    fn hold(&mut self, limit: &Limit, now: u64, after: u64, left: u64) {
        let interval = limit.emission_interval_micros();
        let tau = interval * limit.burst();
        // remaining(t) = floor((t + τ - tat) / I) <= left  <=>
        // tat - now >= after + τ + 1 - (left + 1)·I, at t = now + after
        // (`after` kept where the sum stays within the cap).
        let needed = (after.min(DEBT_CAP.saturating_sub(tau)) + tau + 1)
            .saturating_sub(left.saturating_add(1).saturating_mul(interval));
        let ahead = self.measured_in(limit, now).max(now) - now;
        if needed <= ahead {
            return;
        }
        *self = Tat::new(now + needed.min(DEBT_CAP), now, Measure::of(limit));
    }

    fn release(&mut self, limit: &Limit, now: u64, units: u64, at: u64, stamp: u64) {
        if self.tat.get() == stamp {
            self.refund(limit, now, units, at);
        }
    }

    fn unreserve(&mut self, limit: &Limit, now: u64, _at: u64, mark: u64, cost: u64) -> bool {
        if self.tat.get() != mark {
            return false;
        }
        let back = mark.saturating_sub(cost.saturating_mul(limit.emission_interval_micros()));
        self.tat = Micros::new(if back <= now { 0 } else { back });
        true
    }

    fn expires_at(&self) -> u64 {
        self.tat.get()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Limits at the edges of the bounds: intervals just under and over
    /// 2^31 µs, the longest period, thresholds past `u32`.
    fn edge_limits() -> Vec<Limit> {
        let periods = [1, 1_000, 60_000_000, (1 << 31) - 1, 1 << 31, (1 << 31) + 1]
            .into_iter()
            .chain([86_400_000_000, 30 * 86_400_000_000, (1 << 40) + 7, 1 << 52]);
        let thresholds = [1, 2, 3, 7, 1_000, 2_047, 1 << 20, (1 << 21) - 1]
            .into_iter()
            .chain([1 << 31, (1 << 32) + 1, 1 << 40]);
        periods
            .flat_map(|p| thresholds.clone().map(move |t| (p, t)))
            .filter_map(|(p, t)| Limit::new(t, Duration::from_micros(p)).ok())
            .collect()
    }

    #[test]
    fn a_measure_gives_back_the_interval_of_its_limit_exactly() {
        let limits = edge_limits();
        assert!(
            limits
                .iter()
                .any(|l| l.emission_interval_micros() >= 1 << 31),
            "some interval is held by its threshold"
        );
        for limit in &limits {
            let measure = Measure::of(limit);
            assert_eq!(
                measure.interval(limit),
                limit.emission_interval_micros(),
                "{limit:?}"
            );
            for other in limits.iter().filter(|o| o.period() == limit.period()) {
                assert_eq!(
                    measure == Measure::of(other),
                    limit.emission_interval_micros() == other.emission_interval_micros(),
                    "{limit:?} against {other:?}"
                );
            }
        }
    }

    #[test]
    fn a_tat_measured_in_an_interval_over_half_an_hour_converts_exactly() {
        // 1 a day (I = 24 h, held by its threshold), one call; raised to 2
        // a day an hour later: the call counts as one unit of the new limit
        // (12 h ahead of its write), so one more passes, as a sliding log
        // would admit, and the next waits exactly until a unit is free.
        const H: u64 = 3_600_000_000;
        let (one, two) = (Limit::per_day(1).unwrap(), Limit::per_day(2).unwrap());
        assert!(one.emission_interval_micros() >= 1 << 31);
        let mut tat = Tat::default();
        assert!(tat.decide(&one, 0, 1, true).allowed());
        assert!(!tat.decide(&one, H, 1, true).allowed());
        assert!(tat.decide(&two, H, 1, true).allowed());
        let refused = tat.decide(&two, 2 * H, 1, true);
        assert!(!refused.allowed());
        assert_eq!(refused.retry_after(), Duration::from_micros(10 * H));
        assert_eq!(std::mem::size_of::<Tat>(), 20);
        assert_eq!(std::mem::align_of::<Tat>(), 4);
    }
}
