//! Refund notices: room given back in Redis by one process (a refund, a
//! settled estimate, a call cancelled by its request id, a reset, a block
//! lifted: `ratewall::Limit::with_block`) is told
//! to the other processes sharing the server, whose limiters then forget
//! the refusals they remember for the key and wake their calls waiting
//! under it (`ratewall::backend::Backend::subscribe_refunds`).
//!
//! - **Told** by the Lua code, in the call that gives the room back: one
//!   `PUBLISH` per key that got something back (a state that held units,
//!   not one already empty or expired, or a block not ended), on
//!   `<prefix>:{refunds}`, the
//!   message being the backend's origin (16 hex digits, random per
//!   [`crate::RedisBackend`]) then the key `prefix:{scope:identity}`
//!   (`tell`, `lua/prelude.lua`). No round trip of its own, in Functions
//!   and scripts alike. A refund that compensates a refused call over
//!   several hash tags of a cluster is told to no one (the refusal path
//!   would pay a notice per refusal).
//! - **Heard** on one pub/sub connection per backend and key prefix
//!   ([`Notices::subscribe`]), opened by the first limiter that asks and
//!   closed when the last one is dropped, by a task of its own: on the
//!   server (standalone), one of the cluster's seed nodes (tried in turn),
//!   or the master the sentinels name (again after a fail-over), over this
//!   crate's TLS where the URL says `rediss://`; for a backend on the
//!   application's connection, the `redis::Client`s it was given
//!   (`RedisBackendBuilder::pubsub_client`), and none without them (its
//!   refunds are told, nothing is heard). Messages that arrive
//!   together are delivered together, each key once
//!   ([`Notices::deliver`]): a flood of refunds on one key costs the
//!   listening process one parse per notice and one deny-cache and one
//!   waiting-call lookup per key per batch. A backend with one listening
//!   limiter skips its own notices (that limiter forgot and woke already).
//! - **Lost** when the subscription drops (a restart, a network cut, a
//!   fail-over, a subscriber too slow for the server's output buffer
//!   limit): logged (WARN once, then DEBUG while it fails), the
//!   `ratewall_refund_notices_subscribed` gauge at 0, and subscribed again
//!   every half second. Meanwhile a limiter sees other processes' refunds
//!   within its deny cache's maximum hold, as without notices. A
//!   connection that stops answering is found by a `PING` every five
//!   seconds.
//!
//! **Classic pub/sub on a Redis Cluster, not sharded.** A cluster carries
//! a `PUBLISH` to every node over its bus, so one subscription on any node
//! hears every key's notices. Sharded pub/sub (`SPUBLISH`, Redis >= 7)
//! keeps a message on its slot's shard, but its channel must sit in the
//! key's slot: to hear every key, each process would subscribe to one
//! channel per slot (16384, over one connection per master, resubscribed
//! through slot migrations, held in every master's memory). Measured
//! (Redis 7.0, 3 masters on one 2-core machine, a Lua call that writes a
//! key, then publishes a 40-byte message; `redis-benchmark`, `INFO
//! commandstats` and `INFO cpu`): the call takes 2.3 us without a notice,
//! 4.2 us with `PUBLISH` (and each other node spends 2.9 us per notice on
//! the bus message, with no subscriber anywhere), 2.75 us with `SPUBLISH`
//! (3.9 us delivering to 4 subscribers). A standalone server: 2.3 us, 3.3
//! us with `PUBLISH`. So on a cluster each notice costs about 2 us on its
//! master and 3 us on every other node: negligible at a few thousand
//! refunds a second on a handful of nodes, growing with the node count,
//! where the one connection and one subscription per process it buys
//! stop paying for it ([`crate::RedisBackendBuilder::refund_notices`]
//! turns notices off; sharded channels are the way to go past that).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use ratewall::backend::RefundNotices;
use redis::aio::PubSub;
use redis::{Msg, RedisResult};

