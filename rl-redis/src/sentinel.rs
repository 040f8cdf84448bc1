//! A connection to the master of a Redis Sentinel deployment that follows
//! fail-overs.
//!
//! redis-rs 1.8 discovers a master through sentinels
//! ([`redis::sentinel::Sentinel::async_master_for`], which also checks that
//! the node answers `ROLE` as a master) but has no connection that follows a
//! fail-over by itself. [`SentinelConnection`] keeps one multiplexed
//! connection to the current master and drops it when:
//!
//! - a call on it fails in a way that says the node is gone, frozen or no
//!   longer the master (I/O errors, timeouts, `READONLY`, `MASTERDOWN`); the
//!   next call asks the sentinels again;
//! - a sentinel announces a new master for the name: `+promoted-slave`
//!   (the moment the sentinels start naming the promoted replica) or
//!   `+switch-master` (the end of the fail-over). A background task stays
//!   subscribed on one of the sentinels, as the Sentinel client guidelines
//!   recommend; the next call connects to the announced address, after
//!   checking `ROLE` says master. Without this, a switch-over that leaves
//!   the old master running would keep deciding on it until the sentinels
//!   reconfigure it as a replica (up to their 10 s `INFO` period), and those
//!   decisions would be lost.
//!
//! Discovery is serialised: concurrent calls wait for one look-up instead of
//! each asking the sentinels.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, RedisResult, ServerErrorKind, Value,
};
use tokio::time::Instant;

/// The master connection and its generation.
type Current = Option<(u64, MultiplexedConnection)>;

/// The channel sentinels announce the end of a fail-over on:
/// `<name> <old-ip> <old-port> <new-ip> <new-port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// The channel sentinels announce a promoted replica on, as soon as it
/// answers as a master: `slave <ip:port> <ip> <port> @ <name> <old-ip>
/// <old-port>`.
const PROMOTED_SLAVE: &str = "+promoted-slave";

/// The longest the watcher waits to subscribe to one sentinel.
const WATCH_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause before the watcher tries the next sentinel.
const WATCH_RETRY_DELAY: Duration = Duration::from_millis(500);

/// How often the watcher checks that its backend still exists.
const WATCH_LIVENESS: Duration = Duration::from_secs(1);

/// TLS settings of a Sentinel deployment (the sentinels' own scheme comes
/// from their URLs).
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// Whether the master is reached over TLS.
    #[cfg(feature = "__tls")]
    pub(crate) master: bool,
    /// This crate's TLS, when the master or a sentinel is reached over TLS.
    #[cfg(feature = "__tls")]
    pub(crate) connector: Option<crate::tls::Connector>,
}

/// Where a connection goes: an address, whether over TLS, and how to log in.
struct Node<'a> {
    host: &'a str,
    port: u16,
    tls: bool,
    redis: &'a RedisConnectionInfo,
}

impl Tls {
    /// Whether the master is reached over TLS.
    fn master(&self) -> bool {
        #[cfg(feature = "__tls")]
        {
            self.master
        }
        #[cfg(not(feature = "__tls"))]
        {
            false
        }
    }

    /// Whether any connection is made over TLS: discovery is then done
    /// here (redis-rs' `Sentinel` connects with redis-rs' own TLS, which
    /// this crate does not use: see `crate::tls`).
    fn any(&self) -> bool {
        #[cfg(feature = "__tls")]
        {
            self.connector.is_some()
        }
        #[cfg(not(feature = "__tls"))]
        {
            false
        }
    }

    /// The connector of a TLS node.
    #[cfg(feature = "__tls")]
    fn connector(&self) -> RedisResult<&crate::tls::Connector> {
        self.connector.as_ref().ok_or_else(|| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "no TLS settings for a TLS node",
            ))
        })
    }

    /// A multiplexed connection to `node`.
    async fn multiplexed(
        &self,
        node: Node<'_>,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        #[cfg(feature = "__tls")]
        if node.tls {
            return self
                .connector()?
                .multiplexed(node.host, node.port, node.redis, config.clone())
                .await;
        }
        redis::Client::open(node.info()?)?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }

    /// A RESP2 pub/sub connection to `node`.
    async fn pubsub(&self, node: Node<'_>) -> RedisResult<redis::aio::PubSub> {
        #[cfg(feature = "__tls")]
        if node.tls {
            return self
                .connector()?
                .pubsub(node.host, node.port, node.redis)
                .await;
        }
        redis::Client::open(node.info()?)?.get_async_pubsub().await
    }
}

