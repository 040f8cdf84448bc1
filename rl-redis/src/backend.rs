//! [`RedisBackend`]: ratewall's [`Backend`] on Redis, Redis Cluster or the
//! master of a Redis Sentinel deployment.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewall::{
    Decision,
    backend::{Backend, BoxFuture, Decisions, Request},
    clock::Clock,
    error::BackendError,
};
use redis::aio::ConnectionManager;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisResult};
use tokio::time::Instant;

use crate::call_mode::CallMode;
use crate::coalesce::{CoalescedCalls, Coalescer};
use crate::error;
#[cfg(feature = "cluster")]
use crate::renewing::Renewing;
use crate::script::{
    self, Entry, Op, Plan, Reply, Time, Via, is_missing_code, parse_reply, request_id_key,
};
#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// The furthest a peek looks ahead (a day, as the longest pause a
/// budget is held for): the time it decides at stays exact in Lua's
/// doubles.
const MAX_AHEAD_US: u64 = 86_400_000_000;

/// `d` in whole microseconds, the unit of every script argument,
/// saturating at `u64::MAX`.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The connection behind a backend: one type for every deployment.
#[derive(Clone)]
pub(crate) enum Connection {
    /// A reconnecting multiplexed connection to one server.
    Standalone(ConnectionManager),
    /// The application's own connection to one server (a clone of its
    /// handle).
    Given(crate::own_connection::Given),
    /// A Redis Cluster connection (reconnects and follows slot moves;
    /// opened again when it stalls, see [`crate::renewing`]).
    #[cfg(feature = "cluster")]
    Cluster(Renewing<ClusterConnection>),
    /// The master named by Redis Sentinels (looked up again after failures).
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
    /// One server over this crate's TLS, reopened after it broke.
    #[cfg(feature = "__tls")]
    Tls(crate::tls::standalone::TlsStandalone),
    /// A Redis Cluster whose nodes are reached over this crate's TLS, and
    /// the TLS configuration they connect with (held while it lives).
    #[cfg(all(feature = "cluster", feature = "__tls"))]
    TlsCluster(
        Renewing<ClusterConnection<crate::tls::cluster::TlsNode>>,
        #[allow(
            dead_code,
            reason = "held, never read: keeps the configuration registered while the connection lives"
        )]
        Arc<crate::tls::cluster::ClusterTls>,
    ),
}

/// Sends `cmd` on a connection to one server by `deadline`.
async fn standalone_query<C, T>(mut c: C, deadline: Instant, cmd: &Cmd) -> Option<RedisResult<T>>
where
    C: redis::aio::ConnectionLike + Send,
    T: FromRedisValue,
{
    let reply = tokio::time::timeout_at(deadline, cmd.query_async(&mut c))
        .await
        .ok();
    match reply {
        // Refused: the command was never sent, and a `ConnectionManager`
        // has just started one new connection attempt. Wait for that
        // attempt once: a server back up answers this very call; one
        // still down refuses again at once.
        Some(Err(error)) if error.is_connection_refusal() => {
            tokio::time::timeout_at(deadline, cmd.query_async(&mut c))
                .await
                .ok()
        }
        reply => reply,
    }
}

/// Sends `cmd` on a cluster connection by `deadline`.
#[cfg(feature = "cluster")]
async fn cluster_query<C, T>(
    connection: &Renewing<ClusterConnection<C>>,
    deadline: Instant,
    cmd: &Cmd,
) -> Option<RedisResult<T>>
where
    C: redis::aio::ConnectionLike
        + redis::cluster_async::Connect
        + Clone
        + Send
        + Sync
        + Unpin
        + 'static,
    T: FromRedisValue,
{
    let mut c = connection.get();
    let call = connection.call();
    let reply = tokio::time::timeout_at(deadline, cmd.query_async(&mut c))
        .await
        .ok();
    call.heard(reply.as_ref());
    reply
}

/// Sends `cmd` on a cluster connection to the node of `route` (as
/// redis-rs's map of the cluster says) by `deadline`.
#[cfg(feature = "cluster")]
async fn cluster_query_at<C, T>(
    connection: &Renewing<ClusterConnection<C>>,
    deadline: Instant,
    route: redis::cluster_routing::Route,
    cmd: &Cmd,
) -> Option<RedisResult<T>>
where
    C: redis::aio::ConnectionLike
        + redis::cluster_async::Connect
        + Clone
        + Send
        + Sync
        + Unpin
        + 'static,
    T: FromRedisValue,
{
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut c = connection.get();
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
    let call = connection.call();
    let reply = tokio::time::timeout_at(deadline, c.route_command(cmd.clone(), routing))
        .await
        .ok();
    call.heard(reply.as_ref());
    reply
        // An error reply comes back as a value here (`query_async` makes
        // it an error; so does this, or a coalesced call that met
        // `NOSCRIPT` or a missing library would read it as its reply).
        .map(|reply| reply.and_then(|value| Ok(T::from_redis_value(value.extract_error()?)?)))
}

/// The route to the master holding `key`'s hash slot.
#[cfg(feature = "cluster")]
fn master_of_key(key: &str) -> redis::cluster_routing::Route {
    redis::cluster_routing::Route::with_key(key, redis::cluster_routing::SlotAddr::Master)
}

/// The route to the master holding hash `slot`.
#[cfg(feature = "cluster")]
fn master_of_slot(slot: u16) -> redis::cluster_routing::Route {
    redis::cluster_routing::Route::new(slot, redis::cluster_routing::SlotAddr::Master)
}

