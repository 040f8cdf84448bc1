//! The Lua code that decides, and its calling convention.
//!
//! The `.lua` files in `lua/` are assembled two ways from the same sources:
//!
//! - **A Redis Functions library** (Redis ≥ 7, [`library_source`]): loaded
//!   once per server with `FUNCTION LOAD`; its top level (every algorithm's
//!   module, every entry point) runs once, at load time, and a call
//!   (`FCALL`, `FCALL_RO` for peeks) runs only its own entry point. One
//!   function per algorithm and operation for single-limit calls
//!   (`<library>_gc_acquire`, `_peek`, `_refund`, ...) and `<library>_batch`
//!   (`_batch_ro` for peeks) for multi-limit, idempotent and reset calls;
//!   `<library>_many` (`_many_ro`) for the calls of several callers
//!   coalesced into one (`crate::coalesce`, [`SubCall`]).
//! - **Scripts** (`EVALSHA`, for Redis < 7 and servers that refuse
//!   functions): one script per entry point, holding only the code that
//!   entry needs (a single-limit script holds one algorithm); and the
//!   coalesced entries `many`, `many_ro` and `many_node` as three scripts
//!   holding every algorithm ([`many_command`], `lua/many_script.lua`).
//!
//! Both take the same keys and arguments and give the same replies (see
//! `lua/single.lua` and `lua/batch.lua`); [`Entry`] names an entry point and
//! [`Via`] how it is invoked.

use std::fmt;
use std::sync::LazyLock;

use ratewall::{
    Algorithm, Decision,
    backend::{Decisions, Figures, Request, Reservation},
    error::BackendError,
};
use redis::Cmd;

const PRELUDE: &str = include_str!("lua/prelude.lua");
const SINGLE: &str = include_str!("lua/single.lua");
const REQUESTS: &str = include_str!("lua/requests.lua");
const BLOCK: &str = include_str!("lua/block.lua");
const BATCH: &str = include_str!("lua/batch.lua");
const LEASE: &str = include_str!("lua/lease.lua");
const MANY: &str = include_str!("lua/many.lua");
const MANY_SCRIPT: &str = include_str!("lua/many_script.lua");
const LIBRARY: &str = include_str!("lua/library.lua");

/// The source of the Lua module named `module` (an algorithm's
/// [`lua_module`](ratewall_grammar::Traits::lua_module): `lua/<module>.lua`).
fn module_source(module: &str) -> Option<&'static str> {
    Some(match module {
        "fixed_window" => include_str!("lua/fixed_window.lua"),
        "sliding_log" => include_str!("lua/sliding_log.lua"),
        "sliding_window" => include_str!("lua/sliding_window.lua"),
        "meter" => include_str!("lua/meter.lua"),
        "gcra" => include_str!("lua/gcra.lua"),
        "in_flight" => include_str!("lua/in_flight.lua"),
        _ => return None,
    })
}

/// The Lua modules of every algorithm, each once, in [`Algorithm::EVERY`]
/// order (a module may define several algorithms: `meter` holds both
/// buckets). An algorithm whose module has no source is an error at the
/// first use of the code (and in this crate's tests).
fn modules() -> Vec<&'static str> {
    let mut modules: Vec<&'static str> = Vec::new();
    for algorithm in Algorithm::EVERY {
        let module = algorithm.traits().lua_module;
        if !modules.contains(&module) {
            modules.push(module);
        }
    }
    modules
}

/// The source of `algorithm`'s module.
fn algorithm_source(algorithm: Algorithm) -> &'static str {
    module_source(algorithm.traits().lua_module).unwrap_or("")
}

/// A Lua table generated from the grammar's table of algorithms
/// ([`Algorithm::traits`]), so no `.lua` file restates a property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    /// `CODES`: the rate algorithms' codes, in order (the library registers
    /// one function per code and operation).
    Codes,
    /// `SINGLE_THIRD`: per code, the request field its third limit number
    /// fills (`b`: burst, `slots`), for the codes that take one.
    SingleThird,
    /// `RESERVES`: the codes that reserve slots for waiting calls.
    Reserves,
    /// `LEASES`: the codes whose units can be leased.
    Leases,
}

/// The Lua source defining `tables` as locals.
fn lua_tables(tables: &[Table]) -> String {
    let codes = |keep: fn(&Algorithm) -> bool, value: fn(Algorithm) -> &'static str| {
        Algorithm::EVERY
            .into_iter()
            .filter(keep)
            .map(|a| format!("['{}'] = {}", a.code(), value(a)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::from(
        "-- Generated from the grammar's table of algorithms (rl-redis/src/script.rs).\n",
    );
    for table in tables {
        let line = match table {
            Table::Codes => format!(
                "local CODES = {{ {} }}",
                Algorithm::ALL.map(|a| format!("'{}'", a.code())).join(", ")
            ),
            Table::SingleThird => format!(
                "local SINGLE_THIRD = {{ {} }}",
                codes(
                    |a| a.uses_burst() || a.uses_slots(),
                    |a| if a.uses_slots() { "'slots'" } else { "'b'" }
                )
            ),
            Table::Reserves => format!(
                "local RESERVES = {{ {} }}",
                codes(|a| a.reserves(), |_| "true")
            ),
            Table::Leases => format!("local LEASES = {{ {} }}", codes(|a| a.leases(), |_| "true")),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Lua numbers are doubles: integers are exact below 2^53.
const EXACT_LIMIT: u64 = ratewall_grammar::DOUBLE_EXACT;

/// Integers per decision in a reply.
const DECISION_WIDTH: usize = 5;

/// What a call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    /// Acquire, replaying the reply kept under a request-id key.
    AcquireOnce,
    Peek,
    /// Decide like an acquire's first pass: nothing taken, each refusing
    /// limit that blocks blocked (`lua/batch.lua`, `probe`).
    Probe,
    /// The blocks of one identity (`lua/block.lua`): one key, no request.
    Blocks,
    /// Lift every block of one identity: one key, no request.
    Unblock,
    Refund,
    /// Refund, dropping a request-id key.
    RefundOnce,
    /// Take back a call given up on, by its request id (see
    /// `lua/batch.lua`, `cancel_once`).
    CancelOnce,
    /// Take each request's cost on top of its state (a settled cost's
    /// debt; `lua/batch.lua`, `charge`).
    Charge,
    /// Raise each request's state so that at most its cost (units left)
    /// remains `at` us from now (`lua/batch.lua`, `hold`).
    Hold,
    Reset,
    /// Acquire, leasing extra units of rate limits (quota leasing, `lua/lease.lua`).
    Lease,
    /// Give a quota lease's unused units back (`lua/lease.lua`).
    Release,
    /// Reserve a slot for a waiting call (`at`: the longest wait, µs).
    Reserve,
    /// Give back a reservation (`at`: its slot).
    Cancel,
    /// Renew the leases of in-flight slots (not quota leases).
    Renew,
}

impl Op {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::AcquireOnce => "acquire_once",
            Op::Peek => "peek",
            Op::Probe => "probe",
            Op::Blocks => "blocks",
            Op::Unblock => "unblock",
            Op::Refund => "refund",
            Op::RefundOnce => "refund_once",
            Op::CancelOnce => "cancel_once",
            Op::Charge => "charge",
            Op::Hold => "hold",
            Op::Reset => "reset",
            Op::Lease => "lease",
            Op::Release => "release",
            Op::Reserve => "reserve",
            Op::Cancel => "cancel",
            Op::Renew => "renew",
        }
    }

    /// Whether the call also names each reserving state's key of given-back
    /// slots (`<state key>:freed`), after its state key.
    const fn names_freed(self) -> bool {
        matches!(self, Op::Reserve | Op::Cancel | Op::Reset)
    }

    /// Whether each request carries two more fields: for a reserve, the
    /// earliest allowed slot and 0; for a cancel, whether the limit took a
    /// given-back slot and the mark its decision left.
    const fn extended(self) -> bool {
        matches!(self, Op::Reserve | Op::Cancel)
    }

    /// Whether the reply carries one decision per request.
    const fn decides(self) -> bool {
        matches!(
            self,
            Op::Acquire | Op::AcquireOnce | Op::Peek | Op::Probe | Op::Lease
        )
    }

    /// Integers per request in the reply: a decision, and for a lease the
    /// units granted.
    const fn width(self) -> usize {
        match self {
            Op::Lease => DECISION_WIDTH + 1,
            _ => DECISION_WIDTH,
        }
    }

    /// Whether the call takes a request-id key (the last key).
    pub(crate) const fn takes_request_id(self) -> bool {
        matches!(self, Op::AcquireOnce | Op::RefundOnce | Op::CancelOnce)
    }

    /// Whether the call carries a notice origin (`crate::notices`): the
    /// operations that give room back and tell the other processes so
    /// (one `PUBLISH` per key that got something back, unless the origin
    /// is empty; [`Op::Unblock`]: the identity's key, when it lifted a
    /// block). A refund that compensates a refused call over several
    /// hash tags is an [`Op::Refund`] sent with an empty origin.
    pub(crate) const fn tells(self) -> bool {
        matches!(self, Op::Refund | Op::CancelOnce | Op::Reset | Op::Unblock)
    }

    /// Whether a call may be coalesced with other callers' calls
    /// (`crate::coalesce`): acquires (idempotent ones too), peeks (ahead
    /// too), refunds, charges and holds, the calls of a decision and of
    /// settling its cost. The others (probes, resets, cancels by request
    /// id, renewals, blocks, leases, reservations) go alone.
    pub(crate) const fn coalesces(self) -> bool {
        matches!(
            self,
            Op::Acquire | Op::AcquireOnce | Op::Peek | Op::Refund | Op::Charge | Op::Hold
        )
    }
}

/// An entry point of the Lua code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// One limit of one algorithm (`lua/single.lua`): acquire, peek or refund.
    Single(Op, Algorithm),
    /// Any batch, any operation (`lua/batch.lua`).
    Batch,
    /// A batch peek, read-only (`FCALL_RO`).
    BatchReadOnly,
    /// Leases taken and given back (`lua/lease.lua`).
    Lease,
}

/// The single-limit operations that have their own entry points.
const SINGLE_OPS: [Op; 3] = [Op::Acquire, Op::Peek, Op::Refund];

impl Entry {
    /// The entry point deciding `op` over `count` requests, the first of
    /// algorithm `first`.
    pub(crate) fn for_call(op: Op, count: usize, first: Option<Algorithm>) -> Self {
        match (count, first) {
            _ if matches!(op, Op::Lease | Op::Release) => Entry::Lease,
            _ if op == Op::Blocks => Entry::BatchReadOnly,
            (1, Some(algorithm)) if SINGLE_OPS.contains(&op) && !algorithm.is_in_flight() => {
                Entry::Single(op, algorithm)
            }
            _ if op == Op::Peek => Entry::BatchReadOnly,
            _ => Entry::Batch,
        }
    }

    /// Its position in [`Code::entries`].
    fn index(self) -> usize {
        match self {
            Entry::Single(op, algorithm) => {
                let a = Algorithm::ALL
                    .iter()
                    .position(|&x| x == algorithm)
                    .unwrap_or(0);
                let o = SINGLE_OPS.iter().position(|&x| x == op).unwrap_or(0);
                a * SINGLE_OPS.len() + o
            }
            Entry::Batch => Algorithm::ALL.len() * SINGLE_OPS.len(),
            Entry::BatchReadOnly => Algorithm::ALL.len() * SINGLE_OPS.len() + 1,
            Entry::Lease => Algorithm::ALL.len() * SINGLE_OPS.len() + 2,
        }
    }

    /// Whether it never writes (sent with `FCALL_RO`).
    pub(crate) fn read_only(self) -> bool {
        matches!(self, Entry::Single(Op::Peek, _) | Entry::BatchReadOnly)
    }

    /// Its function's name without the library's prefix (`gc_acquire`,
    /// `batch`, ...): how a coalesced call names it (`lua/many.lua`).
    fn function_suffix(self) -> &'static str {
        &entry_code(self).function[library_name().len() + 1..]
    }

    /// The command invoking it `via`, up to its key count.
    fn invocation(self, via: Via) -> Cmd {
        entry_code(self).invocation(via, self.read_only())
    }

    fn every() -> impl Iterator<Item = Entry> {
        Algorithm::ALL
            .into_iter()
            .flat_map(|a| SINGLE_OPS.into_iter().map(move |op| Entry::Single(op, a)))
            .chain([Entry::Batch, Entry::BatchReadOnly, Entry::Lease])
    }
}

