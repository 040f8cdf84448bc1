//! A backend on the application's own Redis connection: a
//! `redis::aio::ConnectionManager`, a `MultiplexedConnection` (or any
//! `redis::aio::ConnectionLike + Clone + Send + Sync`), or a Redis
//! Cluster connection, instead of one the backend opens itself.
//!
//! **What the backend sends on it**, as the other connections' users
//! would see it: `FUNCTION LOAD REPLACE <library>` when it is built and
//! again after the library went missing (`CallMode::Functions` and
//! `CallMode::Auto`; `PING` instead in `CallMode::Scripts`), then one
//! command per call: `FCALL` / `FCALL_RO` of the library, or `EVALSHA`
//! and, after a script flush, `EVAL`. The limits registry, the shared
//! lists and the learned limits add `EVALSHA` (`EVAL`) of small scripts
//! of their own, `HGET`, `HGETALL` and (listing the registry) `SCAN`;
//! reading lease records, `ZRANGE` and an `EVAL` that reads `TIME`. Each
//! command is one
//! request answered by one reply on the multiplexed connection, never a
//! command that changes the connection itself: no `SELECT`, `AUTH`,
//! `HELLO`, `CLIENT SETNAME` / `TRACKING` / `REPLY`, `MULTI` / `WATCH`,
//! `SUBSCRIBE`, blocking command or `QUIT`. The Lua code's `PUBLISH`es
//! (refund notices) are server side. A call past its timeout is dropped
//! by the backend; redis-rs still reads its reply and throws it away, so
//! the application's next replies stay in order.
//!
//! **Never closed.** The backend holds a clone of the handle (redis-rs
//! connections are handles to one shared connection); dropping the
//! backend drops that clone only.

use ratewall::error::BackendError;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::RedisBackend;
use crate::builder::RedisBackendBuilder;

/// The clone of a handle the application gave, of whatever type.
trait Handle: ConnectionLike + Send + Sync {
    fn clone_handle(&self) -> Box<dyn Handle>;
}

impl<C> Handle for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn clone_handle(&self) -> Box<dyn Handle> {
        Box::new(self.clone())
    }
}

/// A connection the application made and keeps using (a clone of its
/// handle).
pub(crate) struct Given {
    handle: Box<dyn Handle>,
    /// Whether the handle is a Redis Cluster connection given to the
    /// standalone constructor (refused when building: the backend must
    /// know it decides on a cluster).
    pub(crate) is_cluster: bool,
}

impl Given {
    fn new<C>(connection: C) -> Self
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        #[cfg(feature = "cluster")]
        let is_cluster = std::any::TypeId::of::<C>()
            == std::any::TypeId::of::<redis::cluster_async::ClusterConnection>();
        #[cfg(not(feature = "cluster"))]
        let is_cluster = false;
        Self {
            handle: Box::new(connection),
            is_cluster,
        }
    }
}

impl Clone for Given {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone_handle(),
            is_cluster: self.is_cluster,
        }
    }
}

impl ConnectionLike for Given {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.handle.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.handle.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.handle.get_db()
    }
}

