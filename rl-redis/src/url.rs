//! [`RedisUrl`]: one string naming a deployment (a server, a Redis Cluster
//! or the master of a Sentinel deployment), the grammar every tool of this
//! workspace reads (`REDIS_URL` of the services, `--redis` of the `ratewall` CLI).

use std::fmt;
use std::str::FromStr;

use ratewall::error::BackendError;
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::backend::RedisBackend;
use crate::builder::RedisBackendBuilder;
use crate::redact::redact_url;

/// Schemes of one server over TCP without TLS.
const PLAIN_SCHEMES: [&str; 2] = ["redis", "valkey"];
/// Schemes of one server over TCP with TLS.
const TLS_SCHEMES: [&str; 2] = ["rediss", "valkeys"];
/// Schemes of one server over a Unix socket.
const UNIX_SCHEMES: [&str; 3] = ["redis+unix", "valkey+unix", "unix"];
/// Schemes of a Sentinel deployment, and whether they mean TLS.
const SENTINEL_SCHEMES: [(&str, bool); 4] = [
    ("redis+sentinel", false),
    ("rediss+sentinel", true),
    ("valkey+sentinel", false),
    ("valkeys+sentinel", true),
];

/// The port of a sentinel written without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// What every parse error ends with.
const EXPECTED: &str = "expected one server (redis://host:6379/, rediss:// for TLS, \
    valkey://, valkeys://, or redis+unix:///path/to.sock), several node URLs separated by \
    commas (Redis Cluster), or redis+sentinel://host:26379,host:26379/master-name (Sentinel)";

/// Where a backend connects, written as one string: the grammar every
/// service of this workspace reads from `REDIS_URL` and the `ratewall` CLI from
/// `--redis`.
///
/// | written as | deployment |
/// |---|---|
/// | `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS), `valkey://...`, `valkeys://...` (TLS) | one server |
/// | `redis+unix:///path/redis.sock[?db=N&user=U&pass=P]`, `valkey+unix://...`, `unix://...` | one server on a Unix socket |
/// | two or more of the TCP URLs above, separated by commas, all with or all without TLS, database 0 | Redis Cluster, seeded with those nodes (feature `cluster`) |
/// | `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name[/db]` | the master that Redis Sentinels monitor under `master-name` (feature `sentinel`) |
/// | `rediss+sentinel://...` | the same over TLS, to the sentinels and to the master (features `sentinel` and `tls`) |
/// | `valkey+sentinel://...`, `valkeys+sentinel://...` | the same as `redis+sentinel://`, `rediss+sentinel://` |
///
/// In a sentinel URL the user name, password and database are the
/// master's; the sentinels are reached without credentials (for sentinels
/// that require them, use [`RedisBackend::sentinel_builder`] with their
/// URLs), on port 26379 unless a port is given. A URL with TLS needs the
/// `tls` feature. Anything else is refused with a [`RedisUrlError`] that
/// says what is wrong; its text, and this type's `Display` and `Debug`,
/// never show a password (see [`redact_url`]).
///
/// ```
/// use ratewall_redis::RedisUrl;
///
/// let one: RedisUrl = "redis://:hunter2@10.0.0.1:6379/0".parse()?;
/// assert!(!one.is_cluster() && !one.is_sentinel());
/// assert_eq!(one.to_string(), "redis://***@10.0.0.1:6379/0");
///
/// let cluster: RedisUrl = "redis://10.0.0.1:7000,redis://10.0.0.2:7000".parse()?;
/// assert!(cluster.is_cluster());
/// assert_eq!(cluster.nodes().len(), 2);
///
/// let sentinel: RedisUrl = "redis+sentinel://10.0.0.1,10.0.0.2:26380/mymaster".parse()?;
/// assert_eq!(sentinel.master_name(), Some("mymaster"));
/// assert_eq!(sentinel.nodes(), ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26380/"]);
///
/// let wrong = "http://10.0.0.1:6379/".parse::<RedisUrl>().unwrap_err();
/// assert!(wrong.to_string().contains("unknown scheme `http://`"), "{wrong}");
/// # Ok::<(), ratewall_redis::RedisUrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    target: Target,
    /// The URL as written, passwords masked.
    shown: String,
}

#[derive(Clone, PartialEq, Eq)]
enum Target {
    Standalone(String),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel(Box<Sentinel>),
}