/// How an entry point is invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// `FCALL` (`FCALL_RO` for a read-only entry) of the library's function.
    Function,
    /// `EVALSHA` of the entry's script.
    ScriptSha,
    /// `EVAL` of the entry's script source: works whatever the server has
    /// cached, and caches the script.
    ScriptSource,
}

/// One entry point's names and code.
struct EntryCode {
    function: String,
    script: String,
    sha: String,
}

impl EntryCode {
    /// The command invoking this code `via` (`FCALL_RO` when `read_only`),
    /// up to its key count.
    fn invocation(&self, via: Via, read_only: bool) -> Cmd {
        let mut cmd = match via {
            Via::Function if read_only => redis::cmd("FCALL_RO"),
            Via::Function => redis::cmd("FCALL"),
            Via::ScriptSha => redis::cmd("EVALSHA"),
            Via::ScriptSource => redis::cmd("EVAL"),
        };
        match via {
            Via::Function => cmd.arg(&self.function),
            Via::ScriptSha => cmd.arg(&self.sha),
            Via::ScriptSource => cmd.arg(&self.script),
        };
        cmd
    }
}

/// Everything assembled from the `.lua` files, once per process.
struct Code {
    library_name: String,
    library: String,
    entries: Vec<EntryCode>,
    /// The coalesced entries as scripts (`lua/many_script.lua`), by
    /// [`Many`]. Their `function` is the library's.
    many: [EntryCode; 3],
}

/// Redis < 5 replicates scripts verbatim, which forbids TIME before a
/// write unless the script asks for effects replication; >= 5 always does
/// (and 7 announces itself with REDIS_VERSION, where the call is skipped).
const SCRIPT_HEADER: &str = "if redis.replicate_commands and not redis.REDIS_VERSION then\n  redis.replicate_commands()\nend\n";

fn sha1(text: &str) -> String {
    redis::Script::new(text).get_hash().to_owned()
}

static CODE: LazyLock<Code> = LazyLock::new(|| {
    let algorithms: String = modules()
        .into_iter()
        .map(|m| module_source(m).unwrap_or(""))
        .collect();
    let body = [PRELUDE, &algorithms, SINGLE, REQUESTS, BLOCK, BATCH].concat();
    let every = [
        Table::Codes,
        Table::SingleThird,
        Table::Reserves,
        Table::Leases,
    ];
    // The library's name carries a hash of everything it runs, so another
    // version of this crate on the same server has other function names.
    let tables = lua_tables(&every);
    let tag = &sha1(&[tables.as_str(), body.as_str(), LEASE, MANY, LIBRARY].concat())[..12];
    let library_name = format!("rl_{tag}");
    let library = format!(
        "#!lua name={library_name}\nlocal RL_PREFIX = '{library_name}_'\n{tables}{body}{LEASE}{MANY}{LIBRARY}"
    );
    let entries = Entry::every()
        .map(|entry| {
            let (source, tail) = match entry {
                Entry::Single(op, algorithm) => {
                    let code = algorithm.code();
                    let call = match op {
                        Op::Refund => format!("single_refund(LOADERS.{code}(), '{code}')"),
                        _ => format!(
                            "single_decide(LOADERS.{code}(), '{code}', {})",
                            op == Op::Acquire
                        ),
                    };
                    (
                        [
                            SCRIPT_HEADER,
                            &lua_tables(&[Table::SingleThird]),
                            PRELUDE,
                            algorithm_source(algorithm),
                            SINGLE,
                        ]
                        .concat(),
                        format!("return {call}(KEYS, ARGV)\n"),
                    )
                }
                Entry::Batch | Entry::BatchReadOnly => (
                    [SCRIPT_HEADER, &tables, body.as_str()].concat(),
                    "return batch(KEYS, ARGV)\n".to_owned(),
                ),
                Entry::Lease => (
                    [
                        SCRIPT_HEADER,
                        &tables,
                        PRELUDE,
                        &algorithms,
                        REQUESTS,
                        LEASE,
                    ]
                    .concat(),
                    "return lease(KEYS, ARGV)\n".to_owned(),
                ),
            };
            let function = match entry {
                Entry::Single(op, algorithm) => {
                    format!("{library_name}_{}_{}", algorithm.code(), op.name())
                }
                Entry::Batch => format!("{library_name}_batch"),
                Entry::BatchReadOnly => format!("{library_name}_batch_ro"),
                Entry::Lease => format!("{library_name}_lease"),
            };
            let script = source + &tail;
            let sha = sha1(&script);
            EntryCode {
                function,
                script,
                sha,
            }
        })
        .collect();
    let many = Many::EVERY.map(|many| {
        let name = many.name();
        let script = [
            SCRIPT_HEADER,
            &tables,
            body.as_str(),
            MANY,
            MANY_SCRIPT,
            &format!("return {name}(KEYS, ARGV)\n"),
        ]
        .concat();
        EntryCode {
            function: format!("{library_name}_{name}"),
            sha: sha1(&script),
            script,
        }
    });
    Code {
        library_name,
        library,
        entries,
        many,
    }
});

fn entry_code(entry: Entry) -> &'static EntryCode {
    &CODE.entries[entry.index()]
}

