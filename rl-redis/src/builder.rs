//! [`RedisBackendBuilder`]: where to connect and how to decide.

use std::fmt;
#[cfg(feature = "cluster")]
use std::future::Future;
#[cfg(feature = "cluster")]
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ratewall::{clock::Clock, error::BackendError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "sentinel")]
use redis::{AsyncConnectionConfig, RedisConnectionInfo};
use tokio::time::Instant;

use crate::backend::{Connection, RedisBackend, Settings};
use crate::call_mode::CallMode;
use crate::error::from_redis;
use crate::notices::{Notices, Source};
use crate::own_connection::Given;
use crate::probe::{self, PROBE_TIMEOUT};
use crate::redact::redact_url as redact;
#[cfg(feature = "cluster")]
use crate::renewing::{Renewing, Reopen};
use crate::script;
#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// Retries of one reconnection (after its first attempt): none, so a
/// refused connection costs a call well under 50 ms, not a backoff series;
/// the next call tries again (paced by the limiter's circuit breaker), so a
/// restarted server is used again at the first call after it is up.
const RECONNECT_ATTEMPTS: usize = 0;

/// How long a Redis Cluster client waits before retrying a call that met
/// a node's error it retries later (`TRYAGAIN`, `CLUSTERDOWN`, a node not
/// connected yet), in ms: at least, and at most.
#[cfg(feature = "cluster")]
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (5, 200);

/// The longest extra TTL: about 100 years, far inside what `PEXPIRE` takes.
const MAX_EXTRA_TTL_MS: u64 = 100 * 365 * 86_400 * 1_000;