impl Node<'_> {
    /// The plain TCP address and login, for redis-rs.
    fn info(&self) -> RedisResult<redis::ConnectionInfo> {
        if self.tls {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "TLS needs the `tls` or `tls-aws-lc-rs` feature of ratewall-redis",
            )));
        }
        Ok((self.host.to_owned(), self.port)
            .into_connection_info()?
            .set_redis_settings(self.redis.clone()))
    }
}

/// The address and login of the sentinel at `url` (`redis://` or
/// `rediss://`), whether over TLS, for [`Node`].
fn sentinel_address(url: &str) -> RedisResult<(String, u16, bool, RedisConnectionInfo)> {
    let (plain, tls) = crate::url::plain(url).map_err(|why| {
        RedisError::from((ErrorKind::InvalidClientConfig, "invalid sentinel URL", why))
    })?;
    let info = plain.as_str().into_connection_info()?;
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            Ok((host.clone(), *port, tls, info.redis_settings().clone()))
        }
        _ => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "a sentinel is reached over TCP",
        ))),
    }
}

/// Generations are unique per process, so a stale one never matches.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A master connection found through sentinels; cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    master_name: String,
    sentinel_urls: Vec<String>,
    node: SentinelNodeConnectionInfo,
    /// How to log in to a master found from a `+switch-master` message.
    redis: RedisConnectionInfo,
    config: AsyncConnectionConfig,
    tls: Tls,
    /// redis-rs' sentinel client (and its cached connections) when no
    /// connection is over TLS; locked while resolving in either case.
    sentinel: tokio::sync::Mutex<Option<Sentinel>>,
    current: Mutex<Current>,
    /// The address of the current master connection, with its generation
    /// (for subscriptions of its own: refund notices).
    address: Mutex<Option<(u64, String, u16)>>,
    /// The master address last announced by `+switch-master`, tried first
    /// by the next look-up.
    announced: Mutex<Option<(String, u16)>>,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master_name", &self.inner.master_name)
            .finish_non_exhaustive()
    }
}

/// Whether `err`, met on a master connection, means the connection should be
/// dropped and the master looked up again.
pub(crate) fn needs_new_master(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Inner {
    /// Drops the master connection of `generation` (any if `None`).
    fn forget(&self, generation: Option<u64>) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_some_and(|(g, _)| generation.is_none_or(|wanted| *g == wanted))
        {
            *current = None;
            tracing::debug!(
                name = %self.master_name,
                "master connection dropped; the master will be looked up again"
            );
        }
    }

    /// Connects to `host:port` if it answers `ROLE` as a master.
    async fn connect_to_master(
        &self,
        host: String,
        port: u16,
    ) -> RedisResult<MultiplexedConnection> {
        let node = Node {
            host: &host,
            port,
            tls: self.tls.master(),
            redis: &self.redis,
        };
        let mut connection = self.tls.multiplexed(node, &self.config).await?;
        let role: Value = redis::cmd("ROLE").query_async(&mut connection).await?;
        let is_master = matches!(
            &role,
            Value::Array(items) if matches!(items.first(), Some(Value::BulkString(name)) if name.as_slice() == b"master")
        );
        if is_master {
            Ok(connection)
        } else {
            Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::ReadOnly),
                "the announced master is not a master",
            )))
        }
    }

    /// Asks each sentinel in turn for the master's address, then connects
    /// to it (checking `ROLE`): discovery over this crate's TLS. Answers
    /// the connection and the master's address.
    async fn discover(&self) -> RedisResult<(MultiplexedConnection, (String, u16))> {
        let mut last = None;
        for url in &self.sentinel_urls {
            let found = async {
                let (host, port, tls, redis) = sentinel_address(url)?;
                let node = Node {
                    host: &host,
                    port,
                    tls,
                    redis: &redis,
                };
                let mut sentinel = self.tls.multiplexed(node, &self.config).await?;
                let address: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master_name)
                    .query_async(&mut sentinel)
                    .await?;
                let (host, port) = address.ok_or_else(|| {
                    RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "the sentinel does not know this master name",
                    ))
                })?;
                let address = (host.clone(), port);
                Ok((self.connect_to_master(host, port).await?, address))
            };
            match found.await {
                Ok(connection) => return Ok(connection),
                Err(err) => last = Some(err),
            }
        }
        Err(last
            .unwrap_or_else(|| RedisError::from((ErrorKind::EmptySentinelList, "no sentinel URL"))))
    }
}