/// The Functions library's source, `#!lua name=...` line included.
pub(crate) fn library_source() -> &'static str {
    &CODE.library
}

/// The Functions library's name (`rl_<hash of its code>`).
pub(crate) fn library_name() -> &'static str {
    &CODE.library_name
}

/// The batch script's source (what `EVALSHA` runs for multi-limit calls).
pub(crate) fn batch_script_source() -> &'static str {
    &entry_code(Entry::Batch).script
}

/// A coalesced entry (`lua/many.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Many {
    /// `many`: calls that may write, on one server.
    Any,
    /// `many_ro`: read-only calls, on one server.
    ReadOnly,
    /// `many_node`: single-limit acquires on a Redis Cluster node.
    Node,
}

impl Many {
    const EVERY: [Many; 3] = [Many::Any, Many::ReadOnly, Many::Node];

    /// Its name (without the library's prefix).
    fn name(self) -> &'static str {
        match self {
            Many::Any => "many",
            Many::ReadOnly => "many_ro",
            Many::Node => "many_node",
        }
    }

    fn code(self) -> &'static EntryCode {
        &CODE.many[self as usize]
    }

    /// The command invoking it `via`, up to its key count.
    fn invocation(self, via: Via) -> Cmd {
        self.code().invocation(via, self == Many::ReadOnly)
    }
}

/// The source of the script of a coalesced entry (`lua/many_script.lua`).
pub(crate) fn many_script_source(many: Many) -> &'static str {
    &many.code().script
}

/// The batch script's SHA1.
pub(crate) fn batch_script_sha() -> &'static str {
    &entry_code(Entry::Batch).sha
}

/// `FUNCTION LOAD REPLACE <library>`.
pub(crate) fn load_library_command() -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(library_source());
    cmd
}

/// The request-id key of an idempotent call whose first request is under
/// `key`: `<key>:req:<id>`, the id escaped like identities (`%`, `{`, `}`
/// and `:` become `%25`, `%7B`, `%7D` and `%3A`), so it shares the key's
/// hash slot and two ids never share a key.
pub(crate) fn request_id_key(key: &ratewall::Key, request_id: &str) -> String {
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

/// The suffix of a state key's lease records (`<state key>:leases`).
pub(crate) const LEASES_SUFFIX: &str = ":leases";

/// The key of an identity's blocks (`lua/block.lua`): `<key>:b`, beside
/// (and in the hash slot of) its state keys `<key>:<algorithm>:...`, which
/// it cannot be: no algorithm's code is `b`.
pub(crate) fn block_key(key: &ratewall::Key) -> String {
    let mut out = String::with_capacity(key.as_str().len() + 2);
    out.push_str(key.as_str());
    out.push_str(":b");
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
/// [`ratewall::Limit::write_storage_suffix`] (`<algorithm>:<period_us>`, and
/// the slot count for the sliding-window counter).
fn state_key(request: &Request<'_>) -> String {
    let mut key = String::with_capacity(request.key.as_str().len() + 32);
    key.push_str(request.key.as_str());
    key.push(':');
    request.limit.write_storage_suffix(&mut key);
    key
}

/// Where the keys and arguments of one call go, in order: straight into a
/// [`Cmd`] (each written once, numbers without an intermediate `String`),
/// or into a [`Call`] to look at.
trait Sink {
    fn key(&mut self, key: &str);
    fn text(&mut self, arg: &str);
    fn number(&mut self, arg: u64);
}

/// Writes into a command (keys and arguments alike are arguments there).
struct CmdSink<'c>(&'c mut Cmd);

impl Sink for CmdSink<'_> {
    fn key(&mut self, key: &str) {
        self.0.arg(key);
    }
    fn text(&mut self, arg: &str) {
        self.0.arg(arg);
    }
    fn number(&mut self, arg: u64) {
        self.0.arg(arg);
    }
}

/// One call: the operation, its time and requests, and how to write it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan<'p, 'r> {
    pub(crate) op: Op,
    pub(crate) entry: Entry,
    time: Time,
    at_micros: u64,
    extra_ttl_ms: u64,
    requests: &'p [Request<'r>],
    request_id_key: Option<&'p str>,
    /// Per request, for [`Entry::Lease`]: the lease call's three numbers.
    lease: Option<&'p [[u64; 3]]>,
    /// How long the caller uses a lease at most (µs), for [`Entry::Lease`].
    lease_ttl_us: u64,
    /// Per request, the two extra fields of a reserve or cancel.
    extra: Option<&'p [(u64, u64)]>,
    /// The one key of [`Op::Blocks`] and [`Op::Unblock`] (see [`block_key`]).
    block_key: Option<&'p str>,
    /// The notice origin of an operation that [`Op::tells`] (empty: tell
    /// nothing).
    origin: &'p str,
}