enum Target {
    Standalone(String),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    /// The application's own connection to one server.
    Given(Given),
    /// The application's own Redis Cluster connection.
    #[cfg(feature = "cluster")]
    GivenCluster(redis::cluster_async::ClusterConnection),
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

/// How to log in to the master of a Sentinel deployment (the sentinels'
/// own credentials go in their URLs).
#[derive(Default)]
struct MasterAuth {
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// Whether the master (and replicas) are reached over TLS.
    tls: bool,
}

/// Configures a [`RedisBackend`]; made by [`RedisBackend::builder`],
/// [`RedisBackend::cluster_builder`] or [`RedisBackend::sentinel_builder`]
/// from URLs, or by [`RedisBackend::builder_with_connection`] or
/// `RedisBackend::cluster_builder_with_connection` on the application's
/// own connection.
///
/// ```no_run
/// use ratewall::clock::ManualClock;
/// use ratewall_redis::RedisBackend;
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), ratewall::error::BackendError> {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379/")
///     .timeout(Duration::from_millis(200))
///     .client_clock(clock.clone()) // tests only: decide on the client's time
///     .connect()
///     .await?;
/// assert_eq!(backend.timeout(), Duration::from_millis(200));
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `.connect()`"]
pub struct RedisBackendBuilder {
    target: Target,
    timeout: Duration,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    extra_ttl: Duration,
    master_auth: MasterAuth,
    call_mode: CallMode,
    refund_notices: bool,
    /// Whether calls of concurrent callers are coalesced.
    coalesce: bool,
    /// The most calls coalesced into one (checked at connect: at least 1).
    coalesce_max: usize,
    coalesce_in_flight: usize,
    /// Where a backend on the application's connection subscribes to
    /// refund notices.
    pubsub: Vec<redis::Client>,
    /// After how long with no cluster node heard the cluster connection is
    /// opened again: `None` until set (then 5 × the timeout, at least
    /// 5 s), `Some(None)`: never.
    #[cfg(feature = "cluster")]
    reopen_stalled_cluster: Option<Option<Duration>>,
    #[cfg(feature = "__tls")]
    tls: crate::tls::Certificates,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("RedisBackendBuilder");
        f.field("target", &self.describe())
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("client_clock", &self.clock)
            .field("extra_ttl", &self.extra_ttl)
            .field("master_username", &self.master_auth.username)
            .field("master_db", &self.master_auth.db)
            .field("master_tls", &self.master_auth.tls)
            .field("call_mode", &self.call_mode)
            .field("refund_notices", &self.refund_notices)
            .field("coalesce", &self.coalesce)
            .field("coalesce_max", &self.coalesce_max)
            .field("coalesce_in_flight", &self.coalesce_in_flight)
            .field("pubsub_clients", &self.pubsub.len());
        #[cfg(feature = "cluster")]
        f.field("reopen_stalled_cluster", &self.reopen_stalled_cluster);
        #[cfg(feature = "__tls")]
        f.field("tls", &self.tls);
        f.finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            timeout: RedisBackend::DEFAULT_TIMEOUT,
            connect_timeout: RedisBackend::DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            extra_ttl: Duration::ZERO,
            master_auth: MasterAuth::default(),
            call_mode: CallMode::Auto,
            refund_notices: true,
            coalesce: false,
            coalesce_max: crate::coalesce::DEFAULT_MAX,
            coalesce_in_flight: crate::coalesce::DEFAULT_IN_FLIGHT,
            pubsub: Vec::new(),
            #[cfg(feature = "cluster")]
            reopen_stalled_cluster: None,
            #[cfg(feature = "__tls")]
            tls: crate::tls::Certificates::default(),
        }
    }

    pub(crate) fn standalone(url: String) -> Self {
        Self::new(Target::Standalone(url))
    }

    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(urls: Vec<String>) -> Self {
        Self::new(Target::Cluster(urls))
    }

    pub(crate) fn given(connection: Given) -> Self {
        Self::new(Target::Given(connection))
    }

    #[cfg(feature = "cluster")]
    pub(crate) fn given_cluster(connection: redis::cluster_async::ClusterConnection) -> Self {
        Self::new(Target::GivenCluster(connection))
    }

    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(sentinels: Vec<String>, master_name: String) -> Self {
        Self::new(Target::Sentinel {
            sentinels,
            master_name,
        })
    }

    /// Sentinel deployments only: the credentials to log in to the master
    /// with (`AUTH [username] password`). The sentinels' own credentials, if
    /// any, go in their URLs. Ignored for the other deployments, whose URLs
    /// carry the credentials.
    pub fn master_credentials(mut self, username: Option<&str>, password: &str) -> Self {
        self.master_auth.username = username.map(str::to_owned);
        self.master_auth.password = Some(password.to_owned());
        self
    }

    /// Sentinel deployments only: the database number to use on the master
    /// (default 0). Ignored for the other deployments (give it in the URL).
    pub fn master_db(mut self, db: i64) -> Self {
        self.master_auth.db = db;
        self
    }

    /// Sentinel deployments only: reach the master over TLS (feature `tls`
    /// or `tls-aws-lc-rs`; the sentinels' own scheme is that of their URLs,
    /// `rediss://` for TLS). Certificates are checked against the system's
    /// roots, or those given to [`RedisBackendBuilder::tls_root_certificates`].
    #[cfg(all(feature = "__tls", feature = "sentinel"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(all(any(feature = "tls", feature = "tls-aws-lc-rs"), feature = "sentinel")))
    )]
    pub fn master_tls(mut self, tls: bool) -> Self {
        self.master_auth.tls = tls;
        self
    }

    /// Trust these CA certificates (PEM) instead of the system's roots for
    /// every TLS connection (`rediss://` URLs, a Sentinel master with
    /// `RedisBackendBuilder::master_tls`), e.g. a private CA. Feature `tls`
    /// or `tls-aws-lc-rs`; PEM that holds no certificate fails
    /// [`RedisBackendBuilder::connect`], saying so.
    #[cfg(feature = "__tls")]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc-rs"))))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.roots = Some(pem.into());
        self
    }

    /// Present this client certificate chain and private key (both PEM)
    /// on every TLS connection, for servers that require client
    /// certificates (`tls-auth-clients yes`). Feature `tls` or
    /// `tls-aws-lc-rs`; a chain or key that cannot be read fails
    /// [`RedisBackendBuilder::connect`], saying which.
    #[cfg(feature = "__tls")]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc-rs"))))]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// How calls run their Lua code (default [`CallMode::Auto`]: a
    /// Functions library where the server takes one, scripts otherwise).
    pub fn call_mode(mut self, mode: CallMode) -> Self {
        self.call_mode = mode;
        self
    }

    /// Whether refunds are told to the other processes sharing the server,
    /// and heard from them (default `true`).
    ///
    /// A call that gives room back (a refund, a settled estimate given
    /// back, a call cancelled by its request id, a reset, an identity's
    /// blocks lifted; not a compensation inside a refused cluster call)
    /// publishes one notice
    /// per key that got something back, in the same Lua call: `PUBLISH
    /// <prefix>:{refunds} <origin><key>` (about 50 bytes; nothing is
    /// stored). A limiter built over this backend subscribes to its
    /// prefix's channel (one pub/sub connection per backend and prefix),
    /// and on a notice forgets the refusals its deny cache remembers for
    /// the key and wakes one of its calls waiting under it. A refund by
    /// one instance is then usable by every other within one pub/sub
    /// delivery (typically a few milliseconds; the test suite holds it
    /// under 100 ms) instead of after the deny cache's maximum hold (1 s
    /// by default), and a waiting call is admitted then instead of at its
    /// next retry. A notice lost while a subscription is down is made up
    /// for by that maximum hold, as without notices.
    ///
    /// The cost: one `PUBLISH` per refund that gave something back (about
    /// 1 us more in the refund's Lua call on a standalone server; on a
    /// Redis Cluster about 2 us on the key's master and 3 us on every
    /// other node, which the cluster bus carries it to: measured in
    /// `src/notices.rs`), one delivery of it to each listening instance,
    /// there a parse and one deny-cache and one waiting-call lookup per
    /// key; acquires pay nothing. `false` turns both off, e.g. where
    /// refunds are frequent and no instance keeps a deny cache or waiting
    /// calls. See the `ratewall_refund_notices_subscribed` gauge and the
    /// `ratewall_refund_notices_total` counter.
    pub fn refund_notices(mut self, enabled: bool) -> Self {
        self.refund_notices = enabled;
        self
    }

    /// Whether the calls of concurrent callers are coalesced into one Lua
    /// call (default `false`).
    ///
    /// Without it, every call is one `FCALL`, and part of every decision's
    /// server time is the cost of a call itself (reading the command,
    /// finding the function, writing the reply). With it, the backend sends
    /// a call at once, alone, while fewer than
    /// [`RedisBackendBuilder::coalesce_in_flight`] calls of its kind are in
    /// flight and none waits (so a lone call is never delayed, and there is
    /// no timer); the calls made while they are all in flight wait, and
    /// when one returns they go together, up to
    /// [`RedisBackendBuilder::coalesce_max`] of them, as
    /// one `FCALL` of the library's `<library>_many` entry (read-only calls
    /// apart, in `<library>_many_ro`), which runs each of them exactly as
    /// it would have run alone, one after the other, and answers each
    /// caller with its own reply. A call's error (a key of the wrong type,
    /// say) comes back to its caller only. Each caller keeps its timeout:
    /// one that runs out fails with [`BackendError::Timeout`], and its
    /// call may still be decided, as a call alone that timed out after it
    /// was sent.
    ///
    /// Off by default while it is young. Measured (`docs/perf/coalesce.md`,
    /// the `loadgen` example's `--compare-coalesce`, the defaults, one
    /// server, four runs): 1.81–2.29× the decisions per second of calls
    /// alone at 64 callers and 2.56–3.10× at 256, 0.40–0.54× and
    /// 0.35–0.41× the scripts' server time per decision, lower p50 from
    /// 16 callers up, and the same with one caller (every call goes
    /// alone); in [`CallMode::Scripts`] (`docs/perf/coalesce_scripts.md`,
    /// three runs, both sides scripts) 1.67–2.21× and 2.39–3.19×, and
    /// 0.36–0.53× and 0.26–0.38× the scripts' time.
    ///
    /// What is coalesced: [`Backend::acquire`](ratewall::backend::Backend::acquire)
    /// and `acquire_once`, `peek` and `peek_ahead`, `refund`, `charge` and
    /// `hold` (a decision, and settling its cost). Everything else goes
    /// alone as before: resets, cancels by request id, reservations of
    /// waiting calls, in-flight lease renewals, quota leases, blocks,
    /// lists, the limits registry and learned scales.
    ///
    /// Where: on a connection to one server (a URL, the application's own
    /// connection, TLS, Sentinel's master) and on a Redis Cluster, in
    /// [`CallMode::Functions`] and in [`CallMode::Scripts`] (where the
    /// coalesced entries are scripts sent by `EVALSHA`, each holding every
    /// algorithm's code; [`RedisBackend::coalesces`] says whether a
    /// backend coalesces). On a cluster only
    /// single-limit acquires are coalesced, per master: the backend reads
    /// which master serves which slot (`CLUSTER SLOTS`) and queues each
    /// master's calls apart, into `<library>_many_node` (flagged
    /// `allow-cross-slot-keys`: its calls' keys may be of any slots that
    /// master serves; as a script, sent without flags, it may touch them
    /// too). A call whose slot the master no longer serves (or
    /// is moving, its key not there yet) fails there before it writes
    /// anything and is sent again alone, following the cluster's
    /// redirections; the map is read again (see
    /// [`CoalescedCalls::rerouted`](crate::CoalescedCalls::rerouted)).
    /// When the server lost the library, a coalesced call loads it again
    /// and is sent again, and if it is still missing, each of its calls
    /// goes alone by `EVAL`, as a call alone does; when it lost the
    /// coalesced script, the call goes again by `EVAL` of the script's
    /// source.
    /// [`RedisBackend::coalesced`] counts what was coalesced.
    pub fn coalesce(mut self, enabled: bool) -> Self {
        self.coalesce = enabled;
        self
    }

    /// The most calls coalesced into one (default 64; see
    /// [`RedisBackendBuilder::coalesce`]): a longer queue goes in several
    /// coalesced calls, one after the other. 0 makes
    /// [`RedisBackendBuilder::connect`] fail.
    pub fn coalesce_max(mut self, calls: usize) -> Self {
        self.coalesce_max = calls;
        self
    }

    /// The most calls of one kind (that may write, or peeks) in flight at
    /// once on a coalescing backend (default 2; see
    /// [`RedisBackendBuilder::coalesce`]): a call goes at once, alone, while
    /// fewer are in flight and none waits; else it waits, and each call in
    /// flight that returns sends the calls waiting then as one. Measured
    /// (`docs/perf/coalesce.md`): 1 pipelines least (slower than calls
    /// alone at 64 callers); 2 did best at 16 concurrent callers and as
    /// well as 3 or 4 at 64 and 256; with about a thousand, 4 did better
    /// (1.7–2.0× the decisions per second of calls alone, against
    /// 1.3–1.75× with 2). 0 makes
    /// [`RedisBackendBuilder::connect`] fail.
    pub fn coalesce_in_flight(mut self, calls: usize) -> Self {
        self.coalesce_in_flight = calls;
        self
    }

    /// The client that a backend on the application's own connection
    /// ([`RedisBackend::builder_with_connection`],
    /// `RedisBackend::cluster_builder_with_connection`) opens its refund
    /// notices subscription with: `SUBSCRIBE` takes a connection of its
    /// own, which the application's multiplexed connection cannot be.
    /// Its URL, credentials and TLS are the client's own (a `rediss://` client needs a TLS feature of redis-rs, as it
    /// does for the application). Given again, adds another server, tried
    /// in turn when one cannot be reached: on a Redis Cluster, clients to
    /// several nodes (a cluster carries every `PUBLISH` to every node, so
    /// any one hears all).
    ///
    /// Without one, such a backend tells its refunds but hears none of
    /// the others' (see [`RedisBackendBuilder::refund_notices`]): a
    /// refusal its limiter's deny cache remembers lasts until the cache's
    /// maximum hold (1 s by default), and a waiting call wakes at its own
    /// retry. Ignored by a backend built from URLs, which subscribes on
    /// the servers they name.
    pub fn pubsub_client(mut self, client: redis::Client) -> Self {
        self.pubsub.push(client);
        self
    }

    /// After how long with its calls unanswered a backend on a Redis
    /// Cluster opens a new cluster connection (default: 5 × the
    /// [timeout](RedisBackendBuilder::timeout), at least 5 s; `None`:
    /// never; `Some` of less than a millisecond makes
    /// [`RedisBackendBuilder::connect`] fail, on any backend).
    ///
    /// redis-rs's async cluster client (1.8) can stall for good while
    /// slots move under load: its slot refresh waits for a lock that a
    /// request it no longer polls holds, and every later call through it
    /// times out. When, from the first call that timed out, lost its
    /// connection or was dropped unfinished by its caller, to one at least
    /// this much later, no call was answered by a server (an error reply
    /// is an answer; a pause with no calls is not), the backend opens a
    /// new cluster connection in the background (given the
    /// [connect timeout](RedisBackendBuilder::connect_timeout)) and sends
    /// the calls after through it; meanwhile calls follow the failure
    /// policy, as any call that times out does. One opening at a time,
    /// and one that fails keeps the old connection and waits a whole
    /// period before the next. Each is logged (`WARN`, or `ERROR` when it
    /// fails); those that succeed are counted
    /// ([`RedisBackend::cluster_connections_reopened`]). A connection the
    /// application gave
    /// ([`RedisBackend::cluster_builder_with_connection`]) is never
    /// replaced. Otherwise ignored by a backend that is not on a cluster.
    #[cfg(feature = "cluster")]
    pub fn reopen_stalled_cluster(mut self, after: Option<Duration>) -> Self {
        self.reopen_stalled_cluster = Some(after);
        self
    }

    /// The longest a call may take (default [`RedisBackend::DEFAULT_TIMEOUT`]);
    /// beyond it the call fails with [`BackendError::Timeout`]. A call that
    /// timed out may still have been applied by the server.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest [`RedisBackendBuilder::connect`] may take (default
    /// [`RedisBackend::DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Decide with this clock instead of the server's `TIME`.
    ///
    /// Every app instance should then see the same time: client clocks drift
    /// and are skewed across machines, which is why the server's time is the
    /// default. Meant for deterministic tests with a [`ratewall::clock::ManualClock`].
    pub fn client_clock(self, clock: impl Clock) -> Self {
        self.shared_client_clock(Arc::new(clock))
    }

    /// Like [`RedisBackendBuilder::client_clock`], with a shared clock.
    pub fn shared_client_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Keeps every key this much longer than needed (default zero: a key
    /// expires as soon as its state is equivalent to no state). Decisions do
    /// not depend on it: a state past its time is treated as fresh.
    ///
    /// Only useful with a client clock that does not advance with real time
    /// (a [`ratewall::clock::ManualClock`] in tests), because Redis expires keys in
    /// real time.
    pub fn extra_ttl(mut self, extra: Duration) -> Self {
        self.extra_ttl = extra;
        self
    }

    /// Whether the connection is the application's.
    fn is_given(&self) -> bool {
        match &self.target {
            Target::Given(_) => true,
            #[cfg(feature = "cluster")]
            Target::GivenCluster(_) => true,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::Standalone(url) => redact(url),
            Target::Given(_) => "the application's Redis connection".to_owned(),
            #[cfg(feature = "cluster")]
            Target::GivenCluster(_) => "the application's Redis Cluster connection".to_owned(),
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|url| redact(url)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                sentinels,
                master_name,
            } => {
                let urls: Vec<String> = sentinels.iter().map(|url| redact(url)).collect();
                format!("master `{master_name}` of sentinels [{}]", urls.join(", "))
            }
        }
    }

    /// Connects (checking the server answers and, in
    /// [`CallMode::Functions`] or [`CallMode::Auto`], loading the Functions
    /// library) and builds the backend. The connection reconnects by itself
    /// afterwards; with sentinels, the master is looked up through them now
    /// and again whenever it fails (so fail-overs are followed). On the
    /// application's own connection nothing is opened: the library is
    /// loaded on it (`PING` instead in [`CallMode::Scripts`]), within the
    /// connect timeout.
    ///
    /// When the address does not speak Redis the way the URL asks (an HTTP
    /// server, a TLS port reached with `redis://`, a plain one with
    /// `rediss://`), the error says so in a sentence (`not a Redis server
    /// at 127.0.0.1:8080: it answered "HTTP/1.1 400 Bad Request"`, `...: it
    /// speaks TLS; for TLS use rediss://`), found by one more look at the
    /// address (at most a second) after the failure.
    ///
    /// # Errors
    /// A [`BackendError`] when the backend cannot be built:
    /// [`BackendError::Unavailable`] for a URL that cannot be read, a
    /// [`RedisBackendBuilder::coalesce_max`] or
    /// [`RedisBackendBuilder::coalesce_in_flight`] of 0, a
    /// `reopen_stalled_cluster` period under a millisecond, a server
    /// that cannot be reached or drops the connection, or (with sentinels) a
    /// master the sentinels do not name;
    /// [`BackendError::Timeout`] when connecting takes longer than the connect
    /// timeout; [`BackendError::Protocol`] when the address answers but not as
    /// asked (not Redis, or TLS where the URL says plain or the reverse: the
    /// message says which), when the server refuses the Functions library in
    /// [`CallMode::Functions`], or for any other reply the backend cannot use.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        if self.coalesce_max == 0 {
            return Err(BackendError::unavailable(
                "coalesce_max(0): a coalesced call carries at least one call; give 1 or more",
            ));
        }
        #[cfg(feature = "cluster")]
        if let Some(Some(after)) = self.reopen_stalled_cluster
            && after.as_millis() == 0
        {
            return Err(BackendError::unavailable(format!(
                "reopen_stalled_cluster(Some({after:?})): a connection is opened again after \
                 calls went unanswered for a while; give a period of 1 ms or more, or None for \
                 never"
            )));
        }
        if self.coalesce_in_flight == 0 {
            return Err(BackendError::unavailable(
                "coalesce_in_flight(0): at least one call must be in flight; give 1 or more",
            ));
        }
        let target = self.describe();
        let timeout = self.connect_timeout;
        let connect_timeout = self.connect_timeout;
        let call_mode = self.call_mode;
        let addresses = probe::addresses(self.urls());
        let settings = Settings {
            target: target.clone().into(),
            timeout: self.timeout,
            clock: self.clock.clone(),
            extra_ttl_ms: u64::try_from(self.extra_ttl.as_millis())
                .unwrap_or(u64::MAX)
                .min(MAX_EXTRA_TTL_MS),
            mode: call_mode,
        };
        let what = if self.is_given() {
            format!("starting on {target}")
        } else {
            format!("connecting to {target}")
        };
        let connecting = async {
            let connection = self.open(&target).await?;
            let mode = resolve_mode(&connection, call_mode, &what, timeout)
                .await
                .map_err(OpenError::Backend)?;
            Ok::<_, OpenError>((connection, mode))
        };
        let probe_timeout = PROBE_TIMEOUT.min(connect_timeout);
        let (connection, mode) = match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(OpenError::Backend(error))) => return Err(error),
            Ok(Err(OpenError::Redis(error))) => {
                if probe::worth_probing(&error)
                    && let Some(sentence) = probe::explain(&addresses, probe_timeout).await
                {
                    return Err(BackendError::protocol(format_args!("{what}: {sentence}")));
                }
                return Err(from_redis(&what, &error, connect_timeout));
            }
            Err(_) => {
                // A TLS handshake with a plain server waits for an answer
                // that never comes; a client reconnecting after replies
                // that are not RESP can run out of time as well.
                if let Some(sentence) = probe::explain(&addresses, probe_timeout).await {
                    return Err(BackendError::protocol(format_args!("{what}: {sentence}")));
                }
                return Err(BackendError::Timeout(connect_timeout));
            }
        };
        #[cfg(feature = "sentinel")]
        if let Connection::Sentinel(sentinel) = &connection {
            sentinel.watch_switches();
        }
        let notices = if self.refund_notices {
            let source = self
                .notice_source(&connection, &target)
                .map_err(|error| match error {
                    OpenError::Backend(error) => error,
                    OpenError::Redis(error) => from_redis(&what, &error, connect_timeout),
                })?;
            Some(Notices::new(
                settings.target.clone(),
                source,
                connect_timeout,
            ))
        } else {
            None
        };
        Ok(RedisBackend::from_parts(
            connection,
            Settings { mode, ..settings },
            notices,
            self.coalesce
                .then_some((self.coalesce_max, self.coalesce_in_flight)),
        ))
    }

    /// Where the subscription to refund notices connects
    /// (`crate::notices`): the server, the cluster's seed nodes, or the
    /// sentinels' master, the way the URLs say.
    fn notice_source(&self, connection: &Connection, target: &str) -> Result<Source, OpenError> {
        use redis::IntoConnectionInfo as _;
        let urls: Vec<&str> = match &self.target {
            Target::Standalone(url) => vec![url.as_str()],
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => urls.iter().map(String::as_str).collect(),
            Target::Given(_) => return Ok(Source::Plain(self.pubsub.clone())),
            #[cfg(feature = "cluster")]
            Target::GivenCluster(_) => return Ok(Source::Plain(self.pubsub.clone())),
            #[cfg(feature = "sentinel")]
            Target::Sentinel { .. } => {
                return match connection {
                    Connection::Sentinel(sentinel) => Ok(Source::Sentinel(sentinel.clone())),
                    _ => Err(invalid(format!(
                        "{target}: a sentinel master without its connection"
                    ))),
                };
            }
        };
        let _ = connection;
        let mut plain = Vec::with_capacity(urls.len());
        let mut tls = false;
        for url in urls {
            let (url, is_tls) = crate::url::plain(url)
                .map_err(|why| invalid(format!("invalid Redis URL {target}: {why}")))?;
            tls |= is_tls;
            plain.push(
                url.as_str()
                    .into_connection_info()
                    .map_err(OpenError::Redis)?,
            );
        }
        if !tls {
            let clients = plain
                .into_iter()
                .map(redis::Client::open)
                .collect::<Result<_, _>>()
                .map_err(OpenError::Redis)?;
            return Ok(Source::Plain(clients));
        }
        self.tls_notice_source(plain, target)
    }

    /// [`RedisBackendBuilder::notice_source`] over TLS: `nodes` are the
    /// servers' plain addresses.
    #[cfg(feature = "__tls")]
    fn tls_notice_source(
        &self,
        nodes: Vec<redis::ConnectionInfo>,
        target: &str,
    ) -> Result<Source, OpenError> {
        let nodes = nodes
            .into_iter()
            .map(|info| match info.addr() {
                redis::ConnectionAddr::Tcp(host, port) => {
                    Ok((host.clone(), *port, info.redis_settings().clone()))
                }
                _ => Err(invalid(format!(
                    "invalid Redis URL {target}: TLS needs a TCP address"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Source::Tls {
            connector: self.connector(target)?,
            nodes,
        })
    }

    #[cfg(not(feature = "__tls"))]
    fn tls_notice_source(
        &self,
        _nodes: Vec<redis::ConnectionInfo>,
        target: &str,
    ) -> Result<Source, OpenError> {
        Err(needs_tls(target))
    }

    /// The URLs of the servers named: the server, the cluster's seed nodes
    /// or the sentinels.
    fn urls(&self) -> Vec<&str> {
        match &self.target {
            Target::Standalone(url) => vec![url.as_str()],
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => urls.iter().map(String::as_str).collect(),
            Target::Given(_) => Vec::new(),
            #[cfg(feature = "cluster")]
            Target::GivenCluster(_) => Vec::new(),
            #[cfg(feature = "sentinel")]
            Target::Sentinel { sentinels, .. } => sentinels.iter().map(String::as_str).collect(),
        }
    }

    /// Opens the connection (checking the server answers); takes the
    /// application's as it is.
    async fn open(&self, target: &str) -> Result<Connection, OpenError> {
        match &self.target {
            Target::Given(given) => {
                if given.is_cluster {
                    return Err(invalid(format!(
                        "{target}: a Redis Cluster connection; build the backend with \
                         RedisBackend::with_cluster_connection or \
                         RedisBackend::cluster_builder_with_connection"
                    )));
                }
                self.checked(Connection::Given(given.clone())).await
            }
            #[cfg(feature = "cluster")]
            Target::GivenCluster(connection) => {
                let renewing = Renewing::new(
                    connection.clone(),
                    None,
                    self.stalled_after(),
                    self.connect_timeout,
                );
                self.checked(Connection::Cluster(renewing)).await
            }
            Target::Standalone(url) => {
                let (url, tls) = crate::url::plain(url)
                    .map_err(|why| invalid(format!("invalid Redis URL {target}: {why}")))?;
                if tls {
                    return self.open_tls(&url, target).await;
                }
                let client = redis::Client::open(url.as_str()).map_err(|err| {
                    OpenError::Backend(BackendError::unavailable_with_source(
                        format!("invalid Redis URL {target}: {err}"),
                        err,
                    ))
                })?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    // One connection attempt per reconnect: a refused
                    // connection fails the calls waiting on it at once (the
                    // next call tries again) instead of holding them through
                    // a backoff series; the breaker paces the tries.
                    .set_number_of_retries(RECONNECT_ATTEMPTS);
                let manager = ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(OpenError::Redis)?;
                Ok(Connection::Standalone(manager))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => {
                let mut nodes = Vec::with_capacity(urls.len());
                let mut tls = Vec::with_capacity(urls.len());
                for url in urls {
                    let (url, is_tls) = crate::url::plain(url).map_err(|why| {
                        invalid(format!("invalid Redis Cluster URLs {target}: {why}"))
                    })?;
                    nodes.push(url);
                    tls.push(is_tls);
                }
                // Retries after a redirection or a node's error wait 5 to
                // 200 ms (redis-rs waits at least 1.28 s by default, past
                // the 1 s a call has by default: a call that met a slot
                // being moved timed out instead of being retried).
                let client = ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                    .build()
                    .map_err(|err| {
                        OpenError::Backend(BackendError::unavailable_with_source(
                            format!("invalid Redis Cluster URLs {target}: {err}"),
                            err,
                        ))
                    })?;
                match (tls.iter().all(|t| *t), tls.iter().any(|t| *t)) {
                    (false, false) => {
                        let connection = client
                            .get_async_connection()
                            .await
                            .map_err(OpenError::Redis)?;
                        let reopen = self.reopens().then(|| {
                            reopener(&client, |client| async move {
                                client.get_async_connection().await
                            })
                        });
                        let renewing = Renewing::new(
                            connection,
                            reopen,
                            self.stalled_after(),
                            self.connect_timeout,
                        );
                        Ok(Connection::Cluster(renewing))
                    }
                    (true, _) => self.open_tls_cluster(&client, target).await,
                    (false, true) => Err(invalid(format!(
                        "invalid Redis Cluster URLs {target}: some nodes use TLS and others do \
                         not; every node of a Redis Cluster is reached the same way"
                    ))),
                }
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                sentinels,
                master_name,
            } => {
                let mut redis = RedisConnectionInfo::default().set_db(self.master_auth.db);
                if let Some(username) = &self.master_auth.username {
                    redis = redis.set_username(username);
                }
                if let Some(password) = &self.master_auth.password {
                    redis = redis.set_password(password);
                }
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout));
                #[cfg(feature = "__tls")]
                let tls = {
                    let sentinels_tls = sentinels
                        .iter()
                        .any(|url| crate::url::plain(url).is_ok_and(|(_, tls)| tls));
                    crate::sentinel::Tls {
                        master: self.master_auth.tls,
                        connector: if self.master_auth.tls || sentinels_tls {
                            Some(self.connector(target)?)
                        } else {
                            None
                        },
                    }
                };
                #[cfg(not(feature = "__tls"))]
                let tls = crate::sentinel::Tls::default();
                let connection =
                    SentinelConnection::new(sentinels, master_name.clone(), redis, config, tls)
                        .map_err(|err| {
                            OpenError::Backend(BackendError::unavailable_with_source(
                                format!("invalid sentinel URLs {target}: {err}"),
                                err,
                            ))
                        })?;
                connection.connection().await.map_err(OpenError::Redis)?;
                Ok(Connection::Sentinel(connection))
            }
        }
    }

    /// Whether a stalled cluster connection is opened again.
    #[cfg(feature = "cluster")]
    fn reopens(&self) -> bool {
        !matches!(self.reopen_stalled_cluster, Some(None))
    }

    /// After how long with calls unanswered a cluster connection is
    /// opened again ([`RedisBackendBuilder::reopen_stalled_cluster`];
    /// never: the longest wait, unused).
    #[cfg(feature = "cluster")]
    fn stalled_after(&self) -> Duration {
        match self.reopen_stalled_cluster {
            None => self.timeout.saturating_mul(5).max(Duration::from_secs(5)),
            Some(Some(after)) => after,
            Some(None) => Duration::MAX,
        }
    }

    /// `connection`, the application's, once it answered a `PING` in
    /// [`CallMode::Scripts`] (in the other modes, loading the library
    /// checks it next).
    async fn checked(&self, connection: Connection) -> Result<Connection, OpenError> {
        if self.call_mode == CallMode::Scripts {
            let deadline = Instant::now() + self.connect_timeout;
            match connection
                .query::<redis::Value>(deadline, &redis::cmd("PING"))
                .await
            {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(OpenError::Redis(error)),
                None => {
                    return Err(OpenError::Backend(BackendError::Timeout(
                        self.connect_timeout,
                    )));
                }
            }
        }
        Ok(connection)
    }

    /// This builder's TLS configuration, for `target`'s messages.
    #[cfg(feature = "__tls")]
    fn connector(&self, target: &str) -> Result<crate::tls::Connector, OpenError> {
        crate::tls::Connector::new(&self.tls, self.timeout)
            .map_err(|why| invalid(format!("invalid TLS settings for {target}: {why}")))
    }

    /// Opens a connection to one server over TLS (`url`: its `rediss://`
    /// URL made plain).
    #[cfg(feature = "__tls")]
    async fn open_tls(&self, url: &str, target: &str) -> Result<Connection, OpenError> {
        use redis::IntoConnectionInfo as _;
        let info = url.into_connection_info().map_err(|err| {
            OpenError::Backend(BackendError::unavailable_with_source(
                format!("invalid Redis URL {target}: {err}"),
                err,
            ))
        })?;
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(invalid(format!(
                "invalid Redis URL {target}: TLS needs a TCP address"
            )));
        };
        let connection = crate::tls::standalone::TlsStandalone::new(
            self.connector(target)?,
            host.clone(),
            *port,
            info.redis_settings().clone(),
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(self.timeout)),
        );
        connection.connection().await.map_err(OpenError::Redis)?;
        Ok(Connection::Tls(connection))
    }

    #[cfg(not(feature = "__tls"))]
    async fn open_tls(&self, _url: &str, target: &str) -> Result<Connection, OpenError> {
        Err(needs_tls(target))
    }

    /// Opens a Redis Cluster connection whose nodes are reached over TLS.
    #[cfg(all(feature = "cluster", feature = "__tls"))]
    async fn open_tls_cluster(
        &self,
        client: &redis::cluster::ClusterClient,
        target: &str,
    ) -> Result<Connection, OpenError> {
        let tls = crate::tls::cluster::register(&self.tls, self.timeout)
            .map_err(|why| invalid(format!("invalid TLS settings for {target}: {why}")))?;
        let connection = client
            .get_async_generic_connection::<crate::tls::cluster::TlsNode>()
            .await
            .map_err(OpenError::Redis)?;
        let reopen = self.reopens().then(|| {
            reopener(client, |client| async move {
                client
                    .get_async_generic_connection::<crate::tls::cluster::TlsNode>()
                    .await
            })
        });
        let renewing = Renewing::new(
            connection,
            reopen,
            self.stalled_after(),
            self.connect_timeout,
        );
        Ok(Connection::TlsCluster(renewing, tls))
    }

    #[cfg(all(feature = "cluster", not(feature = "__tls")))]
    async fn open_tls_cluster(
        &self,
        _client: &redis::cluster::ClusterClient,
        target: &str,
    ) -> Result<Connection, OpenError> {
        Err(needs_tls(target))
    }
}