impl SentinelConnection {
    /// Prepares a connection to `master_name` as known by the sentinels at
    /// `sentinel_urls`; nothing is connected until [`Self::connection`].
    pub(crate) fn new(
        sentinel_urls: &[String],
        master_name: String,
        redis: RedisConnectionInfo,
        config: AsyncConnectionConfig,
        tls: Tls,
    ) -> RedisResult<Self> {
        let sentinel = if tls.any() {
            None
        } else {
            Some(Sentinel::build(sentinel_urls.to_vec())?)
        };
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(redis.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                master_name,
                sentinel_urls: sentinel_urls.to_vec(),
                node,
                redis,
                config,
                tls,
                sentinel: tokio::sync::Mutex::new(sentinel),
                current: Mutex::new(None),
                address: Mutex::new(None),
                announced: Mutex::new(None),
            }),
        })
    }

    /// Starts the background task that listens for `+switch-master` on the
    /// sentinels (one at a time, moving on when one fails). It ends once
    /// every clone of this connection is dropped. Needs a Tokio runtime.
    pub(crate) fn watch_switches(&self) {
        tokio::spawn(watch(Arc::downgrade(&self.inner)));
    }

    /// The master connection, looked up if there is none, with its
    /// generation (to pass to [`Self::forget`]).
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = lock(&self.inner.current).clone() {
            return Ok(current);
        }
        let mut sentinel = self.inner.sentinel.lock().await;
        // Someone else may have resolved while this call waited for the lock.
        if let Some(current) = lock(&self.inner.current).clone() {
            return Ok(current);
        }
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let announced = lock(&self.inner.announced).take();
        let from_announcement = match announced {
            Some((host, port)) => self
                .inner
                .connect_to_master(host.clone(), port)
                .await
                .ok()
                .map(|connection| (connection, (host, port))),
            None => None,
        };
        let (connection, address) = match (from_announcement, sentinel.as_mut()) {
            (Some(found), _) => found,
            (None, None) => self.inner.discover().await?,
            (None, Some(sentinel)) => {
                let client = sentinel
                    .async_master_for(&self.inner.master_name, Some(&self.inner.node))
                    .await?;
                tracing::info!(
                    master = %client.get_connection_info().addr(),
                    name = %self.inner.master_name,
                    "rate limiter connecting to the master named by the sentinels"
                );
                let address = match client.get_connection_info().addr() {
                    ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
                    other => (other.to_string(), 0),
                };
                let connection = client
                    .get_multiplexed_async_connection_with_config(&self.inner.config)
                    .await?;
                (connection, address)
            }
        };
        *lock(&self.inner.address) = Some((generation, address.0, address.1));
        *lock(&self.inner.current) = Some((generation, connection.clone()));
        Ok((generation, connection))
    }

    /// The generation of the current master connection, if there is one.
    pub(crate) fn generation(&self) -> Option<u64> {
        lock(&self.inner.current).as_ref().map(|(g, _)| *g)
    }

    /// A pub/sub connection to the current master (looked up if there is
    /// none), with the generation of the master connection it was found
    /// with: a new generation means the sentinels named another master.
    pub(crate) async fn pubsub(&self) -> RedisResult<(u64, redis::aio::PubSub)> {
        let (generation, _) = self.connection().await?;
        let address = lock(&self.inner.address)
            .clone()
            .filter(|(g, _, _)| *g == generation);
        let Some((_, host, port)) = address else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the master changed while subscribing",
            )));
        };
        let node = Node {
            host: &host,
            port,
            tls: self.inner.tls.master(),
            redis: &self.inner.redis,
        };
        Ok((generation, self.inner.tls.pubsub(node).await?))
    }

    /// Drops the master connection of `generation` (if still current), so
    /// that the next call looks the master up again.
    pub(crate) fn forget(&self, generation: u64) {
        self.inner.forget(Some(generation));
    }

    /// Sends `cmd` to the master by `deadline`: `None` when the deadline
    /// passed. Forgets the master on failures that call for it.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        deadline: Instant,
        cmd: &redis::Cmd,
    ) -> Option<RedisResult<T>> {
        let (generation, mut connection) =
            match tokio::time::timeout_at(deadline, self.connection()).await {
                Err(_elapsed) => return None,
                Ok(Err(err)) => return Some(Err(err)),
                Ok(Ok(found)) => found,
            };
        let result = tokio::time::timeout_at(deadline, cmd.query_async(&mut connection)).await;
        match &result {
            Err(_elapsed) => self.forget(generation),
            Ok(Err(err)) if needs_new_master(err) => self.forget(generation),
            Ok(_) => {}
        }
        result.ok()
    }
}