impl Connection {
    /// Sends `cmd` (on a cluster: to the node of its first key, or to every
    /// master for `FUNCTION LOAD`) and converts the reply; `None` when
    /// `deadline` passed first.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        deadline: Instant,
        cmd: &Cmd,
    ) -> Option<RedisResult<T>> {
        // The other kinds' futures are boxed: each call's future holds the
        // largest of them, and is moved whole into its box when made.
        match self {
            Connection::Standalone(c) => standalone_query(c.clone(), deadline, cmd).await,
            Connection::Given(c) => standalone_query(c.clone(), deadline, cmd).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => Box::pin(cluster_query(c, deadline, cmd)).await,
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(c) => Box::pin(c.query(deadline, cmd)).await,
            #[cfg(feature = "__tls")]
            Connection::Tls(c) => Box::pin(c.query(deadline, cmd)).await,
            #[cfg(all(feature = "cluster", feature = "__tls"))]
            Connection::TlsCluster(c, _) => Box::pin(cluster_query(c, deadline, cmd)).await,
        }
    }

    /// Sends `cmd` to the master holding `key`'s hash slot, even a command
    /// naming no key (`SCAN`); elsewhere like [`Connection::query`]. `None`
    /// when `deadline` passed first.
    pub(crate) async fn query_at_key<T: FromRedisValue>(
        &self,
        deadline: Instant,
        key: &str,
        cmd: &Cmd,
    ) -> Option<RedisResult<T>> {
        match self {
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => cluster_query_at(c, deadline, master_of_key(key), cmd).await,
            #[cfg(all(feature = "cluster", feature = "__tls"))]
            Connection::TlsCluster(c, _) => {
                cluster_query_at(c, deadline, master_of_key(key), cmd).await
            }
            _ => {
                let _ = key;
                self.query(deadline, cmd).await
            }
        }
    }

    /// Sends `cmd` to the master serving hash `slot` (as redis-rs's map
    /// of the cluster says); elsewhere like [`Connection::query`]. `None`
    /// when `deadline` passed first.
    #[cfg(feature = "cluster")]
    pub(crate) async fn query_at_slot<T: FromRedisValue>(
        &self,
        deadline: Instant,
        slot: u16,
        cmd: &Cmd,
    ) -> Option<RedisResult<T>> {
        match self {
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => {
                cluster_query_at(c, deadline, master_of_slot(slot), cmd).await
            }
            #[cfg(all(feature = "cluster", feature = "__tls"))]
            Connection::TlsCluster(c, _) => {
                cluster_query_at(c, deadline, master_of_slot(slot), cmd).await
            }
            _ => {
                let _ = slot;
                self.query(deadline, cmd).await
            }
        }
    }

    /// Whether it reaches a Redis Cluster (whose calls are coalesced per
    /// node, see [`crate::nodes`]).
    #[cfg(feature = "cluster")]
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => true,
            #[cfg(all(feature = "cluster", feature = "__tls"))]
            Connection::TlsCluster(..) => true,
            _ => false,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Connection::Standalone(_) => "standalone",
            Connection::Given(_) => "standalone (the application's connection)",
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => "cluster",
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(_) => "sentinel",
            #[cfg(feature = "__tls")]
            Connection::Tls(_) => "standalone over TLS",
            #[cfg(all(feature = "cluster", feature = "__tls"))]
            Connection::TlsCluster(..) => "cluster over TLS",
        }
    }
}

/// Settings fixed when the backend is built.
#[derive(Clone)]
pub(crate) struct Settings {
    /// The server(s), passwords redacted, for error messages.
    pub(crate) target: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) extra_ttl_ms: u64,
    /// [`CallMode::Functions`] or [`CallMode::Scripts`], resolved at connect time.
    pub(crate) mode: CallMode,
}

/// Reloads the Functions library once for all the calls that found it
/// missing at the same time.
#[derive(Default)]
pub(crate) struct Reloader {
    /// Bumped after every load.
    generation: AtomicU64,
    lock: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// How many loads were made so far (read before a call, to tell
    /// whether another call loaded the library since).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// Where calls go and how their code is reached: the connection, the call
/// mode and the reloader of the Functions library (borrowed from a
/// [`RedisBackend`] or from its coalescer).
#[derive(Clone, Copy)]
pub(crate) struct Link<'a> {
    pub(crate) connection: &'a Connection,
    pub(crate) reloader: &'a Reloader,
    /// [`CallMode::Functions`] or [`CallMode::Scripts`].
    pub(crate) mode: CallMode,
    /// The server(s), passwords redacted, for logs.
    pub(crate) target: &'a str,
}