#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// The channel of key prefix `prefix`'s notices: `<prefix>:{refunds}` (as
/// `tell` in `lua/prelude.lua` names it).
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:{{refunds}}")
}

/// The length of an origin (hex digits).
const ORIGIN_LEN: usize = 16;

/// The pause before subscribing again after a failure or a loss.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// How often the listener checks that a limiter still listens.
const LIVENESS: Duration = Duration::from_secs(1);

/// A `PING` on the subscription every this many liveness ticks.
const PING_EVERY: u32 = 5;

/// Notices delivered together at most (those already received when the
/// first of them is).
const BATCH: usize = 256;

/// Where the subscription connects.
pub(crate) enum Source {
    /// Servers reached by redis-rs' own clients, tried in turn: the
    /// server, a cluster's seed nodes (plain TCP or a Unix socket), or
    /// the clients given for a backend on the application's connection
    /// (none: notices are not heard).
    Plain(Vec<redis::Client>),
    /// Servers reached over this crate's TLS, tried in turn.
    #[cfg(feature = "__tls")]
    Tls {
        connector: crate::tls::Connector,
        nodes: Vec<(String, u16, redis::RedisConnectionInfo)>,
    },
    /// The master the sentinels name.
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
}

impl Source {
    /// A pub/sub connection, to the node `attempt` picks among several;
    /// for a sentinel master, with the generation of the master
    /// connection it was found with.
    async fn pubsub(&self, attempt: usize) -> RedisResult<(PubSub, Option<u64>)> {
        match self {
            Source::Plain(nodes) => {
                let pubsub = pick(nodes, attempt)?.get_async_pubsub().await?;
                Ok((pubsub, None))
            }
            #[cfg(feature = "__tls")]
            Source::Tls { connector, nodes } => {
                let (host, port, redis) = pick(nodes, attempt)?;
                let pubsub = connector.pubsub(host, *port, redis).await?;
                Ok((pubsub, None))
            }
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinel) => {
                let (generation, pubsub) = sentinel.pubsub().await?;
                Ok((pubsub, Some(generation)))
            }
        }
    }

    /// Whether there is nowhere to subscribe: a backend on the
    /// application's connection given no pub/sub client.
    fn is_nowhere(&self) -> bool {
        matches!(self, Source::Plain(nodes) if nodes.is_empty())
    }

    /// Whether a subscription made at master `generation` should move:
    /// the sentinels named another master since.
    fn moved(&self, generation: Option<u64>) -> bool {
        match self {
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinel) => {
                generation.is_some() && sentinel.generation() != generation
            }
            _ => {
                let _ = generation;
                false
            }
        }
    }
}

/// The node `attempt` picks, in turn.
fn pick<T>(nodes: &[T], attempt: usize) -> RedisResult<&T> {
    if nodes.is_empty() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "no node to subscribe on",
        )));
    }
    Ok(&nodes[attempt % nodes.len()])
}

/// One key prefix's subscription: the limiters it delivers to.
#[derive(Default)]
struct Channel {
    listeners: Mutex<Vec<RefundNotices>>,
    /// Whether the subscription is up now.
    up: AtomicBool,
}

/// A backend's refund notices: its origin, and its subscriptions.
pub(crate) struct Notices {
    origin: String,
    /// The server(s), redacted, for logs.
    target: Arc<str>,
    source: Source,
    connect_timeout: Duration,
    /// The runtime the backend was built on: the listeners run there.
    runtime: Option<tokio::runtime::Handle>,
    /// By key prefix.
    channels: Mutex<HashMap<Box<str>, Arc<Channel>>>,
}