/// The master name and new master address announced by a message on
/// [`SWITCH_MASTER`] or [`PROMOTED_SLAVE`].
fn parse_switch<'p>(channel: &str, payload: &'p str) -> Option<(&'p str, String, u16)> {
    let fields: Vec<&str> = payload.split_ascii_whitespace().collect();
    match (channel, fields.as_slice()) {
        (SWITCH_MASTER, [name, _old_ip, _old_port, host, port]) => {
            Some((name, (*host).to_owned(), port.parse().ok()?))
        }
        (PROMOTED_SLAVE, ["slave", _id, host, port, "@", name, ..]) => {
            Some((name, (*host).to_owned(), port.parse().ok()?))
        }
        _ => None,
    }
}

/// The `+switch-master` listener (see [`SentinelConnection::watch_switches`]).
async fn watch(weak: Weak<Inner>) {
    let Some(urls) = weak.upgrade().map(|inner| inner.sentinel_urls.clone()) else {
        return;
    };
    let mut liveness = tokio::time::interval(WATCH_LIVENESS);
    for url in urls.iter().cycle() {
        let subscribing = async {
            let tls = weak
                .upgrade()
                .map(|inner| inner.tls.clone())
                .unwrap_or_default();
            let (host, port, is_tls, redis) = sentinel_address(url)?;
            let node = Node {
                host: &host,
                port,
                tls: is_tls,
                redis: &redis,
            };
            let mut pubsub = tls.pubsub(node).await?;
            pubsub.subscribe(&[SWITCH_MASTER, PROMOTED_SLAVE]).await?;
            Ok::<_, RedisError>(pubsub)
        };
        if let Ok(Ok(mut pubsub)) = tokio::time::timeout(WATCH_CONNECT_TIMEOUT, subscribing).await {
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    message = messages.next() => {
                        let Some(message) = message else { break };
                        let Some(inner) = weak.upgrade() else { return };
                        let payload: String = message.get_payload().unwrap_or_default();
                        if let Some((name, host, port)) =
                            parse_switch(message.get_channel_name(), &payload)
                            && name == inner.master_name
                        {
                            tracing::info!(
                                name,
                                master = %format_args!("{host}:{port}"),
                                event = message.get_channel_name(),
                                "the sentinels announced a new master"
                            );
                            *lock(&inner.announced) = Some((host, port));
                            inner.forget(None);
                        }
                    }
                    _ = liveness.tick() => {
                        if weak.strong_count() == 0 {
                            return;
                        }
                    }
                }
            }
        }
        if weak.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(WATCH_RETRY_DELAY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_switch;

    #[test]
    fn switch_and_promotion_messages_name_the_new_address() {
        let switch = "+switch-master";
        assert_eq!(
            parse_switch(switch, "mymaster 10.0.0.1 6379 10.0.0.2 6380"),
            Some(("mymaster", "10.0.0.2".to_owned(), 6380))
        );
        assert_eq!(parse_switch(switch, "mymaster 10.0.0.1 6379"), None);
        assert_eq!(
            parse_switch(switch, "mymaster 10.0.0.1 6379 10.0.0.2 x"),
            None
        );
        assert_eq!(
            parse_switch(
                "+promoted-slave",
                "slave 10.0.0.2:6380 10.0.0.2 6380 @ mymaster 10.0.0.1 6379"
            ),
            Some(("mymaster", "10.0.0.2".to_owned(), 6380))
        );
        assert_eq!(
            parse_switch("+promoted-slave", "master mymaster 10.0.0.1 6379"),
            None
        );
    }
}