impl<'p, 'r> Plan<'p, 'r> {
    /// A lease call ([`Op::Lease`] or [`Op::Release`]): per request, the
    /// extra units asked for (then two zeros), or the lease's time, stamp
    /// and granted units; `ttl_us` is how long leases are used at most.
    pub(crate) fn lease(
        op: Op,
        time: Time,
        extra_ttl_ms: u64,
        requests: &'p [Request<'r>],
        numbers: &'p [[u64; 3]],
        ttl_us: u64,
    ) -> Self {
        Self {
            lease: Some(numbers),
            lease_ttl_us: ttl_us,
            ..Self::new(op, time, 0, extra_ttl_ms, requests, None)
        }
    }

    /// `request_id_key` is the last key of an [`Op::AcquireOnce`] or
    /// [`Op::RefundOnce`] call (see [`request_id_key`]).
    pub(crate) fn new(
        op: Op,
        time: Time,
        at_micros: u64,
        extra_ttl_ms: u64,
        requests: &'p [Request<'r>],
        request_id_key: Option<&'p str>,
    ) -> Self {
        // A peek ahead (`at_micros` from now) is the batch's: the single
        // entry points decide at the server's time only; so are in-flight
        // limits and limits that block.
        let entry = if requests
            .iter()
            .any(|r| r.limit.is_in_flight() || r.limit.block_micros() > 0)
            || (op == Op::Peek && at_micros > 0)
        {
            Entry::for_call(op, 2, None)
        } else {
            Entry::for_call(
                op,
                requests.len(),
                requests.first().map(|r| r.limit.algorithm()),
            )
        };
        Self {
            op,
            entry,
            time,
            at_micros,
            extra_ttl_ms,
            requests,
            request_id_key,
            lease: None,
            lease_ttl_us: 0,
            extra: None,
            origin: "",
            block_key: None,
        }
    }

    /// [`Op::Blocks`] or [`Op::Unblock`] of the identity whose block key is
    /// `key` (see [`block_key`]).
    pub(crate) fn blocks(op: Op, time: Time, extra_ttl_ms: u64, key: &'p str) -> Self {
        Self {
            block_key: Some(key),
            ..Self::new(op, time, 0, extra_ttl_ms, &[], None)
        }
    }

    /// The same call, telling the other processes of what it gives back
    /// as `origin` (see `crate::notices`; only for an operation that
    /// [`Op::tells`], ignored otherwise).
    pub(crate) fn telling(self, origin: &'p str) -> Self {
        Self { origin, ..self }
    }

    /// A reserve ([`Op::Reserve`], `at`: the longest wait) or cancel
    /// ([`Op::Cancel`], `at`: the slot) with its per-request fields.
    pub(crate) fn reservation(
        op: Op,
        time: Time,
        at_micros: u64,
        extra_ttl_ms: u64,
        requests: &'p [Request<'r>],
        extra: &'p [(u64, u64)],
    ) -> Self {
        Self {
            extra: Some(extra),
            ..Self::new(op, time, at_micros, extra_ttl_ms, requests, None)
        }
    }

    /// How many requests the call carries.
    pub(crate) fn count(&self) -> usize {
        self.requests.len()
    }

    /// Whether `request` names its identity's block key (`lua/batch.lua`):
    /// a batch request with a block, and every request of a reset.
    fn names_block(&self, request: &Request<'_>) -> bool {
        matches!(self.entry, Entry::Batch | Entry::BatchReadOnly)
            && (request.limit.block_micros() > 0 || self.op == Op::Reset)
    }

    fn key_count(&self) -> usize {
        let freed = self.op.names_freed();
        self.requests
            .iter()
            .map(|r| {
                let algorithm = r.limit.algorithm();
                1 + usize::from(freed && algorithm.reserves())
                    + usize::from(self.entry == Entry::Lease)
                    + usize::from(self.names_block(r))
            })
            .sum::<usize>()
            + usize::from(self.request_id_key.is_some())
            + usize::from(self.block_key.is_some())
    }

    fn write_keys(&self, sink: &mut impl Sink) {
        let freed = self.op.names_freed();
        for request in self.requests {
            let mut key = state_key(request);
            sink.key(&key);
            let state = key.len();
            if freed && request.limit.algorithm().reserves() {
                key.push_str(":freed");
                sink.key(&key);
            }
            if self.entry == Entry::Lease {
                key.truncate(state);
                key.push_str(LEASES_SUFFIX);
                sink.key(&key);
            }
            if self.names_block(request) {
                sink.key(&block_key(request.key));
            }
        }
        if let Some(key) = self.request_id_key {
            sink.key(key);
        }
        if let Some(key) = self.block_key {
            sink.key(key);
        }
    }

    fn write_time(&self, sink: &mut impl Sink) {
        match self.time {
            Time::Server => sink.text("s"),
            Time::Client(now) => sink.number(now),
        }
    }

    /// Costs are validated (<= capacity) except for refunds, where anything
    /// above 2^53 empties the state all the same.
    fn write_limit(sink: &mut impl Sink, request: &Request<'_>) {
        let limit = request.limit;
        sink.number(limit.threshold());
        sink.number(limit.period_micros());
        sink.number(limit.burst());
        if limit.is_in_flight() {
            // The slot's lease id, as the sorted set's member.
            sink.text(&format!("{:016x}", request.holder));
        } else {
            sink.number(limit.slots());
        }
        sink.number(request.cost.min(EXACT_LIMIT));
    }

    fn write_args(&self, sink: &mut impl Sink) {
        match self.entry {
            Entry::Single(op, _) => {
                // Only what the algorithm reads; the time and the extra
                // TTL only when they differ from their defaults (the
                // server's TIME, 0): every argument costs the server about
                // as much as a line of Lua (`lua/single.lua`).
                let request = &self.requests[0];
                let limit = request.limit;
                sink.number(limit.threshold());
                sink.number(limit.period_micros());
                if limit.algorithm().uses_slots() {
                    sink.number(limit.slots());
                } else if limit.algorithm().uses_burst() {
                    sink.number(limit.burst());
                }
                sink.number(request.cost.min(EXACT_LIMIT));
                if op == Op::Refund {
                    sink.number(self.at_micros);
                    sink.text(self.origin);
                }
                if self.time != Time::Server || self.extra_ttl_ms != 0 {
                    self.write_time(sink);
                }
                if self.extra_ttl_ms != 0 {
                    sink.number(self.extra_ttl_ms);
                }
            }
            Entry::Batch | Entry::BatchReadOnly => {
                sink.text(self.op.name());
                self.write_time(sink);
                sink.number(self.at_micros);
                sink.number(self.extra_ttl_ms);
                for (i, request) in self.requests.iter().enumerate() {
                    sink.text(request.limit.algorithm().code());
                    Self::write_limit(sink, request);
                    if self.op.extended() {
                        let (x, y) = self
                            .extra
                            .and_then(|extra| extra.get(i).copied())
                            .unwrap_or((0, 0));
                        sink.number(x);
                        sink.number(y);
                    }
                    sink.number(request.limit.block_micros());
                }
                if self.op.tells() {
                    sink.text(self.origin);
                }
            }
            Entry::Lease => {
                sink.text(self.op.name());
                self.write_time(sink);
                sink.number(self.extra_ttl_ms);
                sink.number(self.lease_ttl_us);
                let numbers = self.lease.unwrap_or_default();
                for (i, request) in self.requests.iter().enumerate() {
                    sink.text(request.limit.algorithm().code());
                    Self::write_limit(sink, request);
                    let [a, b, c] = numbers.get(i).copied().unwrap_or_default();
                    sink.number(a.min(EXACT_LIMIT));
                    sink.number(b.min(EXACT_LIMIT));
                    sink.number(c.min(EXACT_LIMIT));
                }
            }
        }
    }

    /// The command invoking this call's entry point `via`.
    pub(crate) fn command(&self, via: Via) -> Cmd {
        let mut cmd = self.entry.invocation(via);
        cmd.arg(self.key_count());
        let mut sink = CmdSink(&mut cmd);
        self.write_keys(&mut sink);
        self.write_args(&mut sink);
        cmd
    }

    /// The command as text, for tools such as `redis-benchmark`.
    pub(crate) fn command_line(&self, via: Via) -> Vec<String> {
        let code = entry_code(self.entry);
        let mut call = Call::default();
        self.write_keys(&mut call);
        self.write_args(&mut call);
        let command = match via {
            Via::Function if self.entry.read_only() => "FCALL_RO",
            Via::Function => "FCALL",
            Via::ScriptSha => "EVALSHA",
            Via::ScriptSource => "EVAL",
        };
        let name = match via {
            Via::Function => &code.function,
            Via::ScriptSha => &code.sha,
            Via::ScriptSource => &code.script,
        };
        let mut line = vec![
            command.to_owned(),
            name.clone(),
            call.keys.len().to_string(),
        ];
        line.extend(call.keys);
        line.extend(call.args);
        line
    }
}

/// Every key and argument of one call, in order, as text (for tests and
/// tools; calls are sent with [`Plan::command`]).
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
    #[cfg(test)]
    fn of(plan: &Plan<'_, '_>) -> Self {
        let mut call = Call::default();
        plan.write_keys(&mut call);
        plan.write_args(&mut call);
        call
    }
}

/// One caller's call written out to travel inside a coalesced call
/// (`lua/many.lua`): its entry point, and its keys then its arguments,
/// exactly those it would be sent with alone.
pub(crate) struct SubCall {
    entry: Entry,
    keys: usize,
    parts: Cmd,
}

impl fmt::Debug for SubCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the keys and arguments: they hold identities.
        f.debug_struct("SubCall")
            .field("entry", &self.entry)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Plan<'_, '_> {
    /// The identity key of its first request (whose hash slot all its keys
    /// share).
    #[cfg(feature = "cluster")]
    pub(crate) fn first_key(&self) -> Option<&str> {
        self.requests.first().map(|request| request.key.as_str())
    }

    /// This call, to travel inside a coalesced call.
    pub(crate) fn sub_call(&self) -> SubCall {
        let mut parts = Cmd::new();
        let mut sink = CmdSink(&mut parts);
        self.write_keys(&mut sink);
        self.write_args(&mut sink);
        SubCall {
            entry: self.entry,
            keys: self.key_count(),
            parts,
        }
    }
}

impl SubCall {
    /// Its entry point.
    pub(crate) fn entry(&self) -> Entry {
        self.entry
    }

    /// Whether it never writes.
    pub(crate) fn read_only(&self) -> bool {
        self.entry.read_only()
    }

    /// Its first key (which every key of a call shares the hash slot of).
    #[cfg(feature = "cluster")]
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        self.split().0.next()
    }

    /// Its keys, then its arguments.
    fn split(&self) -> (impl Iterator<Item = &[u8]>, impl Iterator<Item = &[u8]>) {
        let parts = self.parts.args_iter().map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            // Never written here (no cursor in a call).
            _ => &[],
        });
        let keys = parts.clone().take(self.keys);
        (keys, parts.skip(self.keys))
    }

    /// How many arguments (after its keys) it carries.
    fn arg_count(&self) -> usize {
        self.parts.args_iter().len() - self.keys
    }

    /// The call alone, invoked `via` (a coalesced call falls back to
    /// [`Via::ScriptSource`] for each of its calls when the library is
    /// missing again after a reload).
    pub(crate) fn command(&self, via: Via) -> Cmd {
        let mut cmd = self.entry.invocation(via);
        cmd.arg(self.keys);
        let (keys, args) = self.split();
        for part in keys.chain(args) {
            cmd.arg(part);
        }
        cmd
    }
}

/// The coalesced call of `calls`, in order, invoked `via` (see
/// `lua/many.lua`): `FCALL <library>_many` (`FCALL_RO <library>_many_ro`
/// when every call is read-only), or `EVALSHA`/`EVAL` of the same entry as
/// a script (`lua/many_script.lua`). Every call's keys, then its groups:
/// per group, its entry's name, the key count, its argument count, its
/// arguments and how many calls it holds.
pub(crate) fn many_command(calls: &[&SubCall], via: Via) -> Cmd {
    let many = if calls.iter().all(|call| call.read_only()) {
        Many::ReadOnly
    } else {
        Many::Any
    };
    let mut cmd = many.invocation(via);
    write_layout(&mut cmd, calls);
    cmd
}

/// The coalesced call of `calls` (single-limit acquires on one Redis
/// Cluster master, see `lua/many.lua`) invoked `via`: `FCALL
/// <library>_many_node 0`, or `EVALSHA`/`EVAL` of its script with no key:
/// no key declared (they may be of several slots), and as arguments the
/// key count, every call's keys, then the groups as in [`many_command`].
#[cfg(feature = "cluster")]
pub(crate) fn many_node_command(calls: &[&SubCall], via: Via) -> Cmd {
    let mut cmd = Many::Node.invocation(via);
    cmd.arg(0);
    write_layout(&mut cmd, calls);
    cmd
}

