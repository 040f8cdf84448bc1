//! What the pipeline carries for each limit of a call ([`Target`]), the
//! operations on a batch of them ([`Op`]), and the one check every batch
//! passes before any store sees it ([`validate`]).

use std::fmt;

use crate::model::error::LimitError;
use crate::model::key::{IdentityRef, Key};
use crate::model::limit::Limit;
use crate::model::reservation::Reservation;

/// A key as two borrowed parts: its head (`prefix:{scope:`, escaped) and its
/// identity. Renders as `head + identity + "}"` ([`Key`]'s layout), without
/// building the string until a remote store needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyRef<'a> {
    pub(crate) head: &'a str,
    pub(crate) identity: IdentityRef<'a>,
}

impl<'a> KeyRef<'a> {
    #[inline(always)]
    pub(crate) fn of(key: &'a Key) -> Self {
        Self {
            head: key.head(),
            identity: key.identity_ref(),
        }
    }

    /// The rendered key.
    pub(crate) fn render(&self) -> Key {
        Key::from_parts(self.head, self.identity)
    }

    /// The parts of a rendered key (`prefix:{scope:identity}`, scope and
    /// identity escaped: no `{`, `}` or `:` in them, no brace in the
    /// prefix), without building a [`Key`]; `None` for text of another
    /// shape. The inverse of [`KeyRef::render`]: the identity takes its
    /// one form ([`IdentityRef::of_escaped`]).
    pub(crate) fn parse(text: &'a str) -> Option<Self> {
        let open = text.find(":{")?;
        let scope_at = open + 2;
        let colon = scope_at + text[scope_at..].find(':')?;
        let identity = text[colon + 1..].strip_suffix('}')?;
        let clean = |part: &str| !part.contains(['{', '}', ':']);
        (!text[..open].contains(['{', '}']) && clean(&text[scope_at..colon]) && clean(identity))
            .then(|| Self {
                head: &text[..=colon],
                identity: IdentityRef::of_escaped(identity),
            })
    }
}

impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}}}", self.head, self.identity)
    }
}

/// Where a target's state lives in one memory store, found once when a call
/// is resolved so the store skips its own lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The store this slot belongs to.
    pub(crate) store: std::num::NonZeroU32,
    /// The partition (key head, algorithm and period) in that store.
    pub(crate) partition: u32,
}

/// One limit of one call, named: the unit every layer and store sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The name of the group the limit belongs to: the key's scope, the name
    /// in rejections, logs and runtime overrides.
    pub(crate) name: &'a str,
    pub(crate) key: KeyRef<'a>,
    pub(crate) limit: &'a Limit,
    /// Units the call takes (validated: `1 ..= capacity`).
    pub(crate) cost: u64,
    pub(crate) slot: Option<Slot>,
    /// The lease id an in-flight limit's slot is held under (0: none; see
    /// [`crate::backend::Request::holder`]).
    pub(crate) lease: u64,
}

/// An operation on a batch of targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// Decide and, when every target allows, consume (all-or-nothing).
    Acquire,
    /// [`Op::Acquire`], idempotent by request id.
    AcquireOnce(&'a str),
    /// Decide without consuming, as of this many µs from now (0: now;
    /// later: what the state will hold then, with no call in between).
    Peek(u64),
    /// Give back what an acquire made at this time (µs) took.
    Refund(u64),
    /// Take each target's cost on top of what its state holds, whatever
    /// the limit says (a settled call's cost above its estimate: debt that
    /// later calls pay, see [`crate::backend::Backend::charge`]).
    Charge,
    /// Raise each target's state so that at most `left` units remain
    /// `after` µs from now (an upstream's own word: a pause, a remaining
    /// count; see [`crate::backend::Backend::hold`]). The cost is ignored.
    Hold {
        /// µs from now.
        after: u64,
        /// Units left then, at most.
        left: u64,
    },
    /// Forget the targets' state.
    Reset,
    /// Reserve the earliest slot every target allows, no later than this
    /// many µs from now, committing every target as of that slot
    /// (all-or-nothing); GCRA and the buckets only.
    Reserve(u64),
    /// Give back a reservation ([`Op::Reserve`]).
    Cancel(&'a Reservation),
    /// Take back an [`Op::AcquireOnce`] by its request id, whether it ran
    /// or not ([`crate::store::backend::Backend::cancel_once`]): idempotent.
    CancelOnce(&'a str),
}

impl Op<'_> {
    /// The operation's name, in logs and metrics.
    pub(crate) const fn name(&self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::AcquireOnce(_) => "acquire_once",
            Op::Peek(_) => "peek",
            Op::Refund(_) => "refund",
            Op::Charge => "charge",
            Op::Hold { .. } => "hold",
            Op::Reset => "reset",
            Op::Reserve(_) => "reserve",
            Op::Cancel(_) => "cancel",
            Op::CancelOnce(_) => "cancel_once",
        }
    }

    /// Whether the operation answers with decisions.
    pub(crate) const fn decides(&self) -> bool {
        matches!(
            self,
            Op::Acquire | Op::AcquireOnce(_) | Op::Peek(_) | Op::Reserve(_)
        )
    }

    /// Whether the operation admits calls (what the deny list, shadow mode,
    /// publishing and the failure policy act on).
    pub(crate) const fn admits(&self) -> bool {
        matches!(self, Op::Acquire | Op::AcquireOnce(_) | Op::Reserve(_))
    }
}

