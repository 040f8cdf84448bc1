//! [`TlsStandalone`]: a reconnecting connection to one server over this
//! crate's TLS (redis-rs' `ConnectionManager` connects with redis-rs' own
//! TLS only).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisConnectionInfo, RedisResult};
use tokio::time::Instant;

use super::Connector;

/// The connection and its generation.
type Current = Option<(u64, MultiplexedConnection)>;

/// Generations are unique per process, so a stale one never matches.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// One multiplexed connection to a server over TLS, opened again by the
/// first call after it broke (a call that finds the server refusing fails
/// at once; the next one tries again), like redis-rs' `ConnectionManager`
/// with no retries. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct TlsStandalone {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    host: String,
    port: u16,
    redis: RedisConnectionInfo,
    config: AsyncConnectionConfig,
    current: Mutex<Current>,
    /// Held while connecting: concurrent calls wait for one connection.
    connecting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for TlsStandalone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStandalone")
            .field("host", &self.inner.host)
            .field("port", &self.inner.port)
            .finish_non_exhaustive()
    }
}

fn lock(current: &Mutex<Current>) -> MutexGuard<'_, Current> {
    current
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether `err`, met on a connection, means it is gone (redis-rs'
/// `ConnectionManager` reconnects on the same errors).
fn broken(err: &redis::RedisError) -> bool {
    err.is_unrecoverable_error() || err.is_connection_dropped()
}

impl TlsStandalone {
    /// A connection to `host:port` logged in with `redis`; nothing is
    /// connected until [`Self::connection`].
    pub(crate) fn new(
        connector: Connector,
        host: String,
        port: u16,
        redis: RedisConnectionInfo,
        config: AsyncConnectionConfig,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                connector,
                host,
                port,
                redis,
                config,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The connection, opened if there is none, with its generation.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = lock(&self.inner.current).clone() {
            return Ok(current);
        }
        let _connecting = self.inner.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(current) = lock(&self.inner.current).clone() {
            return Ok(current);
        }
        let connection = self
            .inner
            .connector
            .multiplexed(
                &self.inner.host,
                self.inner.port,
                &self.inner.redis,
                self.inner.config.clone(),
            )
            .await?;
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.current) = Some((generation, connection.clone()));
        Ok((generation, connection))
    }

    /// Drops the connection of `generation` (if still current).
    fn forget(&self, generation: u64) {
        let mut current = lock(&self.inner.current);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Sends `cmd` by `deadline`: `None` when the deadline passed. A call
    /// that finds the connection broken drops it, for the next call to
    /// open another.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        deadline: Instant,
        cmd: &Cmd,
    ) -> Option<RedisResult<T>> {
        let (generation, mut connection) =
            match tokio::time::timeout_at(deadline, self.connection()).await {
                Err(_elapsed) => return None,
                Ok(Err(err)) => return Some(Err(err)),
                Ok(Ok(found)) => found,
            };
        let result = tokio::time::timeout_at(deadline, cmd.query_async(&mut connection))
            .await
            .ok();
        if let Some(Err(err)) = &result
            && broken(err)
        {
            self.forget(generation);
        }
        result
    }
}