/// A coalesced call's layout (see [`many_command`]): the count of its
/// calls' keys, the keys, then the groups.
fn write_layout(cmd: &mut Cmd, calls: &[&SubCall]) {
    cmd.arg(calls.iter().map(|call| call.keys).sum::<usize>());
    for call in calls {
        for key in call.split().0 {
            cmd.arg(key);
        }
    }
    write_groups(cmd, calls);
}

/// The groups of a coalesced call's layout (see [`many_command`]).
fn write_groups(cmd: &mut Cmd, calls: &[&SubCall]) {
    let groups: Vec<&[&SubCall]> = calls
        .chunk_by(|first, next| first.same_group(next))
        .collect();
    cmd.arg(groups.len());
    for group in groups {
        let call = group[0];
        cmd.arg(call.entry.function_suffix())
            .arg(call.keys)
            .arg(call.arg_count());
        for arg in call.split().1 {
            cmd.arg(arg);
        }
        cmd.arg(group.len());
    }
}

impl SubCall {
    /// Whether `next` goes in this call's group of a coalesced call: the
    /// same entry, key count and arguments (its keys its own).
    fn same_group(&self, next: &SubCall) -> bool {
        self.entry == next.entry
            && self.keys == next.keys
            && self.arg_count() == next.arg_count()
            && self.split().1.eq(next.split().1)
    }
}

/// Splits the reply of a coalesced call over `count` calls into each
/// call's own reply: its integers, or the error it returned or raised.
///
/// The reply lists, call after call: an array (that call's whole reply),
/// a string (the line of its error), or the reply of a single acquire or
/// peek written out flat (an array per call cost the server about as much
/// as the decision, see `lua/many.lua`): its [`FLAT`] integers, or, when
/// its limit and time are those of the last one written out in full,
/// fewer: refused, -1 - remaining, retry after and reset after; allowed
/// with no wait, remaining + 2 and reset after (a full one starts with 1
/// or 0).
pub(crate) fn parse_many(
    count: usize,
    value: redis::Value,
) -> Result<Vec<redis::RedisResult<Vec<i64>>>, redis::RedisError> {
    let wrong = |detail: String| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the rate-limit code answered a coalesced call with the wrong replies",
            detail,
        ))
    };
    let redis::Value::Array(replies) = value else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the rate-limit code did not answer a coalesced call with an array",
        )));
    };
    let mut out = Vec::with_capacity(count);
    let mut replies = replies.into_iter();
    let next_int = |replies: &mut std::vec::IntoIter<redis::Value>| match replies.next() {
        Some(redis::Value::Int(value)) => Ok(value),
        _ => Err(wrong("a flat reply cut short".to_owned())),
    };
    // The limit and time of the last flat reply written out in full.
    let mut last: Option<(i64, i64)> = None;
    while let Some(reply) = replies.next() {
        if out.len() == count {
            return Err(wrong(format!("more than {count} replies")));
        }
        out.push(match reply {
            redis::Value::BulkString(line) => Err(error_of_line(&line)),
            redis::Value::Int(allowed @ (0 | 1)) => {
                let mut flat = Vec::with_capacity(FLAT);
                flat.push(allowed);
                for _ in 1..FLAT {
                    flat.push(next_int(&mut replies)?);
                }
                last = Some((flat[1], flat[5]));
                Ok(flat)
            }
            redis::Value::Int(first) => {
                let Some((limit, now)) = last else {
                    return Err(wrong("a short flat reply before a full one".to_owned()));
                };
                Ok(if first >= 2 {
                    let reset_after = next_int(&mut replies)?;
                    vec![1, limit, first - 2, 0, reset_after, now]
                } else {
                    let retry_after = next_int(&mut replies)?;
                    let reset_after = next_int(&mut replies)?;
                    vec![0, limit, -1 - first, retry_after, reset_after, now]
                })
            }
            reply => redis::FromRedisValue::from_redis_value(reply).map_err(Into::into),
        });
    }
    if out.len() != count {
        return Err(wrong(format!("{} replies for {count} calls", out.len())));
    }
    Ok(out)
}

/// How many integers a single acquire or peek answers (`lua/single.lua`),
/// written out flat in a coalesced call's reply.
const FLAT: usize = 6;

/// The error whose line (`<CODE> <message>`) a coalesced call answered for
/// one of its calls, read as redis-rs reads an error reply: the error the
/// call alone meets, with its code and message (less the server's note of
/// where in the Lua code an error was raised, `script: ..., on @...`).
fn error_of_line(line: &[u8]) -> redis::RedisError {
    let line = line.strip_prefix(b"-").unwrap_or(line);
    let mut reply = Vec::with_capacity(line.len() + 3);
    reply.push(b'-');
    reply.extend(line.iter().map(|&byte| {
        if matches!(byte, b'\r' | b'\n') {
            b' '
        } else {
            byte
        }
    }));
    reply.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&reply) {
        Ok(redis::Value::ServerError(error)) => error.into(),
        Ok(_) => redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the rate-limit code answered an unreadable error line",
        )),
        Err(error) => error,
    }
}

/// Whether `err` says the server does not have the code a call needs
/// (`NOSCRIPT`, or `Function not found` after `FUNCTION FLUSH`, a restart
/// or a fail-over to a node without the library).
pub(crate) fn is_missing_code(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
    ) || err
        .detail()
        .is_some_and(|d| d.contains("Function not found"))
        || err.to_string().contains("Function not found")
}

/// A decoded reply: the decisions (acquire, peek) and the time used.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) decisions: Vec<Decision>,
    /// The time of the decisions (a replayed reply keeps its original time).
    pub(crate) now: u64,
    /// Whether the decisions are a kept reply of an earlier
    /// [`Op::AcquireOnce`] call.
    pub(crate) replayed: bool,
    /// Units leased per request ([`Op::Lease`]; empty otherwise).
    pub(crate) granted: Vec<u64>,
    /// Per request of an [`Op::Renew`]: whether its lease was renewed.
    pub(crate) renewed: Vec<bool>,
}