/// Checks a batch before any store decides it: at least one target, every
/// cost `1 ..= capacity` ([`Limit::check_cost`]; refunds and resets ignore
/// the cost, a charge may be any amount), no in-flight limit charged, and no two targets naming one state (the same key with the
/// same algorithm and period, see [`Limit::state_id`]): such a pair could
/// not be decided all-or-nothing, as both would be judged against the state
/// before either wrote.
pub(crate) fn validate(op: Op<'_>, targets: &[Target<'_>]) -> Result<(), LimitError> {
    if targets.is_empty() {
        return Err(LimitError::BadCall(
            "a call needs at least one limit".into(),
        ));
    }
    for (i, a) in targets.iter().enumerate() {
        if matches!(op, Op::Reserve(_) | Op::Cancel(_)) && a.limit.is_in_flight() {
            return Err(LimitError::BadCall(format!(
                "{} cannot reserve a slot: a waiting call cannot hold in-flight slots \
                 (a concurrency limit frees when a running call ends, which no slot in time can promise)",
                a.limit
            )));
        }
        if matches!(op, Op::Reserve(_)) && a.limit.block().is_some() {
            return Err(LimitError::BadCall(format!(
                "limit {} cannot reserve a slot: a limit that blocks refuses a blocked identity until its block \
                 ends (a call waiting on it retries after its retry_after)",
                a.limit
            )));
        }
        if matches!(op, Op::Reserve(_)) && !a.limit.algorithm().reserves() {
            return Err(LimitError::BadCall(format!(
                "limit {} cannot reserve a slot: only gcra, token_bucket and leaky_bucket queue waiting calls \
                 (a call waiting on a window algorithm retries after its retry_after)",
                a.limit
            )));
        }
        if op.decides() {
            a.limit.check_cost(a.cost)?;
        }
        if matches!(op, Op::Charge | Op::Hold { .. }) && a.limit.is_in_flight() {
            return Err(LimitError::BadCall(format!(
                "{} has no cost to settle: an in-flight limit counts running calls, not units",
                a.limit
            )));
        }
        if a.limit.is_in_flight() && a.lease == 0 && matches!(op, Op::Acquire | Op::AcquireOnce(_))
        {
            return Err(LimitError::BadCall(format!(
                "{} is taken with `Limiter::call`, whose permit holds the slot and gives it back when the call \
                 ends; it cannot be acquired on its own",
                a.limit
            )));
        }
        // (A lone target names no state twice: nothing to compare.)
        let rest = &targets[i + 1..];
        if rest.is_empty() {
            break;
        }
        let id = a.limit.state_id();
        if let Some(b) = rest
            .iter()
            .find(|b| b.limit.state_id() == id && b.key == a.key)
        {
            return Err(LimitError::Overlapping {
                first: a.limit.to_string(),
                second: b.limit.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::KeyRef;
    use crate::model::key::Key;

    #[test]
    fn a_rendered_key_parses_back_into_its_parts() {
        for key in [
            Key::new("app:v2", "sms", "+33 6"),
            Key::new("rl", "lo{g}in", "al:ice%"),
            Key::from_display("rl", "jobs", &42),
            Key::from_display("rl", "ip", &std::net::Ipv4Addr::new(192, 0, 2, 7)),
            Key::new("rl", "x", ""),
        ] {
            let parsed = KeyRef::parse(key.as_str()).unwrap_or_else(|| panic!("{key}"));
            assert_eq!(parsed, KeyRef::of(&key), "{key}");
            assert_eq!(parsed.render(), key);
        }
        for text in [
            "rl:{sms:alice}:gc:60000000",
            "rl:{sms}",
            "rl:sms:alice}",
            "r{l:{sms:alice}",
            "rl:{sms:al{ice}",
            "rl:{sms:al:ice}",
            "",
        ] {
            assert_eq!(KeyRef::parse(text), None, "{text}");
        }
    }
}
