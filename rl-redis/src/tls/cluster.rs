//! Redis Cluster over this crate's TLS: [`TlsNode`], the node connection
//! type of a `ClusterConnection<TlsNode>`.
//!
//! redis-rs opens a cluster's node connections itself (as the topology
//! says, at any time), through the `Connect` trait of the node connection
//! type: an associated function, given a node's address and no state of
//! the backend that built the cluster connection. The TLS configuration a
//! [`TlsNode`] connects with is therefore the process' cluster TLS
//! configuration, [`register`]ed by each cluster backend connecting over
//! TLS. Backends with the same certificates share it; a cluster backend
//! over TLS with other certificates than a live one is refused when it
//! connects, with an error saying why.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::Connect;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, Value,
};

use super::{Certificates, Connector};

/// The TLS configuration of the process' cluster backends over TLS.
pub(crate) struct ClusterTls {
    certificates: Certificates,
    connector: Connector,
}

impl fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterTls")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

/// The live cluster TLS configuration, held by the backends that use it.
static CLUSTER_TLS: Mutex<Weak<ClusterTls>> = Mutex::new(Weak::new());

fn lock() -> MutexGuard<'static, Weak<ClusterTls>> {
    CLUSTER_TLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The cluster TLS configuration for `certificates`: the live one if it has
/// the same certificates, else a new one (connections taking at most
/// `connect_timeout`) when none is live. The backend keeps the `Arc` for as
/// long as its cluster connection lives.
pub(crate) fn register(
    certificates: &Certificates,
    connect_timeout: Duration,
) -> Result<Arc<ClusterTls>, String> {
    let mut live = lock();
    if let Some(current) = live.upgrade() {
        if current.certificates == *certificates {
            return Ok(current);
        }
        return Err(
            "another Redis Cluster backend of this process is connected over TLS with \
                    other certificates, and the cluster backends of one process share one TLS \
                    configuration (redis-rs opens cluster node connections with no way to tell \
                    backends apart): give both the same certificates, or drop the other backend \
                    first"
                .to_owned(),
        );
    }
    let current = Arc::new(ClusterTls {
        certificates: certificates.clone(),
        connector: Connector::new(certificates, connect_timeout)?,
    });
    *live = Arc::downgrade(&current);
    Ok(current)
}

/// A connection to one cluster node over this crate's TLS.
#[derive(Clone)]
pub(crate) struct TlsNode(MultiplexedConnection);

impl ConnectionLike for TlsNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl Connect for TlsNode {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let info = info.into_connection_info()?;
            // The seeds are given to redis-rs as plain URLs: every node is
            // a TCP address, reached here over TLS.
            let ConnectionAddr::Tcp(host, port) = info.addr() else {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "a Redis Cluster node over TLS must be a TCP address",
                )));
            };
            let Some(tls) = lock().upgrade() else {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "the cluster backend over TLS is gone",
                )));
            };
            tls.connector
                .multiplexed(host, *port, info.redis_settings(), config)
                .await
                .map(TlsNode)
        })
    }
}