impl Link<'_> {
    /// Sends the call to `entry` that `command` writes for a given [`Via`],
    /// reloading what the server lacks: in [`CallMode::Functions`],
    /// `FCALL`; when the library is missing, load it (once for every call
    /// that noticed) and `FCALL` again; when it is missing again, `EVAL`
    /// the entry's source. In [`CallMode::Scripts`], `EVALSHA`, then `EVAL`
    /// (which caches the script again). `Err(None)` when the deadline
    /// passed.
    pub(crate) async fn run<T: FromRedisValue>(
        self,
        deadline: Instant,
        entry: Entry,
        command: impl Fn(Via) -> Cmd,
    ) -> Result<T, Option<redis::RedisError>> {
        let mut via = match self.mode {
            CallMode::Scripts => Via::ScriptSha,
            _ => Via::Function,
        };
        let mut reloaded = false;
        loop {
            let seen = self.reloader.generation();
            match self.connection.query::<T>(deadline, &command(via)).await {
                None => return Err(None),
                Some(Ok(values)) => return Ok(values),
                Some(Err(err)) if via != Via::ScriptSource && is_missing_code(&err) => {
                    via = if via == Via::Function && !reloaded {
                        reloaded = true;
                        // Boxed: rare, and it would make every call's
                        // future larger.
                        if Box::pin(self.reload(deadline, seen)).await {
                            Via::Function
                        } else {
                            Via::ScriptSource
                        }
                    } else {
                        Via::ScriptSource
                    };
                    tracing::debug!(
                        ?entry,
                        next = ?via,
                        "the server lacked the rate-limit code; retrying"
                    );
                }
                Some(Err(err)) => return Err(Some(err)),
            }
        }
    }

    /// Loads the Functions library (on a cluster: on every master), unless
    /// another call loaded it since generation `seen` was read. Whether the
    /// library is believed loaded.
    pub(crate) async fn reload(self, deadline: Instant, seen: u64) -> bool {
        let Ok(_guard) = tokio::time::timeout_at(deadline, self.reloader.lock.lock()).await else {
            return false;
        };
        if self.reloader.generation() != seen {
            return true;
        }
        let loaded = self
            .connection
            .query::<redis::Value>(deadline, &script::load_library_command())
            .await;
        self.reloader.generation.fetch_add(1, Ordering::AcqRel);
        match loaded {
            Some(Ok(_)) => {
                tracing::info!(
                    library = script::library_name(),
                    target = %self.target,
                    "loaded the rate-limit Functions library again"
                );
                true
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "could not load the rate-limit Functions library; using EVAL");
                false
            }
            None => false,
        }
    }
}

/// Decides rate limits in Redis or Redis Cluster, with the exact semantics of
/// [`ratewall::backend::MemoryBackend`].
///
/// - **One round trip, atomic.** Every call (any number of limits, any mix
///   of algorithms) is one command that reads, decides and writes in Lua:
///   on Redis ≥ 7 one `FCALL` of this crate's Functions library (loaded
///   once per server; `FCALL_RO` for peeks), otherwise one `EVALSHA` (see
///   [`CallMode`]). A single-limit call runs only its algorithm's code; a
///   multi-limit call runs the batch entry point. [`Backend::acquire`] is
///   all-or-nothing: when any limit refuses, nothing is consumed from any
///   of them. With coalescing on
///   ([`RedisBackendBuilder::coalesce`](crate::RedisBackendBuilder::coalesce)),
///   the calls of concurrent callers may share one command, each decided
///   as it would be alone.
/// - **One clock.** By default the time is the server's `TIME`, so app
///   instances with skewed clocks agree (Redis ≥ 5 replicates script effects,
///   which makes this safe). A client clock is an explicit option
///   ([`RedisBackendBuilder::client_clock`](crate::RedisBackendBuilder::client_clock)),
///   used by deterministic tests.
/// - **Bounded memory.** Every key written gets a TTL equal to the time at
///   which its state becomes equivalent to no state; a state that becomes
///   fresh is deleted; refused calls and peeks write nothing.
/// - **A reload that does not fail.** When the server no longer has the
///   code (`FUNCTION FLUSH`, `SCRIPT FLUSH`, a restart with an empty
///   dataset, a fail-over to a node without it, a new cluster master), the
///   call loads the library again (once for all the calls that noticed at
///   the same time; on a cluster, on every master) and retries; if the
///   code is missing once more, it sends `EVAL` with the source, which
///   needs nothing cached. All within the call's timeout. Connections
///   reconnect by themselves; every call is bounded by the timeout and fails
///   with a [`BackendError`], never a panic.
///
/// # Keys
/// A request for key `prefix:{scope:identity}` and a limit stores its state
/// under `prefix:{scope:identity}:<algorithm>:<period_us>`, one key per limit.
/// The hash tag keeps all of an identity's keys in one cluster slot.
///
/// # Redis Cluster
/// All requests whose keys share a hash tag are decided by one call.
/// A call whose requests span several hash tags (e.g. a per-phone and a
/// per-IP limit) cannot be one call on a cluster: the groups (requests
/// sharing a hash tag, in the order of their first request) are decided one
/// after the other, and when a later group refuses, the earlier groups are
/// refunded (reserve-then-compensate); the refused call then reads the
/// other groups' state so that every limit reports its state.
///
/// **Time.** With the server's time (the default), each group is decided
/// at the `TIME` of the master holding it, read when that group's call
/// runs, so a master never decides at a time earlier than one it already
/// decided at: a group is never refused for lack of room that it has.
/// The decisions of one call may therefore carry different
/// [`ratewall::Decision::at_micros`] (one per group); a refund gives back
/// each group at its own time, as [`ratewall::Limiter`] does. With a
/// client clock, every group is decided at the client's time.
///
/// That is the one case that takes more than one round trip (the forward
/// path shares one timeout; giving back and reading take one timeout each).
/// In between, a concurrent caller may see the reservation, so put the
/// group most likely to refuse first. On a standalone server such a call is
/// still one command. An idempotent call ([`Backend::acquire_once`]) over
/// several hash tags keeps one reply per hash tag, each under `<group's
/// first key>:req:<id>`; a retry replays the groups that had consumed and
/// decides the others.
///
/// # Redis Sentinel
/// [`RedisBackend::connect_sentinel`] finds the master through the
/// sentinels and looks it up again whenever it fails, and as soon as a
/// sentinel announces `+switch-master` (a background task stays subscribed
/// on one sentinel), so fail-overs and switch-overs are followed. Decisions
/// are made on the master only (never on replicas, which may lag).
///
/// # Idempotent calls
/// [`Backend::acquire_once`] keeps an allowed reply under
/// `prefix:{scope:identity}:req:<escaped id>` (the first request's key, so
/// the same slot) for the longest period of the call, decided and stored in
/// the same call as the decision.
///
/// ```no_run
/// use ratewall::{Key, Limit, Limiter, backend::{Backend, Request}};
/// use ratewall_redis::RedisBackend;
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379/")
///     .timeout(Duration::from_millis(250))
///     .connect()
///     .await?;
/// let limit = Limit::per_minute(1)?;
/// let key = Key::new("rl", "sms", "+33 6 12 34 56 78");
/// let request = [Request::new(&key, &limit, 1)];
/// assert!(backend.acquire(&request).await?.allowed());
/// assert!(!backend.acquire(&request).await?.allowed());
///
/// // Or behind the limiter used by `#[rate_limit]`:
/// let _limiter = Limiter::builder().backend(backend).prefix("app").build()?;
/// # Ok(())
/// # }
/// ```
pub struct RedisBackend {
    connection: Connection,
    settings: Settings,
    reloader: Arc<Reloader>,
    /// Coalesces the calls of concurrent callers (`None`: every call goes
    /// alone; see [`RedisBackendBuilder::coalesce`](crate::RedisBackendBuilder::coalesce)).
    coalescer: Option<Arc<Coalescer>>,
    /// Refund notices: told with every call that gives room back, heard by
    /// the limiters that subscribe (`None`: turned off).
    pub(crate) notices: Option<Arc<crate::notices::Notices>>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.connection.kind())
            .field("target", &self.settings.target)
            .field("mode", &self.settings.mode)
            .field("timeout", &self.settings.timeout)
            .field("client_clock", &self.settings.clock)
            .field("extra_ttl_ms", &self.settings.extra_ttl_ms)
            .field("refund_notices", &self.notices)
            .field("coalesced", &self.coalesced())
            .finish()
    }
}