impl fmt::Debug for Notices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notices")
            .field("origin", &self.origin)
            .field("prefixes", &lock(&self.channels).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Origins are random per backend (and never repeat in one process).
static ORIGINS: AtomicU64 = AtomicU64::new(0);

impl Notices {
    /// The notices of a backend on `target` whose subscriptions connect
    /// through `source`, each connection within `connect_timeout`, their
    /// listeners run on the current Tokio runtime.
    pub(crate) fn new(target: Arc<str>, source: Source, connect_timeout: Duration) -> Self {
        let seed = (ORIGINS.fetch_add(1, Ordering::Relaxed), std::process::id());
        Self {
            origin: format!("{:016x}", RandomState::new().hash_one(seed)),
            target,
            source,
            connect_timeout,
            runtime: tokio::runtime::Handle::try_current().ok(),
            channels: Mutex::default(),
        }
    }

    /// What this backend's calls that give room back tell as their
    /// origin.
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// Delivers the notices of key prefix `prefix` to `listener` from now
    /// on; starts the subscription of the prefix if none runs. `false`
    /// when it cannot (no Tokio runtime was running when the backend was
    /// built, or no server to subscribe on).
    pub(crate) fn subscribe(self: &Arc<Self>, prefix: &str, listener: RefundNotices) -> bool {
        if self.source.is_nowhere() {
            tracing::info!(
                target_server = %self.target,
                "rate limiter: refund notices are told but not heard (a backend on the application's connection without RedisBackendBuilder::pubsub_client); other instances' refunds are seen within the deny cache's maximum hold"
            );
            return false;
        }
        let Some(runtime) = &self.runtime else {
            tracing::warn!(
                target_server = %self.target,
                "rate limiter: no Tokio runtime to hear refund notices on; other instances' refunds are seen within the deny cache's maximum hold"
            );
            return false;
        };
        let mut channels = lock(&self.channels);
        if let Some(channel) = channels.get(prefix) {
            listener.subscribed(channel.up.load(Ordering::Acquire));
            lock(&channel.listeners).push(listener);
            return true;
        }
        let channel = Arc::new(Channel::default());
        listener.subscribed(false);
        lock(&channel.listeners).push(listener);
        channels.insert(prefix.into(), channel.clone());
        drop(runtime.spawn(listen(self.clone(), prefix.into(), channel)));
        true
    }

    /// Whether `channel` still has a listener; when none is left, it is
    /// forgotten (under the same lock a subscriber takes, so none joins a
    /// listener that ends).
    fn still_heard(&self, prefix: &str, channel: &Arc<Channel>) -> bool {
        let mut channels = lock(&self.channels);
        let mut listeners = lock(&channel.listeners);
        listeners.retain(|l| !l.is_closed());
        if !listeners.is_empty() {
            return true;
        }
        if channels
            .get(prefix)
            .is_some_and(|held| Arc::ptr_eq(held, channel))
        {
            channels.remove(prefix);
        }
        false
    }

    /// Tells `channel`'s listeners whether the subscription is up.
    fn set_up(&self, channel: &Channel, up: bool) {
        channel.up.store(up, Ordering::Release);
        lock(&channel.listeners).retain(|l| l.subscribed(up));
    }

    /// Delivers `batch` (messages received together) to `channel`'s
    /// listeners: each key once; this backend's own notices left out when
    /// one limiter listens. Malformed messages are ignored.
    fn deliver(&self, channel: &Channel, batch: &[Msg]) {
        let mut listeners = lock(&channel.listeners);
        let skip_own = listeners.len() == 1;
        let mut seen: HashSet<&str> = HashSet::new();
        for message in batch {
            let payload = message.get_payload_bytes();
            if payload.len() <= ORIGIN_LEN {
                continue;
            }
            let (origin, key) = payload.split_at(ORIGIN_LEN);
            if skip_own && origin == self.origin.as_bytes() {
                continue;
            }
            let Ok(key) = std::str::from_utf8(key) else {
                continue;
            };
            if batch.len() > 1 && !seen.insert(key) {
                continue;
            }
            listeners.retain(|l| l.given_back(key));
        }
    }
}

/// The subscription of key prefix `prefix`, for as long as a limiter
/// listens: subscribes, delivers, and subscribes again after a loss.
async fn listen(notices: Arc<Notices>, prefix: Box<str>, channel: Arc<Channel>) {
    let name = self::channel(&prefix);
    let mut attempt = 0usize;
    // Whether the subscription failed since it was last up (logged once).
    let mut failing = false;
    let mut lost_once = false;
    while notices.still_heard(&prefix, &channel) {
        let subscribing = async {
            let (mut pubsub, generation) = notices.source.pubsub(attempt).await?;
            pubsub.subscribe(&name).await?;
            Ok::<_, redis::RedisError>((pubsub, generation))
        };
        match tokio::time::timeout(notices.connect_timeout, subscribing).await {
            Ok(Ok((pubsub, generation))) => {
                failing = false;
                notices.set_up(&channel, true);
                if lost_once {
                    tracing::info!(
                        channel = %name,
                        target_server = %notices.target,
                        "rate limiter subscribed to refund notices again"
                    );
                } else {
                    tracing::debug!(channel = %name, target_server = %notices.target, "rate limiter subscribed to refund notices");
                }
                let ended = hear(&notices, &prefix, &channel, pubsub, generation).await;
                notices.set_up(&channel, false);
                if !ended {
                    break;
                }
                lost_once = true;
                tracing::warn!(
                    channel = %name,
                    target_server = %notices.target,
                    "rate limiter lost its refund notices subscription; subscribing again (meanwhile other instances' refunds are seen within the deny cache's maximum hold)"
                );
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("no subscription within {:?}", notices.connect_timeout),
                };
                if failing {
                    tracing::debug!(channel = %name, target_server = %notices.target, %error, "rate limiter could not subscribe to refund notices");
                } else {
                    failing = true;
                    tracing::warn!(
                        channel = %name,
                        target_server = %notices.target,
                        %error,
                        "rate limiter could not subscribe to refund notices; trying again (meanwhile other instances' refunds are seen within the deny cache's maximum hold)"
                    );
                }
            }
        }
        attempt = attempt.wrapping_add(1);
        tokio::time::sleep(RETRY_DELAY).await;
    }
}

