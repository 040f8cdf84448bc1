//! The one Lua script that decides every algorithm, and its calling convention.
//!
//! The `.lua` files in `lua/` are concatenated into a single script so that a
//! batch mixing algorithms is one `EVALSHA`. See `lua/dispatch.lua` for the
//! argument layout.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};
use rl_core::{BackendError, Decision, Request};

/// The full script source.
pub(crate) const SOURCE: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/meter.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/dispatch.lua"),
);

/// Built once: `invoke_async` sends `EVALSHA` and loads the script on `NOSCRIPT`.
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// Lua numbers are doubles: integers are exact below 2^53.
const EXACT_LIMIT: u64 = 1 << 53;

/// Integers per decision in the script's reply.
const DECISION_WIDTH: usize = 5;

/// What the script is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Peek,
    Refund,
    Reset,
}

impl Op {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::Reset => "reset",
        }
    }

    /// Whether the reply carries one decision per request.
    const fn decides(self) -> bool {
        matches!(self, Op::Acquire | Op::Peek)
    }
}

/// Whose clock decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// The server's `TIME`.
    Server,
    /// A time supplied by the client, in microseconds since the epoch.
    Client(u64),
}

/// The storage key of one request: `<key>:<algorithm>:<period_us>`.
fn state_key(request: &Request<'_>) -> String {
    let mut key = String::with_capacity(request.key.as_str().len() + 24);
    key.push_str(request.key.as_str());
    key.push(':');
    key.push_str(&request.limit.storage_suffix());
    key
}

/// Every key and argument of one call, in script order.
#[derive(Debug, Default)]
pub(crate) struct Call {
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

impl Call {
    pub(crate) fn new(
        op: Op,
        time: Time,
        at_micros: u64,
        extra_ttl_ms: u64,
        requests: &[Request<'_>],
    ) -> Self {
        let mut keys = Vec::with_capacity(requests.len() + 1);
        let mut args = Vec::with_capacity(4 + 6 * requests.len());
        args.push(op.name().to_owned());
        args.push(match time {
            Time::Server => "s".to_owned(),
            Time::Client(now) => now.to_string(),
        });
        args.push(at_micros.to_string());
        args.push(extra_ttl_ms.to_string());
        for request in requests {
            let limit = request.limit;
            let key = state_key(request);
            if limit.algorithm() == rl_core::Algorithm::SlidingLog {
                let seq = format!("{key}:seq");
                keys.push(key);
                keys.push(seq);
            } else {
                keys.push(key);
            }
            args.push(limit.algorithm().code().to_owned());
            args.push(limit.threshold().to_string());
            args.push(limit.period_micros().to_string());
            args.push(limit.burst().to_string());
            args.push(limit.slots().to_string());
            // Costs are validated (<= capacity) except for refunds, where
            // anything above 2^53 empties the state all the same.
            args.push(request.cost.min(EXACT_LIMIT).to_string());
        }
        Self { keys, args }
    }

    pub(crate) fn invocation(&self) -> ScriptInvocation<'static> {
        let mut invocation = SCRIPT.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        for arg in &self.args {
            invocation.arg(arg);
        }
        invocation
    }

    /// The full `EVALSHA` command line (for tools such as `redis-benchmark`).
    pub(crate) fn command_line(&self) -> Vec<String> {
        let mut line = Vec::with_capacity(3 + self.keys.len() + self.args.len());
        line.push("EVALSHA".to_owned());
        line.push(SCRIPT.get_hash().to_owned());
        line.push(self.keys.len().to_string());
        line.extend(self.keys.iter().cloned());
        line.extend(self.args.iter().cloned());
        line
    }
}

/// A decoded script reply: the decisions (acquire, peek) and the time used.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) decisions: Vec<Decision>,
    pub(crate) now: u64,
}