/// Names a call in error messages (never the keys: they hold identities).
struct What<'a> {
    op: Op,
    count: usize,
    target: &'a str,
}

impl fmt::Display for What<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate-limit call ({}, {} limit(s)) on {}",
            self.op.name(),
            self.count,
            self.target
        )
    }
}

/// Requests sharing one hash tag, with their positions in the call.
pub(crate) struct Group<'r> {
    pub(crate) positions: Vec<usize>,
    pub(crate) requests: Vec<Request<'r>>,
}

impl Group<'_> {
    fn place(&self, decisions: &[Decision], out: &mut [Option<Decision>]) {
        for (&position, decision) in self.positions.iter().zip(decisions) {
            out[position] = Some(*decision);
        }
    }
}

pub(crate) fn validate(requests: &[Request<'_>]) -> Result<(), BackendError> {
    Request::check_batch(requests).map_err(BackendError::Invalid)
}

fn gather(decided: Vec<Option<Decision>>) -> Result<Decisions, BackendError> {
    decided
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .map(Decisions::new)
        .ok_or_else(|| BackendError::protocol("a limit of the call was left undecided"))
}

impl RedisBackend {
    /// The default per-call timeout: 1 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    /// The default time allowed to connect: 5 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A backend on `connection`; `coalesce`: the most calls coalesced
    /// into one and the most coalescing calls in flight, where this
    /// connection and call mode coalesce (see [`RedisBackend::coalesces`]).
    pub(crate) fn from_parts(
        connection: Connection,
        settings: Settings,
        notices: Option<crate::notices::Notices>,
        coalesce: Option<(usize, usize)>,
    ) -> Self {
        let reloader = Arc::<Reloader>::default();
        // Both call modes coalesce (`settings.mode` is resolved when
        // connecting: never `Auto` here).
        let coalescer = coalesce.map(|(max, in_flight)| {
            Arc::new(Coalescer::new(
                connection.clone(),
                Arc::clone(&reloader),
                Arc::clone(&settings.target),
                settings.mode,
                max,
                in_flight,
            ))
        });
        Self {
            connection,
            settings,
            reloader,
            coalescer,
            notices: notices.map(Arc::new),
        }
    }

    /// Whether this backend coalesces the calls of concurrent callers
    /// (see [`RedisBackendBuilder::coalesce`](crate::RedisBackendBuilder::coalesce)):
    /// asked for, in [`CallMode::Functions`] or [`CallMode::Scripts`], on
    /// one server, or on a Redis Cluster per master (its single-limit
    /// acquires).
    pub fn coalesces(&self) -> bool {
        self.coalescer.is_some()
    }

    /// How many times this backend opened its Redis Cluster connection
    /// again after it stalled and sent the calls after through the new one
    /// ([`RedisBackendBuilder::reopen_stalled_cluster`](crate::RedisBackendBuilder::reopen_stalled_cluster));
    /// 0 for a backend that is not on a cluster.
    pub fn cluster_connections_reopened(&self) -> u64 {
        #[cfg(feature = "cluster")]
        {
            match &self.connection {
                Connection::Cluster(c) => c.reopened().installed,
                #[cfg(feature = "__tls")]
                Connection::TlsCluster(c, _) => c.reopened().installed,
                _ => 0,
            }
        }
        #[cfg(not(feature = "cluster"))]
        {
            0
        }
    }

    /// What coalescing did so far: how many calls went alone, how many
    /// coalesced calls carried how many calls; `None` when this backend
    /// does not coalesce.
    pub fn coalesced(&self) -> Option<CoalescedCalls> {
        self.coalescer.as_ref().map(|c| c.counts())
    }

    /// The SHA1 of the batch script (what `EVALSHA` is sent with for
    /// multi-limit calls in [`CallMode::Scripts`]).
    pub fn script_sha() -> &'static str {
        script::batch_script_sha()
    }

    /// The batch script's source (it decides any batch, every operation),
    /// e.g. for `SCRIPT LOAD` by other tools.
    pub fn script_source() -> &'static str {
        script::batch_script_source()
    }

    /// The source of the script that decides coalesced calls in
    /// [`CallMode::Scripts`] (see
    /// [`RedisBackendBuilder::coalesce`](crate::RedisBackendBuilder::coalesce);
    /// read-only coalesced calls, and those on a Redis Cluster master, go
    /// in scripts of their own), e.g. for `SCRIPT LOAD` by other tools.
    pub fn coalesced_script_source() -> &'static str {
        script::many_script_source(script::Many::Any)
    }

    /// The name of the Functions library (`rl_<hash of its code>`, so
    /// another version of this crate on the same server uses other names).
    pub fn library_name() -> &'static str {
        script::library_name()
    }

    /// The Functions library's source, as sent with `FUNCTION LOAD`.
    pub fn library_source() -> &'static str {
        script::library_source()
    }

    /// How this backend calls its Lua code: [`CallMode::Functions`] or
    /// [`CallMode::Scripts`] (never [`CallMode::Auto`]: it is resolved when
    /// connecting).
    pub fn call_mode(&self) -> CallMode {
        self.settings.mode
    }

    /// Whether this backend talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        {
            #[cfg(feature = "__tls")]
            if matches!(self.connection, Connection::TlsCluster(..)) {
                return true;
            }
            matches!(self.connection, Connection::Cluster(_))
        }
        #[cfg(not(feature = "cluster"))]
        {
            false
        }
    }

    /// Whether this backend finds its master through Redis Sentinels.
    pub fn is_sentinel(&self) -> bool {
        #[cfg(feature = "sentinel")]
        {
            matches!(self.connection, Connection::Sentinel(_))
        }
        #[cfg(not(feature = "sentinel"))]
        {
            false
        }
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.settings.timeout
    }

    /// When a call started now must be done (a timeout too large to add
    /// means no practical limit: a year).
    pub(crate) fn deadline(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.settings.timeout)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
            .unwrap_or(now)
    }

    pub(crate) fn time(&self) -> Time {
        match &self.settings.clock {
            Some(clock) => Time::Client(clock.now_micros()),
            None => Time::Server,
        }
    }

    /// Runs one call within the per-call timeout.
    async fn call(
        &self,
        op: Op,
        time: Time,
        at: u64,
        requests: &[Request<'_>],
        request_id: Option<&str>,
    ) -> Result<Reply, BackendError> {
        self.call_until(self.deadline(), op, time, at, requests, request_id)
            .await
    }

    /// Runs one call that must complete by `deadline`. `request_id` is
    /// required by (and only used for) the `_once` operations. A call that
    /// gives room back tells the other processes (see `crate::notices`).
    async fn call_until(
        &self,
        deadline: Instant,
        op: Op,
        time: Time,
        at: u64,
        requests: &[Request<'_>],
        request_id: Option<&str>,
    ) -> Result<Reply, BackendError> {
        let origin = self.notices.as_ref().map_or("", |n| n.origin());
        self.call_telling(deadline, op, time, at, requests, request_id, origin)
            .await
    }

    /// [`RedisBackend::call_until`], telling of what the call gives back
    /// as `origin` (empty: telling nothing).
    #[allow(
        clippy::too_many_arguments,
        reason = "call_until's arguments and the origin; one private caller beside it"
    )]
    async fn call_telling(
        &self,
        deadline: Instant,
        op: Op,
        time: Time,
        at: u64,
        requests: &[Request<'_>],
        request_id: Option<&str>,
        origin: &str,
    ) -> Result<Reply, BackendError> {
        let id_key = if op.takes_request_id() {
            let (Some(first), Some(id)) = (requests.first(), request_id) else {
                return Err(BackendError::protocol(format_args!(
                    "{} needs a request id and at least one limit",
                    op.name()
                )));
            };
            Some(request_id_key(first.key, id))
        } else {
            None
        };
        let plan = Plan::new(
            op,
            time,
            at,
            self.settings.extra_ttl_ms,
            requests,
            id_key.as_deref(),
        )
        .telling(origin);
        let values = match &self.coalescer {
            Some(coalescer) if op.coalesces() => coalescer
                .send(deadline, &plan)
                .await
                .map_err(|err| self.failure(&plan, err))?,
            _ => self.send(deadline, &plan).await?,
        };
        parse_reply(op, requests.len(), &values)
    }

    /// Sends `plan` by `deadline` ([`RedisBackend::run`]), its failure as a
    /// [`BackendError`].
    pub(crate) async fn send(
        &self,
        deadline: Instant,
        plan: &Plan<'_, '_>,
    ) -> Result<Vec<i64>, BackendError> {
        self.send_as(deadline, plan).await
    }

    /// [`RedisBackend::send`], the reply read as `T`.
    pub(crate) async fn send_as<T: FromRedisValue>(
        &self,
        deadline: Instant,
        plan: &Plan<'_, '_>,
    ) -> Result<T, BackendError> {
        self.run(deadline, plan)
            .await
            .map_err(|err| self.failure(plan, err))
    }

    /// What `plan` failing with `err` (`None`: its deadline passed) is.
    fn failure(&self, plan: &Plan<'_, '_>, err: Option<redis::RedisError>) -> BackendError {
        match err {
            None => BackendError::Timeout(self.settings.timeout),
            Some(err) => {
                let what = What {
                    op: plan.op,
                    count: plan.count(),
                    target: &self.settings.target,
                };
                error::from_redis(&what, &err, self.settings.timeout)
            }
        }
    }

    /// The extra TTL added to every key written (ms).
    pub(crate) fn extra_ttl_ms(&self) -> u64 {
        self.settings.extra_ttl_ms
    }

    /// Where this backend's calls go.
    pub(crate) fn link(&self) -> Link<'_> {
        Link {
            connection: &self.connection,
            reloader: &self.reloader,
            mode: self.settings.mode,
            target: &self.settings.target,
        }
    }

    /// Sends `plan` ([`Link::run`]). `Err(None)` when the deadline passed.
    async fn run<T: FromRedisValue>(
        &self,
        deadline: Instant,
        plan: &Plan<'_, '_>,
    ) -> Result<T, Option<redis::RedisError>> {
        self.link()
            .run(deadline, plan.entry, |via| plan.command(via))
            .await
    }

    /// On a cluster, the requests split by hash tag when there is more than
    /// one; `None` when one call can take them all.
    pub(crate) fn groups<'r>(&self, requests: &[Request<'r>]) -> Option<Vec<Group<'r>>> {
        if !self.is_cluster() {
            return None;
        }
        let first = requests.first()?.key.hash_tag();
        if requests.iter().all(|r| r.key.hash_tag() == first) {
            return None;
        }
        let mut groups: Vec<(&str, Group<'r>)> = Vec::new();
        for (position, request) in requests.iter().enumerate() {
            let tag = request.key.hash_tag();
            match groups.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, group)) => {
                    group.positions.push(position);
                    group.requests.push(*request);
                }
                None => groups.push((
                    tag,
                    Group {
                        positions: vec![position],
                        requests: vec![*request],
                    },
                )),
            }
        }
        Some(groups.into_iter().map(|(_, group)| group).collect())
    }

    async fn acquire_batch(
        &self,
        requests: &[Request<'_>],
        request_id: Option<&str>,
    ) -> Result<Decisions, BackendError> {
        validate(requests)?;
        if let Some(request) = requests
            .iter()
            .find(|r| r.limit.is_in_flight() && r.holder == 0)
        {
            return Err(BackendError::Invalid(ratewall::error::LimitError::BadCall(
                format!(
                    "{} needs a lease id (`Request::with_holder`): each slot is one member named by it",
                    request.limit
                ),
            )));
        }
        if requests.is_empty() {
            return Ok(Decisions::new([]));
        }
        let op = if request_id.is_some() {
            Op::AcquireOnce
        } else {
            Op::Acquire
        };
        match self.groups(requests) {
            None => {
                let reply = self.call(op, self.time(), 0, requests, request_id).await?;
                if reply.replayed {
                    tracing::debug!(
                        limits = requests.len(),
                        "idempotent acquire: returned the reply kept for this request id"
                    );
                }
                Ok(Decisions::new(reply.decisions))
            }
            // Boxed (a cluster's call over several hash tags): it would
            // make every call's future larger.
            Some(groups) => {
                Box::pin(self.acquire_groups(requests.len(), &groups, request_id)).await
            }
        }
    }

    /// Reserve-then-compensate over several hash tags (cluster only), each
    /// group at its own master's time (or at the client's time). With a
    /// request id, each group keeps (and replays) its own reply under its
    /// own request-id key, and a group given back forgets it.
    async fn acquire_groups(
        &self,
        count: usize,
        groups: &[Group<'_>],
        request_id: Option<&str>,
    ) -> Result<Decisions, BackendError> {
        let op = if request_id.is_some() {
            Op::AcquireOnce
        } else {
            Op::Acquire
        };
        let deadline = self.deadline();
        let mut decided = vec![None; count];
        // One client time for every group; the server's own time otherwise.
        let time = self.time();
        // Groups that consumed, with the time they consumed at.
        let mut taken = Vec::with_capacity(groups.len());
        let mut refused = None;
        for (index, group) in groups.iter().enumerate() {
            let reply = match self
                .call_until(deadline, op, time, 0, &group.requests, request_id)
                .await
            {
                Ok(reply) => reply,
                Err(err) => {
                    self.give_back(groups, &taken, request_id).await;
                    return Err(err);
                }
            };
            if reply.replayed {
                tracing::debug!(
                    limits = group.requests.len(),
                    "idempotent acquire: a hash tag's kept reply returned for this request id"
                );
            }
            group.place(&reply.decisions, &mut decided);
            if reply.decisions.iter().all(|d| d.allowed()) {
                taken.push((index, reply.now));
            } else {
                refused = Some(index);
                break;
            }
        }
        let Some(refused) = refused else {
            return gather(decided);
        };
        self.give_back(groups, &taken, request_id).await;
        // Like the single-call path: the other limits report their current
        // state (each group at its own time, like the forward path); the
        // groups after the refused one, which one step would have decided
        // too, are probed: a refusing limit that blocks is blocked there.
        for (index, group) in groups.iter().enumerate() {
            let op = if index > refused && group.requests.iter().any(|r| r.limit.block().is_some())
            {
                Op::Probe
            } else {
                Op::Peek
            };
            if index != refused {
                let reply = self.call(op, time, 0, &group.requests, None).await?;
                group.place(&reply.decisions, &mut decided);
            }
        }
        gather(decided)
    }

    /// Refunds what the `taken` groups consumed, each at its time (best
    /// effort: a failure is logged, the units then return when their state
    /// expires); with a request id, also forgets each group's kept reply.
    /// Told to no one: the units were taken a moment ago by a call that is
    /// refused, and a notice per refusal would flood the other processes.
    async fn give_back(
        &self,
        groups: &[Group<'_>],
        taken: &[(usize, u64)],
        request_id: Option<&str>,
    ) {
        let op = if request_id.is_some() {
            Op::RefundOnce
        } else {
            Op::Refund
        };
        for &(index, at) in taken {
            let requests = &groups[index].requests;
            let given = self.call_telling(
                self.deadline(),
                op,
                self.time(),
                at,
                requests,
                request_id,
                "",
            );
            if let Err(error) = given.await {
                tracing::warn!(
                    %error,
                    limits = requests.len(),
                    "could not give back units reserved on a Redis Cluster hash tag; they return when the state expires"
                );
            }
        }
    }

    /// Runs `op` over the batch: one call, or one per hash tag on a cluster
    /// (each at its own master's time, or all at the client's time).
    async fn each_group(
        &self,
        op: Op,
        at: u64,
        requests: &[Request<'_>],
    ) -> Result<Vec<Decision>, BackendError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let time = self.time();
        let Some(groups) = self.groups(requests) else {
            return Ok(self.call(op, time, at, requests, None).await?.decisions);
        };
        let deadline = self.deadline();
        let mut decided = vec![None; requests.len()];
        for group in &groups {
            let reply = self
                .call_until(deadline, op, time, at, &group.requests, None)
                .await?;
            group.place(&reply.decisions, &mut decided);
        }
        Ok(decided.into_iter().flatten().collect())
    }
}

impl Backend for RedisBackend {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(self.acquire_batch(requests, None))
    }

    /// Idempotent acquire (see [`Backend::acquire_once`]), in the same
    /// call and round trip: the reply of an allowed call is kept under
    /// `<first key>:req:<escaped id>` (same hash slot as the call's keys) for
    /// the longest period of the call, and returned again by any call with
    /// the same id and first key. On a cluster, a call over several hash
    /// tags keeps one reply per hash tag (see the type's docs).
    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(self.acquire_batch(requests, Some(request_id)))
    }

    fn cancel_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            validate(requests)?;
            if requests.is_empty() {
                return Ok(());
            }
            // On a cluster each hash tag kept its own reply under its own
            // request-id key: each is cancelled by its own call.
            match self.groups(requests) {
                None => {
                    self.call(Op::CancelOnce, self.time(), 0, requests, Some(request_id))
                        .await?;
                }
                Some(groups) => {
                    for group in &groups {
                        self.call(
                            Op::CancelOnce,
                            self.time(),
                            0,
                            &group.requests,
                            Some(request_id),
                        )
                        .await?;
                    }
                }
            }
            Ok(())
        })
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(async move {
            validate(requests)?;
            let decisions = self.each_group(Op::Peek, 0, requests).await?;
            if decisions.len() != requests.len() {
                return Err(BackendError::protocol(
                    "a limit of the call was left undecided",
                ));
            }
            Ok(Decisions::new(decisions))
        })
    }

    fn peek_ahead<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        ahead: std::time::Duration,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(async move {
            validate(requests)?;
            // 0 is the plain peek (its single-limit entry points).
            let ahead = u64::try_from(ahead.as_micros())
                .unwrap_or(u64::MAX)
                .min(MAX_AHEAD_US);
            let decisions = self.each_group(Op::Peek, ahead, requests).await?;
            if decisions.len() != requests.len() {
                return Err(BackendError::protocol(
                    "a limit of the call was left undecided",
                ));
            }
            Ok(Decisions::new(decisions))
        })
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        // Like the memory backend, refunds are not validated: giving back
        // more than was taken only empties the state.
        Box::pin(async move {
            self.each_group(Op::Refund, at_micros, requests)
                .await
                .map(drop)
        })
    }

    fn charge<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            Request::check_charge(requests).map_err(BackendError::Invalid)?;
            self.each_group(Op::Charge, 0, requests).await.map(drop)
        })
    }

    fn hold<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        after: Duration,
        left: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            Request::check_charge(requests).map_err(BackendError::Invalid)?;
            // The units left travel as each request's cost.
            let held: Vec<Request<'_>> = requests
                .iter()
                .map(|r| Request { cost: left, ..*r })
                .collect();
            let after = micros(after);
            self.each_group(Op::Hold, after, &held).await.map(drop)
        })
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move { self.each_group(Op::Reset, 0, requests).await.map(drop) })
    }

    /// Reads `<key>:b` (one call; see `lua/block.lua`).
    fn blocks<'a>(
        &'a self,
        key: &'a ratewall::Key,
    ) -> BoxFuture<'a, Result<Vec<ratewall::backend::Block>, BackendError>> {
        Box::pin(self.identity_blocks(key))
    }

    /// Drops `<key>:b` (one call; see `lua/block.lua`).
    fn unblock<'a>(&'a self, key: &'a ratewall::Key) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.lift_blocks(key))
    }

    fn cancels_once(&self) -> bool {
        true
    }

    fn reserves(&self) -> bool {
        true
    }

    /// Reserves a slot for a waiting call in one call (see
    /// [`Backend::reserve`]); on a cluster, a call over several hash tags
    /// agrees on one slot group by group (see `crate::reserve`).
    fn reserve<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        max_wait: Duration,
    ) -> BoxFuture<'a, Result<ratewall::backend::Reservation, BackendError>> {
        Box::pin(self.reserve_batch(requests, max_wait))
    }

    fn cancel<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        reservation: &'a ratewall::backend::Reservation,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.cancel_batch(requests, reservation))
    }

    /// Renews in-flight leases: one call for the whole batch (on a cluster,
    /// one per hash tag), each slot a full lease again from the server's
    /// `TIME`.
    fn renew<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(self.renew_leases(requests))
    }

    /// Writes the limits registry (`<prefix>:{limits}`, see [`crate::RegisteredLimits`]).
    fn publish_limits<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        limits: &'a [ratewall::Limit],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.publish(prefix, name, limits))
    }

    /// Changes the learned scale at `<prefix>:{learned}:<name>` (see `crate::learned`).
    fn adjust<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        adjust: ratewall::upstream::Adjust,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(self.adjust_learned(prefix, name, adjust))
    }

    /// Writes the shared allow and deny lists (`<prefix>:{lists}`, see `crate::lists`).
    fn save_list_entry<'a>(
        &'a self,
        prefix: &'a str,
        entry: &'a ratewall::lists::ListEntry,
        removed: bool,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.save_list(prefix, entry, removed))
    }

    /// Leases in one `FCALL` of `<library>_lease` (see `lua/lease.lua`);
    /// on a cluster, a call over several hash tags takes no lease (it is
    /// decided as [`Backend::acquire`] decides it).
    fn acquire_lease<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        extra: &'a [u64],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ratewall::backend::Leased, BackendError>> {
        Box::pin(self.lease_batch(requests, extra, ttl))
    }

    /// Gives each lease back with one call on its own key.
    fn return_lease<'a>(
        &'a self,
        returns: &'a [ratewall::backend::LeaseReturn<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.release_batch(returns))
    }

    /// Subscribes to the refund notices of key prefix `prefix` (see
    /// [`RedisBackendBuilder::refund_notices`](crate::RedisBackendBuilder::refund_notices)):
    /// one pub/sub connection per prefix, shared by the limiters of this
    /// backend that listen to it; `false` when notices are turned off.
    fn subscribe_refunds(&self, prefix: &str, notices: ratewall::backend::RefundNotices) -> bool {
        match &self.notices {
            Some(own) => own.subscribe(prefix, notices),
            None => false,
        }
    }

    /// Reads the shared allow and deny lists when their version moved.
    fn load_lists<'a>(
        &'a self,
        prefix: &'a str,
        known: u64,
    ) -> BoxFuture<'a, Result<Option<ratewall::backend::SharedLists>, BackendError>> {
        Box::pin(self.load_list(prefix, known))
    }
}

