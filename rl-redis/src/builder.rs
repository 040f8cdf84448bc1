//! [`RedisBackendBuilder`]: where to connect and how to decide.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, RedisConnectionInfo};
use rl_core::{BackendError, Clock};

use crate::backend::{Connection, RedisBackend, Settings};
use crate::error::from_redis;
use crate::redact::redact_url as redact;
use crate::script::SCRIPT;
use crate::sentinel::SentinelConnection;

/// Shortest and longest wait between reconnection attempts: short enough
/// that a restarted server is used again within a fraction of a second.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

/// The longest extra TTL: about 100 years, far inside what `PEXPIRE` takes.
const MAX_EXTRA_TTL_MS: u64 = 100 * 365 * 86_400 * 1_000;

enum Target {
    Standalone(String),
    Cluster(Vec<String>),
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
}

/// Configures a [`RedisBackend`]; made by [`RedisBackend::builder`],
/// [`RedisBackend::cluster_builder`] or [`RedisBackend::sentinel_builder`].
///
/// ```no_run
/// use rl_core::ManualClock;
/// use rl_redis::RedisBackend;
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), rl_core::BackendError> {
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
pub struct RedisBackendBuilder {
    target: Target,
    timeout: Duration,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    extra_ttl: Duration,
    master_auth: MasterAuth,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("target", &self.describe())
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("client_clock", &self.clock)
            .field("extra_ttl", &self.extra_ttl)
            .field("master_username", &self.master_auth.username)
            .field("master_db", &self.master_auth.db)
            .finish_non_exhaustive()
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
        }
    }

    pub(crate) fn standalone(url: String) -> Self {
        Self::new(Target::Standalone(url))
    }

    pub(crate) fn cluster(urls: Vec<String>) -> Self {
        Self::new(Target::Cluster(urls))
    }

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
    /// default. Meant for deterministic tests with a [`rl_core::ManualClock`].
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
    /// (a [`rl_core::ManualClock`] in tests), because Redis expires keys in
    /// real time.
    pub fn extra_ttl(mut self, extra: Duration) -> Self {
        self.extra_ttl = extra;
        self
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::Standalone(url) => redact(url),
            Target::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|url| redact(url)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
            Target::Sentinel {
                sentinels,
                master_name,
            } => {
                let urls: Vec<String> = sentinels.iter().map(|url| redact(url)).collect();
                format!("master `{master_name}` of sentinels [{}]", urls.join(", "))
            }
        }
    }

    /// Connects (checking the server answers and loading the script) and
    /// builds the backend. The connection reconnects by itself afterwards;
    /// with sentinels, the master is looked up through them now and again
    /// whenever it fails (so fail-overs are followed).
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let target = self.describe();
        let settings = Settings {
            target: target.clone().into(),
            timeout: self.timeout,
            clock: self.clock,
            extra_ttl_ms: u64::try_from(self.extra_ttl.as_millis())
                .unwrap_or(u64::MAX)
                .min(MAX_EXTRA_TTL_MS),
        };
        let connecting = async {
            let what = format_args!("connecting to {target}");
            match self.target {
                Target::Standalone(url) => {
                    let client = redis::Client::open(url.as_str()).map_err(|err| {
                        BackendError::unavailable(format_args!("invalid Redis URL {target}: {err}"))
                    })?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout))
                        .set_min_delay(RECONNECT_MIN_DELAY)
                        .set_max_delay(RECONNECT_MAX_DELAY);
                    let mut manager = ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    SCRIPT
                        .load_async(&mut manager)
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    Ok::<_, BackendError>(Connection::Standalone(manager))
                }
                Target::Cluster(urls) => {
                    let client = ClusterClientBuilder::new(urls)
                        .connection_timeout(self.timeout)
                        .response_timeout(self.timeout)
                        .build()
                        .map_err(|err| {
                            BackendError::unavailable(format_args!(
                                "invalid Redis Cluster URLs {target}: {err}"
                            ))
                        })?;
                    let mut connection = client
                        .get_async_connection()
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    SCRIPT
                        .load_async(&mut connection)
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    Ok(Connection::Cluster(connection))
                }
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
                    let connection =
                        SentinelConnection::new(&sentinels, master_name, redis, config).map_err(
                            |err| {
                                BackendError::unavailable(format_args!(
                                    "invalid sentinel URLs {target}: {err}"
                                ))
                            },
                        )?;
                    let (_, mut master) = connection
                        .connection()
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    SCRIPT
                        .load_async(&mut master)
                        .await
                        .map_err(|err| from_redis(&what, &err, self.connect_timeout))?;
                    connection.watch_switches();
                    Ok(Connection::Sentinel(connection))
                }
            }
        };
        let connection = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| BackendError::Timeout(self.connect_timeout))??;
        Ok(RedisBackend::from_parts(connection, settings))
    }
}