/// A Sentinel deployment: the sentinels' URLs and how to use the master.
#[cfg(feature = "sentinel")]
#[derive(Clone, PartialEq, Eq)]
struct Sentinel {
    sentinels: Vec<String>,
    master_name: String,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    tls: bool,
}

/// Why a string is not a [`RedisUrl`]: shows the string (passwords masked)
/// and what is wrong with it.
///
/// ```
/// use ratewall_redis::RedisUrl;
///
/// let error = "redis://:hunter2@host:6379/x".parse::<RedisUrl>().unwrap_err();
/// assert_eq!(error.url(), "redis://***@host:6379/x");
/// assert!(error.reason().contains("database"), "{error}");
/// assert!(!error.to_string().contains("hunter2"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Redis URL `{url}`: {reason}")]
pub struct RedisUrlError {
    url: String,
    reason: String,
}

impl RedisUrlError {
    fn new(input: &str, reason: impl Into<String>) -> Self {
        Self {
            url: shown(input),
            reason: reason.into(),
        }
    }

    /// The string that was refused, passwords masked.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What is wrong with it, and what is expected instead.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl RedisUrl {
    /// A builder connecting to this deployment (with the master's
    /// credentials, database and TLS of a sentinel URL already set), for
    /// settings beyond the defaults.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ratewall_redis::RedisUrl;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let url: RedisUrl = std::env::var("REDIS_URL")?.parse()?;
    /// let backend = url.builder().timeout(Duration::from_millis(200)).connect().await?;
    /// assert_eq!(backend.timeout(), Duration::from_millis(200));
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(&self) -> RedisBackendBuilder {
        match &self.target {
            Target::Standalone(url) => RedisBackend::builder(url.clone()),
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => RedisBackend::cluster_builder(urls.clone()),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinel) => {
                let mut builder = RedisBackend::sentinel_builder(
                    sentinel.sentinels.clone(),
                    sentinel.master_name.clone(),
                )
                .master_db(sentinel.db);
                if let Some(password) = &sentinel.password {
                    builder = builder.master_credentials(sentinel.username.as_deref(), password);
                }
                #[cfg(feature = "__tls")]
                {
                    builder = builder.master_tls(sentinel.tls);
                }
                builder
            }
        }
    }

    /// Connects with the default settings ([`RedisUrl::builder`], then
    /// [`RedisBackendBuilder::connect`]).
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    pub async fn connect(&self) -> Result<RedisBackend, BackendError> {
        self.builder().connect().await
    }

    /// Whether this names a Redis Cluster (a comma-separated list).
    pub fn is_cluster(&self) -> bool {
        match &self.target {
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => true,
            _ => false,
        }
    }

    /// Whether this names the master of a Sentinel deployment.
    pub fn is_sentinel(&self) -> bool {
        self.master_name().is_some()
    }

    /// The name the sentinels monitor the master under, for a sentinel URL.
    pub fn master_name(&self) -> Option<&str> {
        match &self.target {
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinel) => Some(&sentinel.master_name),
            _ => None,
        }
    }

    /// The URLs of the servers this names: the server, the cluster's seed
    /// nodes, or the sentinels (as `redis://host:port/`, or `rediss://`).
    /// They may hold passwords: print them through [`redact_url`].
    pub fn nodes(&self) -> Vec<&str> {
        match &self.target {
            Target::Standalone(url) => vec![url.as_str()],
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => urls.iter().map(String::as_str).collect(),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinel) => sentinel.sentinels.iter().map(String::as_str).collect(),
        }
    }
}

impl FromStr for RedisUrl {
    type Err = RedisUrlError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        let fail = |reason: String| RedisUrlError::new(text, reason);
        if text.is_empty() {
            return Err(fail(format!("it is empty; {EXPECTED}")));
        }
        let target = if let Some(tls) = scheme(text).and_then(sentinel_scheme) {
            sentinel(text, tls).map_err(fail)?
        } else if text.contains(',') {
            cluster(text).map_err(fail)?
        } else {
            node(text).map_err(fail)?;
            Target::Standalone(text.to_owned())
        };
        Ok(Self {
            target,
            shown: shown(text),
        })
    }
}

impl fmt::Display for RedisUrl {
    /// The URL as written, passwords masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl").field(&self.shown).finish()
    }
}

