//! The one Lua script that decides every algorithm, and its calling convention.
//!
//! The `.lua` files in `lua/` are concatenated into a single script so that a
//! batch mixing algorithms is one `EVALSHA`. See `lua/dispatch.lua` for the
//! argument layout.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};
use rl_core::{BackendError, Decision, Figures, Request};

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
const EXACT_LIMIT: u64 = rl_grammar::DOUBLE_EXACT;

/// Integers per decision in the script's reply.
const DECISION_WIDTH: usize = 5;

/// What the script is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    /// Acquire, replaying the reply kept under a request-id key.
    AcquireOnce,
    Peek,
    Refund,
    /// Refund, dropping a request-id key.
    RefundOnce,
    Reset,
}

impl Op {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::AcquireOnce => "acquire_once",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::RefundOnce => "refund_once",
            Op::Reset => "reset",
        }
    }

    /// Whether the reply carries one decision per request.
    const fn decides(self) -> bool {
        matches!(self, Op::Acquire | Op::AcquireOnce | Op::Peek)
    }

    /// Whether the call takes a request-id key (the last key).
    pub(crate) const fn takes_request_id(self) -> bool {
        matches!(self, Op::AcquireOnce | Op::RefundOnce)
    }
}

/// The request-id key of an idempotent call whose first request is under
/// `key`: `<key>:req:<id>`, the id escaped like identities (`%`, `{`, `}`
/// and `:` become `%25`, `%7B`, `%7D` and `%3A`), so it shares the key's
/// hash slot and two ids never share a key.
pub(crate) fn request_id_key(key: &rl_core::Key, request_id: &str) -> String {
    let mut out = String::with_capacity(key.as_str().len() + 5 + request_id.len());
    out.push_str(key.as_str());
    out.push_str(":req:");
    for c in request_id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out
}

/// Whose clock decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// The server's `TIME`.
    Server,
    /// A time supplied by the client, in microseconds since the epoch.
    Client(u64),
}

/// The storage key of one request: `<key>:<suffix>` with the limit's
/// [`rl_core::Limit::write_storage_suffix`] (`<algorithm>:<period_us>`, and
/// the slot count for the sliding-window counter).
fn state_key(request: &Request<'_>) -> String {
    let mut key = String::with_capacity(request.key.as_str().len() + 32);
    key.push_str(request.key.as_str());
    key.push(':');
    request.limit.write_storage_suffix(&mut key);
    key
}

/// Where the keys and arguments of one call go, in script order: straight
/// into a [`ScriptInvocation`] (each argument written once, numbers without
/// an intermediate `String`), or into a [`Call`] to look at.
trait Sink {
    fn key(&mut self, key: &str);
    fn text(&mut self, arg: &str);
    fn number(&mut self, arg: u64);
}

impl Sink for ScriptInvocation<'_> {
    fn key(&mut self, key: &str) {
        ScriptInvocation::key(self, key);
    }
    fn text(&mut self, arg: &str) {
        ScriptInvocation::arg(self, arg);
    }
    fn number(&mut self, arg: u64) {
        ScriptInvocation::arg(self, arg);
    }
}

