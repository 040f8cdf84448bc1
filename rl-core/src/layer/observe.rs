//! The observability layer: one count per decision, backend latency, a
//! DEBUG line per refusal and at most one INFO line per limit name every
//! ten seconds ([`summary`]), a WARN line per backend failure.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratewall_decisions_total` | counter | `limit` (the call's name), `outcome` (`allowed`, `rejected`, `shadow_rejected`, `denied`, `allow_listed`, `failed_open`, `unavailable`), `source` (`backend`, `cache`, `local`, `list`, `policy`, `lease`) |
//! | `ratewall_operations_total` | counter | `limit`, `op` (`peek`, `refund`, `charge`, `hold`, `reset`, `cancel`), `result` (`ok`, `error`) |
//! | `ratewall_backend_errors_total` | counter | `limit`, `op`, `error` (`timeout`, `unavailable`, `circuit_open`, `protocol`) |
//! | `ratewall_backend_seconds` | histogram | `limit` |
//! | `ratewall_wait_seconds` | histogram | `limit`: the wait of each admitted waiting call (recorded by the limiter's waiting calls) |
//! | `ratewall_circuit_open` | gauge | (none): 1 while the breaker skips the backend |
//! | `ratewall_leased_units` | gauge | `limit` (a group name): units held unused in this process's leases |
//! | `ratewall_lease_takes_total` | counter | `limit`: leases taken |
//! | `ratewall_lease_units_total` | counter | `limit`, `event` (`taken`, `returned`) |
//! | `ratewall_lease_returns_total` | counter | `limit`, `result` (`returned`, `failed`) |
//! | `ratewall_refund_notices_subscribed` | gauge | `prefix`: 1 while the remote store's notices of room given back by other instances reach this limiter, 0 while its subscription is down (recorded by the limiter, see `Backend::subscribe_refunds`) |
//! | `ratewall_refund_notices_total` | counter | `prefix`: notices heard, one per key given back by another instance |
//!
//! Every refusal is `outcome="rejected"`, wherever it was decided: `source`
//! says where (the backend, the deny cache, or the in-process fallback).

mod summary;

use std::time::Instant;

use self::summary::{Kind, Line, Summaries};
use super::{Answer, Call, LaneRefusal, Layer, Source, counters};
use crate::model::decision::Decision;
use crate::model::error::{BackendError, Error};
use crate::model::key::IdentityRef;
use crate::model::mask::Masked;
use crate::store::target::Target;

/// Counts and logs every call.
#[derive(Debug, Default)]
pub(crate) struct Observe {
    /// What each limit name has refused since its last INFO line.
    summaries: Summaries,
}

impl Layer for Observe {
    fn acts_before(&self) -> bool {
        false
    }

    fn only_observes(&self) -> bool {
        true
    }

    /// What [`Observe::after`] does with the store's refusal of an acquire,
    /// without the call and answer: its log line and its count.
    fn after_refusal(&self, refusal: &LaneRefusal<'_>) {
        self.logged(refusal.target, refusal.decision, Source::Backend);
        match refusal.rejected {
            Some(rejected) => counters::count(rejected),
            None => counters::decision(refusal.name, "rejected", Source::Backend.name()),
        }
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        if let Some(elapsed) = call.notes.store_time {
            counters::backend_seconds(call.name, elapsed.as_secs_f64());
        }
        // The commonest outcome first: an acquire the store allowed.
        if let (
            Some(keys),
            Answer::Decided {
                decisions,
                source: Source::Backend,
            },
        ) = (call.counters, &*answer)
            && call.op.admits()
            && decisions.allowed()
        {
            counters::count(&keys.allowed);
            return;
        }
        let failure = match answer {
            Answer::Failed(error) | Answer::FailedOpen(error) | Answer::Unavailable(error) => {
                Some(&*error)
            }
            _ => call.notes.failure.as_ref(),
        };
        if let Some(Error::Backend(error)) = failure {
            backend_failed(call, error);
        }
        match call.op {
            op if op.admits() => self.decided(call, answer),
            op => {
                let result = match answer {
                    Answer::Failed(_) | Answer::Unavailable(_) => "error",
                    _ => "ok",
                };
                let name = call.name.to_owned();
                metrics::counter!(
                    "ratewall_operations_total",
                    "limit" => name, "op" => op.name(), "result" => result
                )
                .increment(1);
            }
        }
    }
}

impl Observe {
    /// Counts an acquire's outcome and logs refusals.
    fn decided(&self, call: &Call<'_>, answer: &Answer) {
        let (outcome, source) = match answer {
            Answer::Decided { decisions, source } if decisions.allowed() => ("allowed", *source),
            Answer::Decided { decisions, source } => {
                let index = decisions.binding_index();
                self.refused(call, index, decisions.binding(), *source);
                ("rejected", *source)
            }
            Answer::Refused {
                index,
                decision,
                source,
            } => {
                self.refused(call, *index, decision, *source);
                ("rejected", *source)
            }
            Answer::Shadowed { decisions, source } => {
                if tracing::level_enabled!(tracing::Level::INFO) {
                    let target = call.targets.get(decisions.binding_index());
                    self.shadowed(target.map_or(call.name, |t| t.name), decisions.binding());
                }
                ("shadow_rejected", *source)
            }
            Answer::Denied { index, .. } => {
                if tracing::level_enabled!(tracing::Level::INFO)
                    && let Some(target) = call.targets.get(*index)
                {
                    self.denied(target);
                }
                ("denied", Source::List)
            }
            Answer::AllowListed => ("allow_listed", Source::List),
            Answer::FailedOpen(_) => ("failed_open", Source::Policy),
            Answer::Unavailable(Error::Limit(error)) => {
                tracing::error!(limit = call.name, %error, "rate limit misconfigured");
                ("unavailable", Source::Policy)
            }
            Answer::Unavailable(_) | Answer::Failed(_) | Answer::Applied { .. } => {
                ("unavailable", Source::Policy)
            }
        };
        match (call.counters, outcome, source) {
            (Some(keys), "allowed", Source::Backend) => counters::count(&keys.allowed),
            (Some(keys), "rejected", Source::Backend) => counters::count(&keys.rejected),
            (Some(keys), "allowed", Source::Lease) => counters::count(&keys.leased),
            _ => counters::decision(call.name, outcome, source.name()),
        }
    }