impl RedisBackend {
    async fn renew_leases(&self, requests: &[Request<'_>]) -> Result<Vec<bool>, BackendError> {
        if let Some(request) = requests.iter().find(|r| !r.limit.is_in_flight()) {
            return Err(BackendError::Invalid(ratewall::error::LimitError::BadCall(
                format!(
                    "only in-flight slots have leases to renew, not {}",
                    request.limit
                ),
            )));
        }
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let time = self.time();
        let Some(groups) = self.groups(requests) else {
            return Ok(self.call(Op::Renew, time, 0, requests, None).await?.renewed);
        };
        // Hash tags are independent: renewed side by side (a few at a time).
        let deadline = self.deadline();
        let mut renewed = vec![false; requests.len()];
        use futures_util::StreamExt as _;
        let mut calls: Vec<BoxFuture<'_, Result<(&Group<'_>, Reply), BackendError>>> = Vec::new();
        for group in &groups {
            calls.push(Box::pin(async move {
                self.call_until(deadline, Op::Renew, time, 0, &group.requests, None)
                    .await
                    .map(|reply| (group, reply))
            }));
        }
        let mut replies = futures_util::stream::iter(calls).buffer_unordered(16);
        while let Some(reply) = replies.next().await {
            let (group, reply) = reply?;
            for (&position, &flag) in group.positions.iter().zip(&reply.renewed) {
                renewed[position] = flag;
            }
        }
        Ok(renewed)
    }

    /// The connection and settings, for the limits registry (`crate::registry`).
    pub(crate) fn parts(&self) -> (&Connection, &Settings) {
        (&self.connection, &self.settings)
    }
}
