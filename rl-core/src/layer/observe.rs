//! The observability layer: one count per decision, one log line per
//! refusal or failure, backend latency.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `rl_decisions_total` | counter | `limit` (the call's name), `outcome` (`allowed`, `rejected`, `shadow_rejected`, `denied`, `allow_listed`, `failed_open`, `unavailable`), `source` (`backend`, `cache`, `local`, `list`, `policy`, `lease`) |
//! | `rl_operations_total` | counter | `limit`, `op` (`peek`, `refund`, `charge`, `hold`, `reset`, `cancel`), `result` (`ok`, `error`) |
//! | `rl_backend_errors_total` | counter | `limit`, `op`, `error` (`timeout`, `unavailable`, `circuit_open`, `protocol`) |
//! | `rl_backend_seconds` | histogram | `limit` |
//! | `rl_wait_seconds` | histogram | `limit`: the wait of each admitted waiting call (recorded by the limiter's waiting calls) |
//! | `rl_circuit_open` | gauge | (none): 1 while the breaker skips the backend |
//! | `rl_leased_units` | gauge | `limit` (a group name): units held unused in this process's leases |
//! | `rl_lease_takes_total` | counter | `limit`: leases taken |
//! | `rl_lease_units_total` | counter | `limit`, `event` (`taken`, `returned`) |
//! | `rl_lease_returns_total` | counter | `limit`, `result` (`returned`, `failed`) |
//!
//! Every refusal is `outcome="rejected"`, wherever it was decided: `source`
//! says where (the backend, the deny cache, or the in-process fallback).

use super::{Answer, Call, LaneRefusal, Layer, Source, counters};
use crate::model::decision::Decision;
use crate::model::error::{BackendError, Error};
use crate::model::key::IdentityRef;
use crate::model::mask::Masked;
use crate::store::target::Target;

/// Counts and logs every call.
#[derive(Debug, Default)]
pub(crate) struct Observe;

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
        logged(refusal.target, refusal.decision, Source::Backend);
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
            op if op.admits() => decided(call, answer),
            op => {
                let result = match answer {
                    Answer::Failed(_) | Answer::Unavailable(_) => "error",
                    _ => "ok",
                };
                let name = call.name.to_owned();
                metrics::counter!(
                    "rl_operations_total",
                    "limit" => name, "op" => op.name(), "result" => result
                )
                .increment(1);
            }
        }
    }
}

/// Counts an acquire's outcome and logs refusals.
fn decided(call: &Call<'_>, answer: &Answer) {
    let (outcome, source) = match answer {
        Answer::Decided { decisions, source } if decisions.allowed() => ("allowed", *source),
        Answer::Decided { decisions, source } => {
            let index = decisions.binding_index();
            refused(call, index, decisions.binding(), *source);
            ("rejected", *source)
        }
        Answer::Refused {
            index,
            decision,
            source,
        } => {
            refused(call, *index, decision, *source);
            ("rejected", *source)
        }
        Answer::Shadowed { decisions, source } => {
            let target = call.targets.get(decisions.binding_index());
            tracing::info!(
                limit = target.map_or(call.name, |t| t.name),
                retry_after_ms = decisions.binding().retry_after().as_millis() as u64,
                "shadow mode: would have rate limited"
            );
            ("shadow_rejected", *source)
        }
        Answer::Denied { index, .. } => {
            if let Some(target) = call.targets.get(*index) {
                tracing::info!(
                    limit = target.name,
                    identity = %Shown(target.key.identity),
                    "denied by the deny list"
                );
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

fn refused(call: &Call<'_>, index: usize, decision: &Decision, source: Source) {
    if let Some(target) = call.targets.get(index) {
        logged(target, decision, source);
    }
}

/// The log line of a refusal of `target`: `info`, or `debug` for one
/// answered from a remembered refusal or while waiting for a lease. Only
/// the level is looked at here; the line is built out of line, when a
/// subscriber wants it (a refusal in a service that logs nothing at that
/// level costs one load and a compare).
#[inline]
fn logged(target: &Target<'_>, decision: &Decision, source: Source) {
    let remembered = matches!(source, Source::Cache | Source::Lease);
    let level = if remembered {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    if tracing::level_enabled!(level) {
        written(target, decision, source, remembered);
    }
}

/// [`logged`]'s line, when its level is enabled: `remembered`, a refusal
/// answered from a remembered one or while waiting for a lease (`debug`).
#[cold]
#[inline(never)]
fn written(target: &Target<'_>, decision: &Decision, source: Source, remembered: bool) {
    let Target {
        name, key, limit, ..
    } = target;
    let retry_after_ms = decision.retry_after().as_millis() as u64;
    let identity = Shown(key.identity);
    if remembered {
        tracing::debug!(
            limit = name,
            identity = %identity,
            retry_after_ms,
            source = source.name(),
            "rate limited (remembered refusal, or waiting for a lease)"
        );
    } else {
        tracing::info!(
            limit = name,
            identity = %identity,
            rate = %limit,
            retry_after_ms,
            source = source.name(),
            "rate limited"
        );
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
        "rl_backend_errors_total",
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