/// `text` with every password masked: each node of a list on its own.
fn shown(text: &str) -> String {
    if scheme(text).and_then(sentinel_scheme).is_some() {
        return redact_url(text);
    }
    text.split(',')
        .map(|part| redact_url(part.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The scheme of `text` (what comes before `://`), if it has one.
fn scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let valid = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

/// Whether `scheme` names a Sentinel deployment, and with TLS.
fn sentinel_scheme(scheme: &str) -> Option<bool> {
    SENTINEL_SCHEMES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(scheme))
        .map(|&(_, tls)| tls)
}

/// One server's URL, checked.
struct Node {
    tls: bool,
    unix: bool,
    db: i64,
}

/// Checks one server's URL the way the connection will read it.
fn node(text: &str) -> Result<Node, String> {
    let Some(scheme) = scheme(text) else {
        return Err(format!("no scheme; {EXPECTED}"));
    };
    let lower = scheme.to_ascii_lowercase();
    let tls = TLS_SCHEMES.contains(&lower.as_str());
    let unix = UNIX_SCHEMES.contains(&lower.as_str());
    if !tls && !unix && !PLAIN_SCHEMES.contains(&lower.as_str()) {
        if sentinel_scheme(&lower).is_some() {
            return Err(format!(
                "`{scheme}://` names sentinels and a master, so it cannot be one node of a \
                 list; write the sentinels inside it: {scheme}://host:26379,host:26379/master-name"
            ));
        }
        return Err(format!("unknown scheme `{scheme}://`; {EXPECTED}"));
    }
    if tls && !cfg!(feature = "__tls") {
        return Err(needs_tls(scheme));
    }
    let (text, _) = plain(text)?;
    let parsed = ::url::Url::parse(&text).map_err(|error| format!("{error}; {EXPECTED}"))?;
    let info = parsed
        .into_connection_info()
        .map_err(|error| config_error(&error))?;
    let unix = unix || matches!(info.addr(), ConnectionAddr::Unix(_));
    Ok(Node {
        tls,
        unix,
        db: info.redis_settings().db(),
    })
}

/// Why a TLS URL cannot be used in a build without TLS.
fn needs_tls(scheme: &str) -> String {
    format!("`{scheme}://` (TLS) needs the `tls` or `tls-aws-lc-rs` feature of ratewall-redis")
}

/// `url` with its TLS scheme (`rediss://`, `valkeys://`) made plain, and
/// whether it had one; other URLs as they are. redis-rs reads the result:
/// this crate does TLS itself (`crate::tls`) and turns on no TLS of
/// redis-rs, which would refuse `rediss://`. A TLS URL takes no fragment
/// (redis-rs reads `#insecure` as "check no certificate", which this crate
/// never does).
pub(crate) fn plain(url: &str) -> Result<(String, bool), String> {
    let Some(scheme) = scheme(url) else {
        return Ok((url.to_owned(), false));
    };
    let plain = match scheme.to_ascii_lowercase().as_str() {
        "rediss" => "redis",
        "valkeys" => "valkey",
        _ => return Ok((url.to_owned(), false)),
    };
    if url.contains('#') {
        return Err(format!(
            "a `{scheme}://` URL takes no fragment (`#insecure`, which would check no \
             certificate, is not supported: trust a private CA with \
             RedisBackendBuilder::tls_root_certificates)"
        ));
    }
    Ok((format!("{plain}{}", &url[scheme.len()..]), true))
}

/// redis-rs' reason for refusing a URL, without its error kind.
fn config_error(error: &redis::RedisError) -> String {
    let text = error.to_string().replace(" - InvalidClientConfig", "");
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// A comma-separated list of node URLs: a cluster.
fn cluster(text: &str) -> Result<Target, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let mut tls = None;
    for (index, part) in parts.iter().enumerate() {
        let position = index + 1;
        if part.is_empty() {
            return Err(format!(
                "node {position} of the list is empty (a comma-separated list names the nodes of a Redis Cluster)"
            ));
        }
        let node = node(part)
            .map_err(|reason| format!("node {position} (`{}`): {reason}", redact_url(part)))?;
        if node.unix {
            return Err(format!(
                "node {position} (`{}`) is a Unix socket; Redis Cluster nodes are reached over TCP",
                redact_url(part)
            ));
        }
        if node.db != 0 {
            return Err(format!(
                "node {position} (`{}`) names database {}; Redis Cluster has only database 0",
                redact_url(part),
                node.db
            ));
        }
        if *tls.get_or_insert(node.tls) != node.tls {
            return Err(
                "some nodes use TLS and others do not; every node of a Redis Cluster is reached the same way"
                    .to_owned(),
            );
        }
    }
    #[cfg(feature = "cluster")]
    {
        Ok(Target::Cluster(
            parts.into_iter().map(str::to_owned).collect(),
        ))
    }
    #[cfg(not(feature = "cluster"))]
    {
        Err("a comma-separated list names a Redis Cluster, which needs the `cluster` feature of ratewall-redis".to_owned())
    }
}

/// `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name[/db]`.
fn sentinel(text: &str, tls: bool) -> Result<Target, String> {
    let form =
        "expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name[/db]";
    let (scheme, rest) = text.split_once("://").unwrap_or(("", text));
    if tls && !cfg!(feature = "__tls") {
        return Err(needs_tls(scheme));
    }
    if rest.contains(['?', '#']) {
        return Err(format!("a sentinel URL takes no query or fragment; {form}"));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let mut path = path.trim_end_matches('/').split('/');
    let master_name = path.next().unwrap_or_default();
    if master_name.is_empty() {
        return Err(format!("no master name after the sentinels; {form}"));
    }
    let db: &str = path.next().unwrap_or_default();
    if path.next().is_some() {
        return Err(format!("too many path segments; {form}"));
    }
    let node_scheme = if tls { "rediss" } else { "redis" };
    let mut sentinels = Vec::new();
    for (index, host) in hosts.split(',').map(str::trim).enumerate() {
        let position = index + 1;
        if host.is_empty() {
            return Err(format!("sentinel {position} is empty; {form}"));
        }
        let has_port = host.rsplit_once(':').is_some_and(|(before, port)| {
            !port.is_empty()
                && port.chars().all(|c| c.is_ascii_digit())
                && (!before.contains(':') || before.ends_with(']'))
        });
        let address = if has_port {
            host.to_owned()
        } else {
            format!("{host}:{DEFAULT_SENTINEL_PORT}")
        };
        let url = format!("{node_scheme}://{address}/");
        node(&url).map_err(|reason| format!("sentinel {position} (`{host}`): {reason}"))?;
        sentinels.push(url);
    }
    // The master's credentials and database, read like a server URL's
    // (without TLS: only they are read).
    let master = format!(
        "redis://{}{}/{db}",
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        sentinels[0]
            .trim_start_matches(&format!("{node_scheme}://"))
            .trim_end_matches('/')
    );
    let info = ::url::Url::parse(&master)
        .map_err(|error| format!("{error}; {form}"))?
        .into_connection_info()
        .map_err(|error| config_error(&error))?;
    let redis = info.redis_settings();
    #[cfg(feature = "sentinel")]
    {
        Ok(Target::Sentinel(Box::new(Sentinel {
            sentinels,
            master_name: master_name.to_owned(),
            username: redis.username().map(str::to_owned),
            password: redis.password().map(str::to_owned),
            db: redis.db(),
            tls,
        })))
    }
    #[cfg(not(feature = "sentinel"))]
    {
        let _ = (redis, sentinels);
        Err(format!(
            "`{scheme}://` names a Sentinel deployment, which needs the `sentinel` feature of ratewall-redis"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> String {
        text.parse::<RedisUrl>().unwrap_err().reason().to_owned()
    }

    #[test]
    fn one_url_names_one_server_over_tcp_or_a_unix_socket() {
        for text in [
            "redis://127.0.0.1:6379/",
            " redis://127.0.0.1 ",
            "redis://:pw@host:6379/3",
            "redis://user:pw@[::1]:6379/0?protocol=resp3",
            "valkey://host/",
            "redis+unix:///run/redis.sock?db=1&pass=x",
            "valkey+unix:///run/valkey.sock",
            "unix:///run/redis.sock",
        ] {
            let url: RedisUrl = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(!url.is_cluster() && !url.is_sentinel(), "{text}");
            assert_eq!(url.nodes(), [text.trim()]);
        }
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_comma_separated_list_names_a_cluster() {
        let url: RedisUrl = "redis://a:7000, redis://:pw@b:7001/ ,valkey://c:7002"
            .parse()
            .unwrap();
        assert!(url.is_cluster());
        assert_eq!(
            url.nodes(),
            ["redis://a:7000", "redis://:pw@b:7001/", "valkey://c:7002"]
        );
        assert_eq!(
            url.to_string(),
            "redis://a:7000,redis://***@b:7001/,valkey://c:7002"
        );
    }

    #[cfg(feature = "sentinel")]
    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_its_credentials() {
        let url: RedisUrl = "redis+sentinel://app:s3cret@10.0.0.1:26380,[::1],h3/mymaster/2"
            .parse()
            .unwrap();
        assert_eq!(url.master_name(), Some("mymaster"));
        assert_eq!(
            url.nodes(),
            [
                "redis://10.0.0.1:26380/",
                "redis://[::1]:26379/",
                "redis://h3:26379/"
            ]
        );
        let Target::Sentinel(sentinel) = &url.target else {
            panic!("not a sentinel target");
        };
        assert_eq!(sentinel.username.as_deref(), Some("app"));
        assert_eq!(sentinel.password.as_deref(), Some("s3cret"));
        assert_eq!(sentinel.db, 2);
        assert!(!sentinel.tls);
        assert_eq!(
            url.to_string(),
            "redis+sentinel://***@10.0.0.1:26380,[::1],h3/mymaster/2"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        let valkey: RedisUrl = "valkey+sentinel://h/m/".parse().unwrap();
        assert_eq!(valkey.master_name(), Some("m"));
    }

    #[test]
    fn every_refusal_says_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("not a url", "no scheme"),
            ("127.0.0.1:6379", "no scheme"),
            ("http://host/", "unknown scheme `http://`"),
            ("redis://host:99999/", "invalid port"),
            ("redis://host/x", "database"),
            ("redis://0.0.0.0:6379/", "wildcard"),
            ("redis:///nohost", "hostname"),
            ("redis://a:1,,redis://b:2", "node 2 of the list is empty"),
            ("redis://a:1,", "node 2 of the list is empty"),
            (
                "redis://a:1,http://b:2",
                "node 2 (`http://b:2`): unknown scheme",
            ),
            ("redis://a:1,redis+unix:///s", "Unix socket"),
            ("redis://a:1/1,redis://b:2", "only database 0"),
            (
                "redis://a:1,redis+sentinel://b:2/m",
                "cannot be one node of a list",
            ),
            ("redis+sentinel://h1,h2", "no master name"),
            ("redis+sentinel://h1,h2/", "no master name"),
            ("redis+sentinel://h1,,h2/m", "sentinel 2 is empty"),
            ("redis+sentinel://h1/m/x", "database"),
            ("redis+sentinel://h1/m/0/extra", "too many path segments"),
            ("redis+sentinel://h1/m?db=1", "no query"),
            ("redis+sentinel://h1:port/m", "sentinel 1 (`h1:port`)"),
        ];
        for (text, wanted) in cases {
            let got = reason(text);
            assert!(got.contains(wanted), "{text:?}: {got}");
        }
        #[cfg(feature = "__tls")]
        {
            assert!(reason("rediss://a:1,redis://b:2").contains("some nodes use TLS"));
            assert!(reason("rediss://h:6380/#insecure").contains("takes no fragment"));
            assert!(reason("valkeys://h:6380/0#x").contains("`valkeys://` URL takes no fragment"));
        }
        #[cfg(not(feature = "__tls"))]
        assert!(reason("rediss://h:6380/").contains("`tls` or `tls-aws-lc-rs` feature"));
    }

    #[test]
    fn tls_urls_are_read_as_plain_ones_that_remember_tls() {
        assert_eq!(
            plain("rediss://:pw@h:6380/1"),
            Ok(("redis://:pw@h:6380/1".to_owned(), true))
        );
        assert_eq!(plain("VALKEYS://h"), Ok(("valkey://h".to_owned(), true)));
        assert_eq!(
            plain("redis://h/#anything"),
            Ok(("redis://h/#anything".to_owned(), false))
        );
        assert_eq!(plain("no scheme"), Ok(("no scheme".to_owned(), false)));
        #[cfg(feature = "__tls")]
        assert!("rediss://h:6380/2".parse::<RedisUrl>().is_ok());
    }

    #[cfg(not(all(feature = "cluster", feature = "sentinel")))]
    #[test]
    fn a_deployment_whose_feature_is_off_names_the_feature() {
        #[cfg(not(feature = "cluster"))]
        assert!(reason("redis://a:1,redis://b:2").contains("`cluster` feature"));
        #[cfg(not(feature = "sentinel"))]
        assert!(reason("redis+sentinel://h/m").contains("`sentinel` feature"));
    }

    #[test]
    fn refusals_never_show_a_password() {
        for text in [
            "http://:hunter2@host/",
            "redis://:hunter2@host/x",
            "redis://:hunter2@a:1,,redis://b:2",
            "redis+sentinel://:hunter2@h1,h2",
        ] {
            let error = text.parse::<RedisUrl>().unwrap_err();
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
    }
}
