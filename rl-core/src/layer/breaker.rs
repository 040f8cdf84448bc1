//! The circuit breaker layer, in front of a remote backend: after
//! consecutive failures, stop calling it for a back-off period and answer
//! every operation (acquire, peek, refund, reset) with a failure at once,
//! for the failure policy to handle; then let one probe through and close
//! again on success.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Answer, Call, Layer, Source};
use crate::model::error::{BackendError, Error};

/// Settings of the circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit (0 disables the breaker).
    pub failures_to_open: u32,
    /// How long the circuit stays open before a probe is let through.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    /// Opens after 5 consecutive failures, for 2 seconds.
    fn default() -> Self {
        Self {
            failures_to_open: 5,
            open_for: Duration::from_secs(2),
        }
    }
}

impl BreakerConfig {
    /// Opens after `failures_to_open` consecutive failures for `open_for`.
    pub fn new(failures_to_open: u32, open_for: Duration) -> Self {
        Self {
            failures_to_open,
            open_for,
        }
    }

    /// Never opens.
    pub fn disabled() -> Self {
        Self {
            failures_to_open: 0,
            open_for: Duration::ZERO,
        }
    }
}

/// What the breaker says about the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permission {
    /// Call the backend.
    Call,
    /// Call the backend as the one probe of a half-open circuit.
    Probe,
    /// Do not call: the circuit is open.
    Skip,
}

/// The breaker of one limiter.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    epoch: Instant,
    failures: AtomicU32,
    /// Nanoseconds since `epoch` until which the circuit is open; 0 = closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            epoch: Instant::now(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn permission(&self) -> Permission {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permission::Call;
        }
        if self.now() < until {
            return Permission::Skip;
        }
        // Half-open: exactly one caller probes, the others keep skipping.
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Permission::Probe
        } else {
            Permission::Skip
        }
    }

    pub(crate) fn success(&self, permission: Permission) {
        self.failures.store(0, Ordering::Release);
        if permission == Permission::Probe || self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            metrics::gauge!("ratewall_circuit_open").set(0.0);
            tracing::info!("rate limiter backend recovered; circuit closed");
        }
    }

    pub(crate) fn failure(&self, permission: Permission) {
        if self.config.failures_to_open == 0 {
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if permission == Permission::Probe || failures >= self.config.failures_to_open {
            let until = self.now() + self.config.open_for.as_nanos() as u64;
            let was = self.open_until.swap(until.max(1), Ordering::AcqRel);
            self.probing.store(false, Ordering::Release);
            metrics::gauge!("ratewall_circuit_open").set(1.0);
            if was == 0 || permission == Permission::Probe {
                tracing::warn!(failures, open_for = ?self.config.open_for, "rate limiter backend failing; circuit open");
            }
        }
    }

    /// Whether the circuit is open now.
    pub(crate) fn is_open(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        until != 0 && self.now() < until
    }
}

impl Layer for Breaker {
    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        let permission = self.permission();
        if permission == Permission::Skip {
            return Some(Answer::Failed(Error::Backend(BackendError::CircuitOpen)));
        }
        call.notes.breaker = Some(permission);
        None
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let Some(permission) = call.notes.breaker else {
            return;
        };
        match answer {
            Answer::Failed(Error::Backend(_)) => self.failure(permission),
            Answer::Decided {
                source: Source::Backend,
                ..
            }
            | Answer::Applied {
                source: Source::Backend,
            } => self.success(permission),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_then_lets_one_probe_through() {
        let breaker = Breaker::new(BreakerConfig::new(3, Duration::from_millis(30)));
        for _ in 0..2 {
            assert_eq!(breaker.permission(), Permission::Call);
            breaker.failure(Permission::Call);
        }
        breaker.success(Permission::Call);
        for _ in 0..3 {
            breaker.failure(Permission::Call);
        }
        assert_eq!(breaker.permission(), Permission::Skip);
        assert!(breaker.is_open());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breaker.permission(), Permission::Probe);
        assert_eq!(
            breaker.permission(),
            Permission::Skip,
            "only one probe at a time"
        );
        breaker.failure(Permission::Probe);
        assert_eq!(
            breaker.permission(),
            Permission::Skip,
            "a failed probe reopens"
        );
        std::thread::sleep(Duration::from_millis(40));
        let probe = breaker.permission();
        assert_eq!(probe, Permission::Probe);
        breaker.success(probe);
        assert_eq!(breaker.permission(), Permission::Call);
        assert!(!breaker.is_open());
    }

    #[test]
    fn a_disabled_breaker_never_opens() {
        let breaker = Breaker::new(BreakerConfig::disabled());
        for _ in 0..100 {
            breaker.failure(Permission::Call);
        }
        assert_eq!(breaker.permission(), Permission::Call);
    }
}