/// Delivers the notices `pubsub` receives until it is lost (`true`), or
/// until no limiter listens any more (`false`).
async fn hear(
    notices: &Notices,
    prefix: &str,
    channel: &Arc<Channel>,
    pubsub: PubSub,
    generation: Option<u64>,
) -> bool {
    let (mut sink, mut stream) = pubsub.split();
    let mut liveness = tokio::time::interval(LIVENESS);
    liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = 0u32;
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else { return true };
                batch.push(message);
                while batch.len() < BATCH {
                    match stream.next().now_or_never() {
                        Some(Some(message)) => batch.push(message),
                        Some(None) => {
                            notices.deliver(channel, &batch);
                            return true;
                        }
                        None => break,
                    }
                }
                notices.deliver(channel, &batch);
                batch.clear();
            }
            _ = liveness.tick() => {
                if !notices.still_heard(prefix, channel) {
                    return false;
                }
                if notices.source.moved(generation) {
                    return true;
                }
                ticks += 1;
                if ticks.is_multiple_of(PING_EVERY) {
                    let ping = sink.ping::<redis::Value>();
                    if !matches!(tokio::time::timeout(notices.connect_timeout, ping).await, Ok(Ok(_))) {
                        return true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_named_by_the_prefix_as_the_lua_code_names_it() {
        assert_eq!(channel("ratewall"), "ratewall:{refunds}");
        assert!(
            crate::script::library_source().contains("prefix .. ':{refunds}'"),
            "lua/prelude.lua publishes on another channel"
        );
    }

    #[test]
    fn origins_are_sixteen_hex_digits_and_differ_between_backends() {
        let source = || Source::Plain(Vec::new());
        let a = Notices::new("a".into(), source(), Duration::from_secs(1));
        let b = Notices::new("b".into(), source(), Duration::from_secs(1));
        assert_eq!(a.origin().len(), ORIGIN_LEN);
        assert!(a.origin().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a.origin(), b.origin());
    }
}