    fn refused(&self, call: &Call<'_>, index: usize, decision: &Decision, source: Source) {
        if let Some(target) = call.targets.get(index) {
            self.logged(target, decision, source);
        }
    }

    /// The log lines of a refusal of `target`: one at DEBUG, and at INFO
    /// the first of a quiet interval in full or a summary of the interval
    /// ([`summary`]). Only the level is looked at here; the lines are built
    /// out of line, when a subscriber wants them (a refusal in a service
    /// that logs nothing at INFO costs one load and a compare).
    #[inline]
    fn logged(&self, target: &Target<'_>, decision: &Decision, source: Source) {
        if tracing::level_enabled!(tracing::Level::INFO) {
            self.written(target, decision, source);
        }
    }

    /// [`Observe::logged`]'s lines, when INFO or DEBUG is enabled.
    #[cold]
    #[inline(never)]
    fn written(&self, target: &Target<'_>, decision: &Decision, source: Source) {
        let Target {
            name, key, limit, ..
        } = target;
        let retry_after_ms = decision.retry_after().as_millis() as u64;
        let identity = Shown(key.identity);
        // Answered from a remembered refusal, or while waiting for a lease.
        let remembered = matches!(source, Source::Cache | Source::Lease);
        tracing::debug!(
            limit = name,
            identity = %identity,
            rate = %limit,
            retry_after_ms,
            source = source.name(),
            remembered,
            "rate limited"
        );
        match self.summaries.heard(name, Kind::Limited, Instant::now()) {
            Line::Counted => {}
            Line::First => tracing::info!(
                limit = name,
                identity = %identity,
                rate = %limit,
                retry_after_ms,
                source = source.name(),
                "rate limited (further refusals of this limit: one summary line every 10 s at INFO, each at DEBUG)"
            ),
            summary @ Line::Summary { .. } => summary.write_summary(name, Kind::Limited),
        }
    }

    /// A refusal shadow mode turned into an admission, by `name`.
    #[cold]
    #[inline(never)]
    fn shadowed(&self, name: &str, decision: &Decision) {
        let retry_after_ms = decision.retry_after().as_millis() as u64;
        tracing::debug!(
            limit = name,
            retry_after_ms,
            "shadow mode: would have rate limited"
        );
        match self.summaries.heard(name, Kind::Shadowed, Instant::now()) {
            Line::Counted => {}
            Line::First => tracing::info!(
                limit = name,
                retry_after_ms,
                "shadow mode: would have rate limited (further ones: one summary line every 10 s at INFO, each at DEBUG)"
            ),
            summary @ Line::Summary { .. } => summary.write_summary(name, Kind::Shadowed),
        }
    }

    /// A call of `target` refused by the deny list.
    #[cold]
    #[inline(never)]
    fn denied(&self, target: &Target<'_>) {
        let identity = Shown(target.key.identity);
        tracing::debug!(limit = target.name, identity = %identity, "denied by the deny list");
        match self
            .summaries
            .heard(target.name, Kind::Denied, Instant::now())
        {
            Line::Counted => {}
            Line::First => tracing::info!(
                limit = target.name,
                identity = %identity,
                "denied by the deny list (further ones: one summary line every 10 s at INFO, each at DEBUG)"
            ),
            summary @ Line::Summary { .. } => summary.write_summary(target.name, Kind::Denied),
        }
    }
}

/// An identity masked ([`Masked`]) for a log line, rendered only when the
/// line is written.
struct Shown<'a>(IdentityRef<'a>);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.with_text(|text| Masked(text).fmt(f))
    }
}

fn backend_failed(call: &Call<'_>, error: &BackendError) {
    let kind = match error {
        BackendError::Timeout(_) => "timeout",
        BackendError::CircuitOpen => "circuit_open",
        BackendError::Protocol(_) => "protocol",
        BackendError::Invalid(_) => "invalid",
        _ => "unavailable",
    };
    let name = call.name.to_owned();
    metrics::counter!(
        "ratewall_backend_errors_total",
        "limit" => name, "op" => call.op.name(), "error" => kind
    )
    .increment(1);
    // The breaker logs when it opens; a call it turns away is not news.
    if matches!(error, BackendError::CircuitOpen) {
        tracing::debug!(
            limit = call.name,
            op = call.op.name(),
            policy = call.policy.name(),
            "circuit open; applying failure policy"
        );
    } else {
        tracing::warn!(
            limit = call.name,
            op = call.op.name(),
            %error,
            policy = call.policy.name(),
            "rate limiter backend failed; applying failure policy"
        );
    }
}