/// Decodes the flat integer reply of a call over `count` requests.
pub(crate) fn parse_reply(op: Op, count: usize, values: &[i64]) -> Result<Reply, BackendError> {
    let (values, replayed, current) = match (op, values) {
        (Op::AcquireOnce, [rest @ .., flag, current]) if matches!(flag, 0 | 1) => {
            (rest, *flag == 1, Some(*current))
        }
        (Op::AcquireOnce, _) => {
            return Err(BackendError::protocol(format_args!(
                "the rate-limit code answered {} integers to acquire_once, without a replay flag",
                values.len()
            )));
        }
        _ => (values, false, None),
    };
    let width = op.width();
    let expected = if op.decides() {
        count * width + 1
    } else if op == Op::Renew {
        count + 1
    } else {
        1
    };
    if values.len() != expected {
        return Err(BackendError::protocol(format_args!(
            "the rate-limit code answered {} integers to {} of {count} limit(s), expected {expected}",
            values.len(),
            op.name()
        )));
    }
    let unsigned = |value: i64| {
        u64::try_from(value).map_err(|_| {
            BackendError::protocol(format_args!(
                "the rate-limit code answered a negative value ({value}) to {}",
                op.name()
            ))
        })
    };
    let now = unsigned(values[values.len() - 1])?;
    // The call's own time (after a replay's kept reply): checked, not used.
    current.map_or(Ok(now), unsigned)?;
    let mut decisions = Vec::with_capacity(if op.decides() { count } else { 0 });
    let mut granted = Vec::new();
    if op.decides() {
        for chunk in values[..values.len() - 1].chunks_exact(width) {
            if op == Op::Lease {
                granted.push(unsigned(chunk[DECISION_WIDTH])?);
            }
            let allowed = match chunk[0] {
                0 => false,
                1 => true,
                other => {
                    return Err(BackendError::protocol(format_args!(
                        "the rate-limit code answered {other} for `allowed`, expected 0 or 1"
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
    let renewed = if op == Op::Renew {
        values[..count].iter().map(|&v| v == 1).collect()
    } else {
        Vec::new()
    };
    Ok(Reply {
        decisions,
        now,
        replayed,
        granted,
        renewed,
    })
}

/// Integers per limit in a reservation's reply.
const RESERVATION_WIDTH: usize = DECISION_WIDTH + 1;

/// Decodes the reply of a reserve over `count` requests: per request its
/// decision and whether it took a given-back slot, then the slot (0 when
/// refused) and the now used.
pub(crate) fn parse_reservation(count: usize, values: &[i64]) -> Result<Reservation, BackendError> {
    let expected = count * RESERVATION_WIDTH + 2;
    if values.len() != expected {
        return Err(BackendError::protocol(format_args!(
            "the rate-limit code answered {} integers to reserve of {count} limit(s), expected {expected}",
            values.len()
        )));
    }
    let unsigned = |value: i64| {
        u64::try_from(value).map_err(|_| {
            BackendError::protocol(format_args!(
                "the rate-limit code answered a negative value ({value}) to reserve"
            ))
        })
    };
    let now = unsigned(values[expected - 1])?;
    let slot = unsigned(values[expected - 2])?;
    let mut decisions = Vec::with_capacity(count);
    let mut freed = Vec::with_capacity(count);
    // Refused: every decision (even of a limit that alone would allow) is
    // at the store's time.
    let reserved = values[..expected - 2]
        .chunks_exact(RESERVATION_WIDTH)
        .all(|chunk| chunk[0] == 1);
    for chunk in values[..expected - 2].chunks_exact(RESERVATION_WIDTH) {
        let allowed = match chunk[0] {
            0 => false,
            1 => true,
            other => {
                return Err(BackendError::protocol(format_args!(
                    "the rate-limit code answered {other} for `allowed`, expected 0 or 1"
                )));
            }
        };
        decisions.push(Decision::new(Figures {
            allowed,
            limit: unsigned(chunk[1])?,
            remaining: unsigned(chunk[2])?,
            retry_after_us: unsigned(chunk[3])?,
            reset_after_us: unsigned(chunk[4])?,
            at_micros: if reserved { slot } else { now },
        }));
        freed.push(chunk[5] == 1);
    }
    let decisions = Decisions::new(decisions);
    if decisions.allowed() && slot < now {
        return Err(BackendError::protocol(format_args!(
            "the rate-limit code reserved a slot ({slot}) before its now ({now})"
        )));
    }
    Ok(Reservation::new(decisions, now, freed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_a_lua_module_that_defines_its_loader() {
        for algorithm in Algorithm::EVERY {
            let module = algorithm.traits().lua_module;
            let source = module_source(module)
                .unwrap_or_else(|| panic!("{algorithm}: no source for Lua module `{module}`"));
            let code = algorithm.code();
            assert!(
                source.contains(&format!("LOADERS.{code} ="))
                    || source.contains(&format!("LOADERS['{code}'] =")),
                "{algorithm}: lua/{module}.lua defines no LOADERS.{code}"
            );
        }
    }

    #[test]
    fn the_generated_tables_follow_the_grammar() {
        let tables = lua_tables(&[
            Table::Codes,
            Table::SingleThird,
            Table::Reserves,
            Table::Leases,
        ]);
        assert!(
            tables.contains("local CODES = { 'fw', 'sl', 'sw', 'tb', 'lb', 'gc' }"),
            "{tables}"
        );
        assert!(tables.contains("local SINGLE_THIRD = { ['sw'] = 'slots', ['tb'] = 'b', ['lb'] = 'b', ['gc'] = 'b' }"), "{tables}");
        assert!(
            tables.contains("local RESERVES = { ['tb'] = true, ['lb'] = true, ['gc'] = true }"),
            "{tables}"
        );
        assert!(tables.contains("local LEASES = { ['fw'] = true, ['sw'] = true, ['tb'] = true, ['lb'] = true, ['gc'] = true }"), "{tables}");
    }
    use ratewall::{Key, Limit};

    #[test]
    fn the_library_registers_every_entry_and_each_script_holds_only_what_it_runs() {
        let library = library_source();
        assert!(library.starts_with(&format!("#!lua name={}\n", library_name())));
        for code in ["fw", "sl", "sw", "tb", "lb", "gc"] {
            assert!(library.contains(&format!("LOADERS.{code} =")), "{code}");
        }
        for entry in Entry::every() {
            let code = entry_code(entry);
            assert!(code.function.starts_with(library_name()), "{entry:?}");
            assert_eq!(code.sha, sha1(&code.script));
            assert_eq!(code.sha.len(), 40);
        }
        let gcra = entry_code(Entry::Single(Op::Acquire, Algorithm::Gcra));
        assert!(gcra.script.contains("LOADERS.gc ="));
        assert!(!gcra.script.contains("LOADERS.sl ="));
        assert!(!gcra.script.contains("local function batch"));
        assert!(
            gcra.script
                .ends_with("return single_decide(LOADERS.gc(), 'gc', true)(KEYS, ARGV)\n")
        );
        assert!(batch_script_source().contains("LOADERS.sw ="));
        assert_eq!(
            entry_code(Entry::Single(Op::Peek, Algorithm::TokenBucket)).function,
            format!("{}_tb_peek", library_name())
        );
    }

    #[test]
    fn single_limit_calls_use_their_algorithms_entry_and_batches_the_batch() {
        let gcra = Some(Algorithm::Gcra);
        assert_eq!(
            Entry::for_call(Op::Acquire, 1, gcra),
            Entry::Single(Op::Acquire, Algorithm::Gcra)
        );
        assert_eq!(
            Entry::for_call(Op::Peek, 1, gcra),
            Entry::Single(Op::Peek, Algorithm::Gcra)
        );
        assert_eq!(Entry::for_call(Op::Peek, 2, gcra), Entry::BatchReadOnly);
        assert_eq!(Entry::for_call(Op::Acquire, 2, gcra), Entry::Batch);
        assert_eq!(Entry::for_call(Op::AcquireOnce, 1, gcra), Entry::Batch);
        assert_eq!(Entry::for_call(Op::Reset, 1, gcra), Entry::Batch);
        let indexes: std::collections::HashSet<usize> = Entry::every().map(Entry::index).collect();
        assert_eq!(indexes.len(), Entry::every().count());
        assert_eq!(indexes.len(), CODE.entries.len());
    }

    #[test]
    fn keys_carry_the_limit_suffix() {
        let key = Key::new("rl", "sms", "+33 6");
        let log = Limit::per_minute(3)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        let gcra = Limit::per_hour(5).unwrap();
        let requests = [Request::new(&key, &log, 1), Request::new(&key, &gcra, 2)];
        let plan = Plan::new(Op::Acquire, Time::Server, 0, 0, &requests, None);
        let call = Call::of(&plan);
        assert_eq!(
            call.keys,
            ["rl:{sms:+33 6}:sl:60000000", "rl:{sms:+33 6}:gc:3600000000"]
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
                "0",
                "gc",
                "5",
                "3600000000",
                "5",
                "10",
                "2",
                "0"
            ]
        );
        let one = [Request::new(&key, &gcra, 1)];
        let refund = Plan::new(Op::Refund, Time::Client(42), 7, 1000, &one, None)
            .telling("00000000000000ab");
        assert_eq!(
            Call::of(&refund).args,
            [
                "5",
                "3600000000",
                "5",
                "1",
                "7",
                "00000000000000ab",
                "42",
                "1000"
            ]
        );
        let line = refund.command_line(Via::Function);
        assert_eq!(line[0], "FCALL");
        assert_eq!(line[1], format!("{}_gc_refund", library_name()));
        assert_eq!(line[2], "1");
        let peek = Plan::new(Op::Peek, Time::Server, 0, 0, &one, None);
        assert_eq!(peek.command_line(Via::Function)[0], "FCALL_RO");
        assert_eq!(peek.command_line(Via::ScriptSha)[0], "EVALSHA");
        assert_eq!(
            peek.command_line(Via::ScriptSha)[1],
            entry_code(Entry::Single(Op::Peek, Algorithm::Gcra)).sha
        );
    }

    #[test]
    fn calls_that_give_room_back_carry_their_notice_origin_last() {
        let key = Key::new("rl", "sms", "+33 6");
        let (minute, hour) = (Limit::per_minute(3).unwrap(), Limit::per_hour(5).unwrap());
        let two = [Request::new(&key, &minute, 1), Request::new(&key, &hour, 1)];
        for op in [Op::Refund, Op::Reset] {
            let args = Call::of(&Plan::new(op, Time::Server, 7, 0, &two, None).telling("0f")).args;
            assert_eq!(args.first().unwrap(), op.name());
            assert_eq!(args.last().unwrap(), "0f", "{op:?}");
            // Seven fields per request (the last, its block: none).
            assert_eq!(args.len(), 4 + 2 * 7 + 1, "{op:?}");
        }
        // Only the operations that give room back carry one.
        let acquire = Plan::new(Op::Acquire, Time::Server, 0, 0, &two, None).telling("0f");
        assert_eq!(Call::of(&acquire).args.len(), 4 + 2 * 7);
        let compensation =
            Plan::new(Op::RefundOnce, Time::Server, 7, 0, &two, Some("k")).telling("0f");
        assert_eq!(Call::of(&compensation).args.len(), 4 + 2 * 7);
        // Lifting an identity's blocks tells of it; reading them does not.
        let bk = block_key(&key);
        let lift = Call::of(&Plan::blocks(Op::Unblock, Time::Server, 0, &bk).telling("0f")).args;
        assert_eq!(lift, ["unblock", "s", "0", "0", "0f"]);
        let read = Call::of(&Plan::blocks(Op::Blocks, Time::Server, 0, &bk).telling("0f")).args;
        assert_eq!(read, ["blocks", "s", "0", "0"]);
    }

    #[test]
    fn single_limit_calls_send_only_what_their_algorithm_reads() {
        let key = Key::new("rl", "sms", "+33 6");
        let limit = |algorithm| {
            Limit::per_minute(3)
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap()
        };
        let args = |limit: &Limit, op, time, at, extra_ttl_ms| {
            let one = [Request::new(&key, limit, 2)];
            Call::of(&Plan::new(op, time, at, extra_ttl_ms, &one, None)).args
        };
        let (fixed, log, window) = (
            limit(Algorithm::FixedWindow),
            limit(Algorithm::SlidingLog),
            limit(Algorithm::SlidingWindow),
        );
        let bucket = limit(Algorithm::TokenBucket).with_burst(7).unwrap();
        // Threshold, period, (burst or slots,) cost: the server's clock and
        // no extra TTL are the defaults, left out.
        assert_eq!(
            args(&fixed, Op::Acquire, Time::Server, 0, 0),
            ["3", "60000000", "2"]
        );
        assert_eq!(
            args(&log, Op::Peek, Time::Server, 0, 0),
            ["3", "60000000", "2"]
        );
        assert_eq!(
            args(&window, Op::Acquire, Time::Server, 0, 0),
            ["3", "60000000", "10", "2"]
        );
        assert_eq!(
            args(&bucket, Op::Acquire, Time::Server, 0, 0),
            ["3", "60000000", "7", "2"]
        );
        // A client's time alone; an extra TTL after the time, `s` for the
        // server's.
        assert_eq!(
            args(&fixed, Op::Acquire, Time::Client(42), 0, 0),
            ["3", "60000000", "2", "42"]
        );
        assert_eq!(
            args(&fixed, Op::Acquire, Time::Server, 0, 500),
            ["3", "60000000", "2", "s", "500"]
        );
        // A refund's `at` follows the cost, then its notice origin (empty:
        // tell nothing).
        assert_eq!(
            args(&bucket, Op::Refund, Time::Server, 9, 0),
            ["3", "60000000", "7", "2", "9", ""]
        );
    }

    #[test]
    fn replies_decode_into_decisions_stamped_with_the_call_time() {
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
        assert_eq!(replay.now, 77);
        assert_eq!(replay.decisions[0].at_micros(), 77);
        let fresh = parse_reply(Op::AcquireOnce, 1, &[1, 5, 4, 0, 12, 99, 0, 99]).unwrap();
        assert!(!fresh.replayed);
    }

    #[test]
    fn in_flight_requests_go_to_the_batch_with_their_lease_as_the_member() {
        let key = Key::new("rl", "jobs", "t7");
        let ten = Limit::in_flight(10).unwrap();
        let one = [Request::new(&key, &ten, 1).with_holder(0xab)];
        let plan = Plan::new(Op::Acquire, Time::Server, 0, 0, &one, None);
        assert_eq!(plan.entry, Entry::Batch);
        let call = Call::of(&plan);
        assert_eq!(call.keys, ["rl:{jobs:t7}:if:10000000"]);
        assert_eq!(
            call.args,
            [
                "acquire",
                "s",
                "0",
                "0",
                "if",
                "10",
                "10000000",
                "10",
                "00000000000000ab",
                "1",
                "0"
            ]
        );
        let peek = Plan::new(Op::Peek, Time::Server, 0, 0, &one, None);
        assert_eq!(peek.entry, Entry::BatchReadOnly);
        let renewed = parse_reply(Op::Renew, 2, &[1, 0, 99]).unwrap();
        assert_eq!(renewed.renewed, [true, false]);
        assert!(parse_reply(Op::Renew, 2, &[1, 99]).is_err());
    }

    #[test]
    fn a_limit_that_blocks_goes_to_the_batch_with_its_block_and_block_key() {
        let key = Key::new("rl", "login", "a:{b}");
        let block = std::time::Duration::from_secs(900);
        let minute = Limit::per_minute(5).unwrap().with_block(block).unwrap();
        let day = Limit::per_day(50).unwrap();
        let one = [Request::new(&key, &minute, 1)];
        for op in [Op::Acquire, Op::Peek, Op::Refund] {
            let plan = Plan::new(op, Time::Server, 0, 0, &one, None);
            assert!(
                matches!(plan.entry, Entry::Batch | Entry::BatchReadOnly),
                "{op:?}"
            );
        }
        let both = [Request::new(&key, &minute, 1), Request::new(&key, &day, 1)];
        let call = Call::of(&Plan::new(Op::Acquire, Time::Server, 0, 0, &both, None));
        // The block key follows its request's state key, in the same slot
        // (the identity escaped inside the hash tag).
        assert_eq!(
            call.keys,
            [
                "rl:{login:a%3A%7Bb%7D}:gc:60000000",
                "rl:{login:a%3A%7Bb%7D}:b",
                "rl:{login:a%3A%7Bb%7D}:gc:86400000000",
            ]
        );
        assert_eq!(
            &call.args[4..11],
            ["gc", "5", "60000000", "5", "10", "1", "900000000"]
        );
        assert_eq!(call.args[17], "0");
        // A reset names every request's block key (after the given-back
        // slots of GCRA), to lift its block.
        let reset = Call::of(&Plan::new(Op::Reset, Time::Server, 0, 0, &both, None));
        assert_eq!(reset.keys.len(), 6);
        assert_eq!(reset.keys[5], "rl:{login:a%3A%7Bb%7D}:b");
        // Reading and lifting take the block key alone.
        let bk = block_key(&key);
        let blocks = Plan::blocks(Op::Blocks, Time::Client(7), 0, &bk);
        assert_eq!(blocks.entry, Entry::BatchReadOnly);
        let line = blocks.command_line(Via::Function);
        assert_eq!(line[0], "FCALL_RO");
        assert_eq!(
            line[2..],
            ["1", "rl:{login:a%3A%7Bb%7D}:b", "blocks", "7", "0", "0"]
        );
        let lift = Plan::blocks(Op::Unblock, Time::Server, 0, &bk);
        assert_eq!(lift.entry, Entry::Batch);
        assert_eq!(lift.key_count(), 1);
        let probe = Plan::new(Op::Probe, Time::Server, 0, 0, &both, None);
        assert_eq!(probe.entry, Entry::Batch);
        assert!(parse_reply(Op::Probe, 1, &[0, 5, 0, 900_000_000, 900_000_000, 1]).is_ok());
    }

    #[test]
    fn request_id_keys_share_the_slot_of_the_first_key_and_escape_the_id() {
        let key = Key::new("rl", "pay", "alice");
        assert_eq!(
            request_id_key(&key, "a:{b}%"),
            "rl:{pay:alice}:req:a%3A%7Bb%7D%25"
        );
        assert_ne!(request_id_key(&key, "a:b"), request_id_key(&key, "a%3Ab"));
        let limit = Limit::per_minute(1).unwrap();
        let requests = [Request::new(&key, &limit, 1)];
        let id = request_id_key(&key, "x");
        let plan = Plan::new(Op::AcquireOnce, Time::Server, 0, 0, &requests, Some(&id));
        assert_eq!(plan.entry, Entry::Batch);
        assert_eq!(Call::of(&plan).keys.last().unwrap(), "rl:{pay:alice}:req:x");
        assert_eq!(plan.key_count(), 2);
    }

    #[test]
    fn a_coalesced_call_carries_every_calls_keys_then_each_groups_entry_counts_arguments_and_size()
    {
        let key = Key::new("rl", "sms", "+33 6");
        let (minute, hour) = (Limit::per_minute(3).unwrap(), Limit::per_hour(5).unwrap());
        let one = [Request::new(&key, &hour, 1)];
        let two = [Request::new(&key, &minute, 1), Request::new(&key, &hour, 2)];
        let single = Plan::new(Op::Acquire, Time::Client(42), 0, 0, &one, None).sub_call();
        let batch = Plan::new(Op::Acquire, Time::Client(42), 0, 0, &two, None).sub_call();
        let peek = Plan::new(Op::Peek, Time::Server, 0, 0, &one, None).sub_call();
        let line = |cmd: Cmd| -> Vec<String> {
            cmd.args_iter()
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    _ => String::new(),
                })
                .collect()
        };
        let many = line(many_command(&[&single, &batch], Via::Function));
        let mut expected = vec![
            "FCALL".to_owned(),
            format!("{}_many", library_name()),
            "3".to_owned(),
        ];
        expected.extend(
            [
                "rl:{sms:+33 6}:gc:3600000000",
                "rl:{sms:+33 6}:gc:60000000",
                "rl:{sms:+33 6}:gc:3600000000",
                "2",
                "gc_acquire",
                "1",
                "5",
                "5",
                "3600000000",
                "5",
                "1",
                "42",
                "1",
                "batch",
                "2",
            ]
            .map(str::to_owned),
        );
        assert_eq!(many[..expected.len()], expected[..]);
        // The batch's own arguments follow its count, as it sends them
        // alone, then its group's size.
        let alone = Call::of(&Plan::new(Op::Acquire, Time::Client(42), 0, 0, &two, None));
        assert_eq!(many[expected.len()], alone.args.len().to_string());
        assert_eq!(many[expected.len() + 1..many.len() - 1], alone.args[..]);
        assert_eq!(many[many.len() - 1], "1");
        // Calls next to each other with one entry and the same arguments
        // form one group, each with its own keys: callers of one limit.
        let other = Key::new("rl", "sms", "+44 7");
        let theirs = [Request::new(&other, &hour, 1)];
        let same = Plan::new(Op::Acquire, Time::Client(42), 0, 0, &theirs, None).sub_call();
        let later = Plan::new(Op::Acquire, Time::Client(43), 0, 0, &theirs, None).sub_call();
        let grouped = line(many_command(
            &[&single, &same, &later, &single],
            Via::Function,
        ));
        let mut expected = vec![
            "FCALL".to_owned(),
            format!("{}_many", library_name()),
            "4".to_owned(),
        ];
        expected.extend(
            [
                "rl:{sms:+33 6}:gc:3600000000",
                "rl:{sms:+44 7}:gc:3600000000",
                "rl:{sms:+44 7}:gc:3600000000",
                "rl:{sms:+33 6}:gc:3600000000",
                "3",
                "gc_acquire",
                "1",
                "5",
                "5",
                "3600000000",
                "5",
                "1",
                "42",
                "2",
                "gc_acquire",
                "1",
                "5",
                "5",
                "3600000000",
                "5",
                "1",
                "43",
                "1",
                "gc_acquire",
                "1",
                "5",
                "5",
                "3600000000",
                "5",
                "1",
                "42",
                "1",
            ]
            .map(str::to_owned),
        );
        assert_eq!(grouped, expected);
        // Read-only calls alone go read-only.
        let ro = line(many_command(&[&peek, &peek], Via::Function));
        assert_eq!(ro[0], "FCALL_RO");
        assert_eq!(ro[1], format!("{}_many_ro", library_name()));
        assert_eq!(ro[5], "1");
        assert_eq!(ro[6], "gc_peek");
        assert_eq!(ro[ro.len() - 1], "2");
        // A call alone is the command it would have been.
        let plan = Plan::new(Op::Peek, Time::Server, 0, 0, &one, None);
        assert_eq!(
            line(peek.command(Via::Function)),
            line(plan.command(Via::Function))
        );
        assert!(library_source().contains("'many'"));
        // As scripts: the same layout after EVALSHA of the script of its
        // kind (EVAL of its source), which runs that kind's entry.
        for (calls, many) in [
            (vec![&peek, &peek], Many::ReadOnly),
            (vec![&single, &batch], Many::Any),
        ] {
            let function = line(many_command(&calls, Via::Function));
            let sha = line(many_command(&calls, Via::ScriptSha));
            let source = line(many_command(&calls, Via::ScriptSource));
            let script = many_script_source(many);
            assert_eq!(sha[0], "EVALSHA");
            assert_eq!(sha[1], sha1(script));
            assert_eq!(source[..2], ["EVAL", script]);
            assert_eq!(sha[2..], function[2..]);
            assert_eq!(source[2..], function[2..]);
            let entry = many.name();
            assert!(script.ends_with(&format!("return {entry}(KEYS, ARGV)\n")));
            assert!(script.contains(MANY) && script.contains(MANY_SCRIPT));
        }
        // On a cluster node: no key declared, then the key count and the
        // same layout.
        #[cfg(feature = "cluster")]
        for via in [Via::Function, Via::ScriptSha, Via::ScriptSource] {
            let node = line(many_node_command(&[&single, &single], via));
            let alone = line(many_command(&[&single, &single], Via::Function));
            let (command, name) = match via {
                Via::Function => ("FCALL", format!("{}_many_node", library_name())),
                Via::ScriptSha => ("EVALSHA", sha1(many_script_source(Many::Node))),
                Via::ScriptSource => ("EVAL", many_script_source(Many::Node).to_owned()),
            };
            assert_eq!(node[..3], [command.to_owned(), name, "0".to_owned()]);
            assert_eq!(node[3..], alone[2..]);
        }
        assert!(many_script_source(Many::Node).ends_with("return many_node(KEYS, ARGV)\n"));
    }

    #[test]
    fn a_coalesced_reply_splits_into_each_calls_reply_or_error() {
        use redis::Value;
        let flat = |values: [i64; FLAT]| values.map(Value::Int);
        let mut replies = vec![Value::Array(vec![Value::Int(1), Value::Int(9)])];
        replies.extend(flat([1, 10, 9, 0, 60, 1_000]));
        replies.push(Value::BulkString(
            b"WRONGTYPE Operation against a key".to_vec(),
        ));
        replies.extend(flat([0, 10, 0, 5, 60, 1_000]));
        replies.push(Value::Array(vec![Value::Int(7)]));
        replies.push(Value::BulkString(
            b"ERR ratewall-redis: malformed\r\n".to_vec(),
        ));
        let replies = parse_many(6, Value::Array(replies)).unwrap();
        assert_eq!(replies[0].as_ref().unwrap(), &[1, 9]);
        assert_eq!(replies[1].as_ref().unwrap(), &[1, 10, 9, 0, 60, 1_000]);
        let wrong = replies[2].as_ref().unwrap_err();
        assert_eq!(wrong.code(), Some("WRONGTYPE"));
        assert_eq!(wrong.detail(), Some("Operation against a key"));
        assert_eq!(replies[3].as_ref().unwrap(), &[0, 10, 0, 5, 60, 1_000]);
        assert_eq!(replies[4].as_ref().unwrap(), &[7]);
        assert_eq!(replies[5].as_ref().unwrap_err().code(), Some("ERR"));
        // Too few or too many replies, or a flat reply cut short.
        assert!(parse_many(3, Value::Array(vec![])).is_err());
        assert!(parse_many(1, Value::Int(1)).is_err());
        let short = Value::Array(flat([1, 10, 9, 0, 60, 1_000])[..5].to_vec());
        assert!(parse_many(1, short).is_err());
        let two = Value::Array([flat([1; FLAT]), flat([1; FLAT])].concat());
        assert!(parse_many(1, two.clone()).is_err());
        assert_eq!(parse_many(2, two).unwrap().len(), 2);
    }

    #[test]
    fn a_short_flat_reply_takes_the_limit_and_time_of_the_last_full_one() {
        use redis::Value;
        let ints = |values: &[i64]| values.iter().map(|&v| Value::Int(v)).collect::<Vec<_>>();
        // Full (allowed, 9 left), short allowed with 7 left, an error, short
        // refused with 0 and with 3 left, then a full one of another limit
        // and time, and a short one after it.
        let mut replies = ints(&[1, 10, 9, 0, 60, 1_000]);
        replies.extend(ints(&[9, 60]));
        replies.push(Value::BulkString(b"WRONGTYPE Operation".to_vec()));
        replies.extend(ints(&[-1, 5, 60]));
        replies.extend(ints(&[-4, 5, 60]));
        replies.extend(ints(&[0, 20, 0, 7, 70, 2_000]));
        replies.extend(ints(&[2, 70]));
        let replies = parse_many(7, Value::Array(replies)).unwrap();
        let ok = |i: usize| replies[i].as_ref().unwrap().clone();
        assert_eq!(ok(0), [1, 10, 9, 0, 60, 1_000]);
        assert_eq!(ok(1), [1, 10, 7, 0, 60, 1_000]);
        assert_eq!(replies[2].as_ref().unwrap_err().code(), Some("WRONGTYPE"));
        assert_eq!(ok(3), [0, 10, 0, 5, 60, 1_000]);
        assert_eq!(ok(4), [0, 10, 3, 5, 60, 1_000]);
        assert_eq!(ok(5), [0, 20, 0, 7, 70, 2_000]);
        assert_eq!(ok(6), [1, 20, 0, 0, 70, 2_000]);
        // A short one with nothing full before it, or cut short.
        assert!(parse_many(1, Value::Array(ints(&[2, 60]))).is_err());
        let mut cut = ints(&[1, 10, 9, 0, 60, 1_000]);
        cut.extend(ints(&[-1, 5]));
        assert!(parse_many(2, Value::Array(cut)).is_err());
    }

    #[test]
    fn missing_code_errors_are_recognised() {
        let noscript = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            "NOSCRIPT",
        ));
        assert!(is_missing_code(&noscript));
        let other = redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "bad"));
        assert!(!is_missing_code(&other));
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