/// The ways to build a backend on the application's own connection.
///
/// One name per deployment, as for URLs ([`RedisBackend::builder`],
/// [`RedisBackend::cluster_builder`]): what the backend does differs on
/// a cluster (a call over several hash tags is split, see
/// [`RedisBackend`]), so the constructor says which it gets.
impl RedisBackend {
    /// Configures a backend on a connection the application already holds
    /// to one Redis server: a `redis::aio::ConnectionManager` (which
    /// reconnects by itself), a `redis::aio::MultiplexedConnection`, or any
    /// `redis::aio::ConnectionLike + Clone + Send + Sync`. No connection,
    /// credentials or TLS of the backend's own: the backend keeps a clone
    /// of the handle and sends its commands on it beside the
    /// application's.
    ///
    /// The builder's settings apply as for a URL: the per-call timeout
    /// (around each call; the connection's own response timeout, if
    /// shorter, fails a call first), the time allowed to build (loading
    /// the Functions library), the call mode, the client clock, the extra
    /// TTL, refund notices. The TLS and Sentinel settings do not (the
    /// connection is made).
    ///
    /// **What it sends**, and what it never changes: on Redis ≥ 7 (in
    /// [`CallMode::Auto`](crate::CallMode::Auto)) `FUNCTION LOAD REPLACE`
    /// of its library when built and after a flush removed it, falling
    /// back to `EVALSHA` scripts where `FUNCTION` is refused, exactly as
    /// on its own connection; then one `FCALL` (`EVALSHA`) per call, and
    /// for the limits registry, the shared lists, learned limits and
    /// lease records `EVALSHA` / `EVAL` of small scripts, `HGET`,
    /// `HGETALL`, `ZRANGE` and `SCAN`. Nothing that changes the
    /// connection: no `SELECT` (keys are in the connection's database),
    /// `AUTH`, `HELLO`, `CLIENT SETNAME` or `TRACKING`, `MULTI`, `WATCH`,
    /// `SUBSCRIBE`, blocking command or `QUIT`. Dropping the backend drops
    /// its clone of the handle only: the application's connection keeps
    /// working.
    ///
    /// **What needs its own connection.** Hearing refund notices takes a
    /// pub/sub subscription, which a multiplexed connection cannot carry:
    /// give a `redis::Client` for it with
    /// [`RedisBackendBuilder::pubsub_client`]. Without one, this backend
    /// still tells the others of its refunds (a `PUBLISH` inside its Lua
    /// calls) but hears none: a refusal its limiter's deny cache remembers
    /// lasts until the cache's maximum hold (1 s by default), and a waiting
    /// call wakes at its own retry. Sentinel discovery is not done (a
    /// connection is to one server; for a Sentinel deployment use
    /// [`RedisBackend::connect_sentinel`]). Error messages name "the
    /// application's Redis connection", not an address (a connection does
    /// not say where it goes).
    ///
    /// A `redis::cluster_async::ClusterConnection` goes to
    /// `RedisBackend::cluster_builder_with_connection`; given here, the
    /// build fails, saying so.
    ///
    /// ```no_run
    /// use ratewall::Limiter;
    /// use ratewall_redis::RedisBackend;
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // The application's own connection, and the client it came from.
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let mut connection = client.get_connection_manager().await?;
    ///
    /// let backend = RedisBackend::builder_with_connection(connection.clone())
    ///     .timeout(Duration::from_millis(200))
    ///     .pubsub_client(client) // hear other instances' refunds
    ///     .connect()
    ///     .await?;
    /// assert_eq!(backend.timeout(), Duration::from_millis(200));
    /// let limiter = Limiter::builder().backend(backend).prefix("app").build()?;
    ///
    /// // The application goes on using its connection.
    /// let () = redis::cmd("SET").arg("greeting").arg("hello").query_async(&mut connection).await?;
    /// # drop(limiter);
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder_with_connection<C>(connection: C) -> RedisBackendBuilder
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RedisBackendBuilder::given(Given::new(connection))
    }

    /// A backend on a connection the application already holds to one
    /// Redis server, with the default settings (server time, 1 s
    /// timeout, [`CallMode::Auto`](crate::CallMode::Auto), refund notices
    /// told but not heard). See [`RedisBackend::builder_with_connection`]
    /// for what it sends on the connection and what it leaves out.
    ///
    /// ```no_run
    /// use ratewall_redis::RedisBackend;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let connection = client.get_multiplexed_async_connection().await?;
    /// let backend = RedisBackend::with_connection(connection.clone()).await?;
    /// assert!(!backend.is_cluster());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`]: [`BackendError::Timeout`] when
    /// the server does not answer in time, [`BackendError::Unavailable`]
    /// when the connection fails or is a cluster connection,
    /// [`BackendError::Protocol`] for a reply the backend cannot use.
    pub async fn with_connection<C>(connection: C) -> Result<Self, BackendError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Self::builder_with_connection(connection).connect().await
    }

    /// Configures a backend on the application's own Redis Cluster
    /// connection. As [`RedisBackend::builder_with_connection`] (what is
    /// sent, what is never changed, the handle never closed), on a
    /// cluster: the Functions library is loaded on every master (redis-rs
    /// sends `FUNCTION LOAD` to all of them), calls are routed by their
    /// keys' hash slot, and a call over several hash tags is decided as
    /// on a cluster opened from URLs (see [`RedisBackend`]).
    ///
    /// Refund notices are heard through [`RedisBackendBuilder::pubsub_client`]:
    /// a client to any node (a cluster carries every `PUBLISH` to every
    /// node); give several, one per node, to have the others tried in
    /// turn while one is down.
    ///
    /// ```no_run
    /// use ratewall_redis::RedisBackend;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let connection = redis::cluster::ClusterClient::new(nodes)?
    ///     .get_async_connection()
    ///     .await?;
    /// let backend = RedisBackend::cluster_builder_with_connection(connection.clone())
    ///     .pubsub_client(redis::Client::open(nodes[0])?)
    ///     .pubsub_client(redis::Client::open(nodes[1])?)
    ///     .connect()
    ///     .await?;
    /// assert!(backend.is_cluster());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder_with_connection(
        connection: redis::cluster_async::ClusterConnection,
    ) -> RedisBackendBuilder {
        RedisBackendBuilder::given_cluster(connection)
    }

    /// A backend on the application's own Redis Cluster connection, with
    /// the default settings. See
    /// [`RedisBackend::cluster_builder_with_connection`].
    ///
    /// ```no_run
    /// use ratewall_redis::RedisBackend;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = redis::cluster::ClusterClient::new(["redis://10.0.0.1:7000/"])?
    ///     .get_async_connection()
    ///     .await?;
    /// let backend = RedisBackend::with_cluster_connection(connection.clone()).await?;
    /// assert!(backend.is_cluster());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`RedisBackend::with_connection`].
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn with_cluster_connection(
        connection: redis::cluster_async::ClusterConnection,
    ) -> Result<Self, BackendError> {
        Self::cluster_builder_with_connection(connection)
            .connect()
            .await
    }
}