/// Writes every key and argument of one call (see `lua/dispatch.lua`).
fn write_call(
    sink: &mut impl Sink,
    op: Op,
    time: Time,
    at_micros: u64,
    extra_ttl_ms: u64,
    requests: &[Request<'_>],
    request_id_key: Option<&str>,
) {
    sink.text(op.name());
    match time {
        Time::Server => sink.text("s"),
        Time::Client(now) => sink.number(now),
    }
    sink.number(at_micros);
    sink.number(extra_ttl_ms);
    for request in requests {
        let limit = request.limit;
        let mut key = state_key(request);
        sink.key(&key);
        if limit.algorithm() == rl_core::Algorithm::SlidingLog {
            key.push_str(":seq");
            sink.key(&key);
        }
        sink.text(limit.algorithm().code());
        sink.number(limit.threshold());
        sink.number(limit.period_micros());
        sink.number(limit.burst());
        sink.number(limit.slots());
        // Costs are validated (<= capacity) except for refunds, where
        // anything above 2^53 empties the state all the same.
        sink.number(request.cost.min(EXACT_LIMIT));
    }
    if let Some(key) = request_id_key {
        sink.key(key);
    }
}

/// The script invocation of one call, ready to send. `request_id_key` is
/// the last key of an [`Op::AcquireOnce`] or [`Op::RefundOnce`] call (see
/// [`request_id_key`]).
pub(crate) fn invocation(
    op: Op,
    time: Time,
    at_micros: u64,
    extra_ttl_ms: u64,
    requests: &[Request<'_>],
    request_id_key: Option<&str>,
) -> ScriptInvocation<'static> {
    let mut invocation = SCRIPT.prepare_invoke();
    write_call(
        &mut invocation,
        op,
        time,
        at_micros,
        extra_ttl_ms,
        requests,
        request_id_key,
    );
    invocation
}

/// Every key and argument of one call, in script order, as text (for tests
/// and tools; calls are sent with [`invocation`]).
#[derive(Debug, Default)]
pub(crate) struct Call {
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

impl Sink for Call {
    fn key(&mut self, key: &str) {
        self.keys.push(key.to_owned());
    }
    fn text(&mut self, arg: &str) {
        self.args.push(arg.to_owned());
    }
    fn number(&mut self, arg: u64) {
        self.args.push(arg.to_string());
    }
}

impl Call {
    pub(crate) fn new(
        op: Op,
        time: Time,
        at_micros: u64,
        extra_ttl_ms: u64,
        requests: &[Request<'_>],
    ) -> Self {
        let mut call = Call::default();
        write_call(&mut call, op, time, at_micros, extra_ttl_ms, requests, None);
        call
    }

    /// Appends the request-id key of an [`Op::AcquireOnce`] or
    /// [`Op::RefundOnce`] call (see [`request_id_key`]).
    #[cfg(test)]
    pub(crate) fn with_request_id_key(mut self, key: String) -> Self {
        self.keys.push(key);
        self
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
    /// The time of the decisions (a replayed reply keeps its original time).
    pub(crate) now: u64,
    /// The script's time at this call (differs from `now` on a replay).
    pub(crate) current: u64,
    /// Whether the decisions are a kept reply of an earlier
    /// [`Op::AcquireOnce`] call.
    pub(crate) replayed: bool,
}

/// Decodes the flat integer reply of a call over `count` requests.
pub(crate) fn parse_reply(op: Op, count: usize, values: &[i64]) -> Result<Reply, BackendError> {
    let (values, replayed, current) = match (op, values) {
        (Op::AcquireOnce, [rest @ .., flag, current]) if matches!(flag, 0 | 1) => {
            (rest, *flag == 1, Some(*current))
        }
        (Op::AcquireOnce, _) => {
            return Err(BackendError::protocol(format_args!(
                "the rate-limit script answered {} integers to acquire_once, without a replay flag",
                values.len()
            )));
        }
        _ => (values, false, None),
    };
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
    let current = current.map_or(Ok(now), unsigned)?;
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
            decisions.push(Decision::new(Figures {
                allowed,
                limit: unsigned(chunk[1])?,
                remaining: unsigned(chunk[2])?,
                retry_after_us: unsigned(chunk[3])?,
                reset_after_us: unsigned(chunk[4])?,
                at_micros: now,
            }));
        }
    }
    Ok(Reply {
        decisions,
        now,
        current,
        replayed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::{Algorithm, Key, Limit};

    #[test]
    fn the_script_is_one_chunk_holding_every_algorithm() {
        for code in ["fw", "sl", "sw", "tb", "lb", "gc"] {
            assert!(
                SOURCE.contains(&format!("LOADERS.{code} =")),
                "missing {code}"
            );
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
            Decision::new(Figures {
                allowed: true,
                limit: 5,
                remaining: 4,
                retry_after_us: 0,
                reset_after_us: 12,
                at_micros: 77
            })
        );
        assert_eq!(
            reply.decisions[1],
            Decision::new(Figures {
                allowed: false,
                limit: 3,
                remaining: 0,
                retry_after_us: 250,
                reset_after_us: 900,
                at_micros: 77
            })
        );
        assert_eq!(parse_reply(Op::Reset, 3, &[9]).unwrap().now, 9);
        let replay = parse_reply(Op::AcquireOnce, 1, &[1, 5, 4, 0, 12, 77, 1, 99]).unwrap();
        assert!(replay.replayed);
        assert_eq!((replay.now, replay.current), (77, 99));
        assert_eq!(replay.decisions[0].at_micros, 77);
        let fresh = parse_reply(Op::AcquireOnce, 1, &[1, 5, 4, 0, 12, 99, 0, 99]).unwrap();
        assert!(!fresh.replayed);
    }

    #[test]
    fn request_id_keys_share_the_slot_of_the_first_key_and_escape_the_id() {
        let key = Key::new("rl", "pay", "alice");
        assert_eq!(
            request_id_key(&key, "a:{b}%"),
            "rl:{pay:alice}:req:a%3A%7Bb%7D%25"
        );
        assert_ne!(request_id_key(&key, "a:b"), request_id_key(&key, "a%3Ab"));
        let call = Call::new(
            Op::AcquireOnce,
            Time::Server,
            0,
            0,
            &[Request::new(&key, &Limit::per_minute(1).unwrap(), 1)],
        )
        .with_request_id_key(request_id_key(&key, "x"));
        assert_eq!(call.keys.last().unwrap(), "rl:{pay:alice}:req:x");
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
        assert!(matches!(
            parse_reply(Op::AcquireOnce, 1, &[1, 5, 4, 0, 12, 77]),
            Err(BackendError::Protocol(_))
        ));
    }
}