/// Opens a new connection of `client` with `open` each time it is called
/// (a stalled cluster connection's replacement, see [`crate::renewing`]).
#[cfg(feature = "cluster")]
fn reopener<T, F, O>(client: &redis::cluster::ClusterClient, open: F) -> Reopen<T>
where
    F: Fn(redis::cluster::ClusterClient) -> O + Send + Sync + 'static,
    O: Future<Output = redis::RedisResult<T>> + Send + 'static,
{
    let client = client.clone();
    Arc::new(move || Box::pin(open(client.clone())) as Pin<Box<dyn Future<Output = _> + Send>>)
}

/// A setting that cannot work, said in `message`.
fn invalid(message: String) -> OpenError {
    OpenError::Backend(BackendError::unavailable(message))
}

/// Why `target` cannot be reached in a build without TLS.
#[cfg(not(feature = "__tls"))]
fn needs_tls(target: &str) -> OpenError {
    invalid(format!(
        "invalid Redis URL {target}: TLS (`rediss://`) needs the `tls` or `tls-aws-lc-rs` \
         feature of ratewall-redis"
    ))
}

/// Why opening a connection failed: a bad setting, or what the server (or
/// the network) did, which may be worth a look at the address.
enum OpenError {
    Backend(BackendError),
    Redis(redis::RedisError),
}