/// Decodes the flat integer reply of a call over `count` requests.
pub(crate) fn parse_reply(op: Op, count: usize, values: &[i64]) -> Result<Reply, BackendError> {
    let expected = if op.decides() {
        count * DECISION_WIDTH + 1
    } else {
        1
    };
    if values.len() != expected {
        return Err(BackendError::protocol(format_args!(
            "the rate-limit script answered {} integers to {} of {count} limit(s), expected {expected}",
            values.len(),
            op.name()
        )));
    }
    let unsigned = |value: i64| {
        u64::try_from(value).map_err(|_| {
            BackendError::protocol(format_args!(
                "the rate-limit script answered a negative value ({value}) to {}",
                op.name()
            ))
        })
    };
    let now = unsigned(values[values.len() - 1])?;
    let mut decisions = Vec::with_capacity(if op.decides() { count } else { 0 });
    if op.decides() {
        for chunk in values[..values.len() - 1].chunks_exact(DECISION_WIDTH) {
            let allowed = match chunk[0] {
                0 => false,
                1 => true,
                other => {
                    return Err(BackendError::protocol(format_args!(
                        "the rate-limit script answered {other} for `allowed`, expected 0 or 1"
                    )));
                }
            };
            decisions.push(Decision::from_micros(
                allowed,
                unsigned(chunk[1])?,
                unsigned(chunk[2])?,
                unsigned(chunk[3])?,
                unsigned(chunk[4])?,
                now,
            ));
        }
    }
    Ok(Reply { decisions, now })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::{Algorithm, Key, Limit};

    #[test]
    fn the_script_is_one_chunk_holding_every_algorithm() {
        for code in ["fw", "sl", "sw", "tb", "lb", "gc"] {
            assert!(SOURCE.contains(&format!("ALG.{code} =")), "missing {code}");
        }
        assert_eq!(SCRIPT.get_hash().len(), 40);
    }

    #[test]
    fn keys_carry_the_limit_suffix_and_the_sliding_log_gets_a_sequence_key() {
        let key = Key::new("rl", "sms", "+33 6");
        let log = Limit::per_minute(3)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        let gcra = Limit::per_hour(5).unwrap();
        let call = Call::new(
            Op::Acquire,
            Time::Server,
            0,
            0,
            &[Request::new(&key, &log, 1), Request::new(&key, &gcra, 2)],
        );
        assert_eq!(
            call.keys,
            [
                "rl:{sms:+33 6}:sl:60000000",
                "rl:{sms:+33 6}:sl:60000000:seq",
                "rl:{sms:+33 6}:gc:3600000000"
            ]
        );
        assert_eq!(
            call.args,
            [
                "acquire",
                "s",
                "0",
                "0",
                "sl",
                "3",
                "60000000",
                "3",
                "10",
                "1",
                "gc",
                "5",
                "3600000000",
                "5",
                "10",
                "2"
            ]
        );
        let client = Call::new(
            Op::Refund,
            Time::Client(42),
            7,
            1000,
            &[Request::new(&key, &gcra, 1)],
        );
        assert_eq!(&client.args[..4], ["refund", "42", "7", "1000"]);
        assert_eq!(
            client.command_line()[..3],
            [
                "EVALSHA".to_owned(),
                SCRIPT.get_hash().to_owned(),
                "1".to_owned()
            ]
        );
    }

    #[test]
    fn replies_decode_into_decisions_stamped_with_the_script_time() {
        let reply = parse_reply(Op::Acquire, 2, &[1, 5, 4, 0, 12, 0, 3, 0, 250, 900, 77]).unwrap();
        assert_eq!(reply.now, 77);
        assert_eq!(
            reply.decisions[0],
            Decision::from_micros(true, 5, 4, 0, 12, 77)
        );
        assert_eq!(
            reply.decisions[1],
            Decision::from_micros(false, 3, 0, 250, 900, 77)
        );
        assert_eq!(parse_reply(Op::Reset, 3, &[9]).unwrap().now, 9);
    }

    #[test]
    fn malformed_replies_are_protocol_errors_not_panics() {
        assert!(matches!(
            parse_reply(Op::Peek, 1, &[1, 2]),
            Err(BackendError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(Op::Peek, 1, &[2, 1, 1, 0, 0, 5]),
            Err(BackendError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(Op::Peek, 1, &[1, -1, 1, 0, 0, 5]),
            Err(BackendError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(Op::Refund, 1, &[]),
            Err(BackendError::Protocol(_))
        ));
    }
}