/// Decides how calls run their code: loads the Functions library for
/// [`CallMode::Functions`] (failing if it cannot) and [`CallMode::Auto`]
/// (falling back to scripts when the server refuses it).
async fn resolve_mode(
    connection: &Connection,
    wanted: CallMode,
    what: &str,
    timeout: Duration,
) -> Result<CallMode, BackendError> {
    if wanted == CallMode::Scripts {
        return Ok(CallMode::Scripts);
    }
    let deadline = Instant::now() + timeout;
    match connection
        .query::<redis::Value>(deadline, &script::load_library_command())
        .await
    {
        None => Err(BackendError::Timeout(timeout)),
        Some(Ok(_)) => Ok(CallMode::Functions),
        Some(Err(err)) => {
            let refused = !(err.is_io_error()
                || err.is_timeout()
                || err.is_connection_dropped()
                || err.is_connection_refusal());
            if wanted == CallMode::Auto && refused {
                tracing::info!(
                    error = %err,
                    "the server does not take a Functions library; the rate limiter uses EVALSHA scripts"
                );
                Ok(CallMode::Scripts)
            } else {
                let what = format!("{what}: loading the Functions library");
                Err(from_redis(&what, &err, timeout))
            }
        }
    }
}

/// The ways to build a backend: here, beside the builder they return.
impl RedisBackend {
    /// Configures a backend on one Redis server, e.g. `redis://127.0.0.1:6379/`
    /// (`rediss://` for TLS, with feature `tls` or `tls-aws-lc-rs`).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::standalone(url.into())
    }

    /// Configures a backend on a Redis Cluster, given the URLs of some of its nodes.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder<I, S>(urls: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::cluster(urls.into_iter().map(Into::into).collect())
    }

    /// Configures a backend on the master of a Redis Sentinel deployment:
    /// `sentinel_urls` are the sentinels' URLs (e.g.
    /// `redis://10.0.0.1:26379/`; one reachable sentinel suffices) and
    /// `master_name` the name they monitor the master under (`sentinel
    /// monitor <name> ...`). See [`RedisBackend::connect_sentinel`].
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder<I, S>(
        sentinel_urls: I,
        master_name: impl Into<String>,
    ) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::sentinel(
            sentinel_urls.into_iter().map(Into::into).collect(),
            master_name.into(),
        )
    }

    /// Connects to the master of a Redis Sentinel deployment with the
    /// default settings.
    ///
    /// The master is looked up through the sentinels (and checked to answer
    /// `ROLE` as a master) when connecting, and again after any call on it
    /// fails with an I/O error, a timeout, `READONLY` or `MASTERDOWN`, or a
    /// sentinel announces `+switch-master` for it: after a fail-over the same
    /// backend decides on the promoted replica as soon as the sentinels name
    /// it, without being rebuilt. Calls made in between fail with a
    /// [`BackendError`] within the timeout, like any outage. Needs a Tokio
    /// runtime (for the `+switch-master` listener, which ends when the
    /// backend is dropped).
    ///
    /// ```no_run
    /// use ratewall_redis::RedisBackend;
    /// # async fn demo() -> Result<(), ratewall::error::BackendError> {
    /// let backend = RedisBackend::connect_sentinel(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// assert!(!backend.is_cluster());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn connect_sentinel<I, S>(
        sentinel_urls: I,
        master_name: impl Into<String>,
    ) -> Result<Self, BackendError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::sentinel_builder(sentinel_urls, master_name)
            .connect()
            .await
    }

    /// Connects to one Redis server with the default settings (server time,
    /// 1 s timeout, reconnecting connection, [`CallMode::Auto`]).
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// Connects to a Redis Cluster with the default settings.
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn connect_cluster<I, S>(urls: I) -> Result<Self, BackendError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::cluster_builder(urls).connect().await
    }
}
