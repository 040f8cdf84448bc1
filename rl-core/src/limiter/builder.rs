//! Configuring a [`Limiter`]: its store, and which layers surround it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::heard::Heard;
use super::in_flight::Keeper;
use super::{GLOBAL, Limiter, NEXT_LIMITER};
use crate::layer::abandon::Abandoned;
use crate::layer::breaker::{Breaker, BreakerConfig};
use crate::layer::deny_cache::{DEFAULT_CAPACITY, DEFAULT_MAX_HOLD, DenyCache, DenyLayer};
use crate::layer::failure::Failure;
use crate::layer::lease::{DEFAULT_TTL as DEFAULT_LEASE_TTL, LeaseLayer, Leases};
use crate::layer::lists::{DenyList, ListSync};
use crate::layer::observe::Observe;
use crate::layer::publish::Publish;
use crate::layer::shadow::Shadow;
use crate::layer::validate::Validate;
use crate::layer::{Layer, Pipeline};
use crate::model::clock::{Clock, SystemClock};
use crate::model::error::Error;
use crate::model::key::valid_prefix;
use crate::model::policy::FailurePolicy;
use crate::model::settings::Registry;
use crate::store::Store;
use crate::store::backend::Backend;
use crate::store::memory::MemoryBackend;

/// Configures a [`Limiter`].
///
/// The layers around the store follow from it: every limiter observes,
/// validates, honours shadow mode and applies its failure policy; a remote
/// backend also gets a deny cache, a circuit breaker and limits
/// publishing (the deny cache can be turned on for memory, or off).
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `.build()` or `.install()`"]
pub struct LimiterBuilder {
    backend: Option<Arc<dyn Backend>>,
    prefix: Option<String>,
    policy: FailurePolicy,
    clock: Option<Arc<dyn Clock>>,
    breaker: BreakerConfig,
    deny_cache: Option<bool>,
    deny_cache_max_hold: Option<Duration>,
    lists_refresh: Option<Duration>,
    lease_ttl: Option<Duration>,
    cancel_abandoned: bool,
}

/// How often, at most, a limiter reads the lists a remote backend shares.
const DEFAULT_LISTS_REFRESH: Duration = Duration::from_secs(1);

impl LimiterBuilder {
    /// Whether the limiter remembers the backend's refusals and refuses
    /// repeats in process until their `retry_after`, at most
    /// [`LimiterBuilder::deny_cache_max_hold`] at a time, forgetting them
    /// when room is given back here or, as the backend tells, elsewhere
    /// (see
    /// [`Settings::set_deny_cache`](crate::settings::Settings::set_deny_cache)). Default: on for a remote backend, off
    /// for the in-memory one, whose decisions cost about as much as a
    /// remembered refusal and follow the limiter's [`Clock`].
    pub fn deny_cache(mut self, enabled: bool) -> Self {
        self.deny_cache = Some(enabled);
        self
    }

    /// How long a remembered refusal is trusted at most (default 1 s); a
    /// flood on a refused key reaches the backend once per this period
    /// (one caller re-checks, the others stay refused).
    ///
    /// Room another process gives back in the shared store (a refund, a
    /// settled estimate, a reset such as `ratewall reset`) is usable here
    /// within one notice delivery when the backend tells of it
    /// ([`Backend::subscribe_refunds`](crate::backend::Backend::subscribe_refunds);
    /// `ratewall_redis::RedisBackend` does, over Redis pub/sub: typically
    /// a few milliseconds, held under 100 ms by its tests): the limiter
    /// forgets its remembered refusals of that key and wakes a call
    /// waiting under it. A change no notice tells of (a backend without
    /// notices, a notice lost while the subscription was down, a state
    /// changed by hand) is seen within this bound.
    pub fn deny_cache_max_hold(mut self, max_hold: Duration) -> Self {
        self.deny_cache_max_hold = Some(max_hold);
        self
    }

    /// How often, at most, a limiter over a remote backend reads the allow
    /// and deny lists the other instances share through it (default 1 s):
    /// a change made elsewhere applies here within this period, plus the
    /// time to this limiter's next call that reaches the backend.
    pub fn lists_refresh(mut self, refresh: Duration) -> Self {
        self.lists_refresh = Some(refresh);
        self
    }

    /// How long a lease is used at most (default 1 s; at least 1 ms), for
    /// the limits that lease ([`crate::Limit::with_lease`]): unused units
    /// go back to the backend when it ends. The rest of leasing's timing
    /// follows from it: a lease is sized to last a tenth of it at the
    /// identity's rate, given back after two tenths without a call, and an
    /// identity at its limit waits at most a fortieth of it between takes.
    /// A shorter TTL strands fewer units in a dead process (a bucket's
    /// lease spans at most the TTL's worth of refill) but takes leases more
    /// often.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// The circuit breaker in front of a remote backend (default: open after
    /// 5 consecutive failures, for 2 s; [`BreakerConfig::disabled`] to turn off).
    pub fn circuit_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Use the in-memory backend (the default when no backend is given).
    pub fn memory(mut self) -> Self {
        self.backend = None;
        self
    }

    /// Use a backend such as `ratewall_redis::RedisBackend`.
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = Some(Arc::new(backend));
        self
    }

    /// Use a shared backend.
    pub fn shared_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The key prefix (default `ratewall`): no braces, no whitespace.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// What to do when the backend fails (default: [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The clock of the in-memory backend and of the local fallback
    /// (default: the system clock). Remote backends keep their own time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whether every call to a remote store carries a request id, so that
    /// a call the limiter gave up on (a timeout, a broken connection) and
    /// answered by its failure policy is taken back in the store once it
    /// answers again (see [`Limiter::pending_cancels`]). Calls that count
    /// selectively ([`Counting::Settled`](crate::call::Counting::Settled):
    /// `count = failures`, `count_if`) always do, since their refunds must
    /// not leak; with `true`, every other call does too, at the cost of one
    /// more key written per decision in the store. Default `false`: a call
    /// given up on then counts as used until its limit refills.
    pub fn cancel_abandoned(mut self, every_call: bool) -> Self {
        self.cancel_abandoned = every_call;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    /// [`Error::BadPrefix`] when the key prefix is empty or holds `{`, `}` or
    /// whitespace.
    pub fn build(self) -> Result<Limiter, Error> {
        let prefix = self.prefix.unwrap_or_else(|| "ratewall".to_owned());
        if !valid_prefix(&prefix) {
            return Err(Error::BadPrefix(prefix));
        }
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let registry = Arc::new(Registry::default());
        let fallback = Arc::new(MemoryBackend::with_shared_clock(clock.clone()));
        // Outermost first; see `crate::layer` for what each does and why in
        // this order.
        let mut layers: Vec<Box<dyn Layer>> = vec![Box::<Observe>::default()];
        let remote = self.backend.is_some();
        // Above the deny list: a call the lists answer (a deny-listed
        // identity) is one after which the shared lists are read again.
        if let Some(backend) = &self.backend {
            layers.push(Box::new(ListSync::new(
                backend.clone(),
                &prefix,
                registry.clone(),
                self.lists_refresh.unwrap_or(DEFAULT_LISTS_REFRESH),
            )));
        }
        layers.extend([
            Box::new(DenyList::new(registry.clone())) as Box<dyn Layer>,
            Box::new(Validate),
            Box::new(Failure::new(fallback.clone())),
        ]);
        let deny_cache = self.deny_cache.unwrap_or(remote);
        let mut deny = None;
        if remote || deny_cache {
            let cache = DenyCache::new(
                DEFAULT_CAPACITY,
                self.deny_cache_max_hold.unwrap_or(DEFAULT_MAX_HOLD),
            );
            let layer = DenyLayer::new(cache, registry.clone(), deny_cache);
            if remote {
                // Shared with what hears the store's notices.
                let layer = Arc::new(layer);
                layers.push(Box::new(layer.clone()));
                deny = Some(layer);
            } else {
                layers.push(Box::new(layer));
            }
        }
        // Inside the deny cache: a shadowed refusal is never remembered.
        layers.push(Box::new(Shadow::new(registry.clone())));
        let mut breaker = None;
        let mut leases = None;
        let mut abandoned = None;
        let room = Arc::new(crate::limiter::room::Room::default());
        let mut heard = None;
        let store = match self.backend {
            Some(backend) => {
                // Room given back by other processes, as the store tells.
                heard = Heard::subscribe(&*backend, &prefix, deny, room.clone());
                // Inside shadow mode (shadowed names do not lease) and the
                // deny cache, above the breaker: a lease decides while the
                // backend is down too.
                let lease: LeaseLayer = Arc::new(Leases::new(
                    backend.clone(),
                    registry.clone(),
                    self.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL),
                ));
                layers.push(Box::new(lease.clone()));
                leases = Some(lease);
                // Below the lease (a lease decides whatever the backend
                // does) and above the breaker: calls given up on are taken
                // back before the backend decides anything else.
                let shared = Arc::new(Breaker::new(self.breaker));
                let cancels = Arc::new(Abandoned::new(backend.clone(), Some(shared.clone())));
                layers.push(Box::new(cancels.clone()));
                abandoned = Some(cancels);
                layers.push(Box::new(shared.clone()));
                breaker = Some(shared);
                layers.push(Box::new(Publish::new(backend.clone(), &prefix)));
                Store::Remote(backend)
            }
            None => Store::Memory(Arc::new(MemoryBackend::with_shared_clock(clock))),
        };
        let keeper = Keeper::new(&store, fallback);
        Ok(Limiter {
            id: NEXT_LIMITER.fetch_add(1, Ordering::Relaxed),
            prefix: prefix.into_boxed_str(),
            policy: self.policy,
            registry,
            pipeline: Pipeline::new(layers, store),
            breaker,
            leases,
            keeper,
            abandoned,
            cancel_every_call: self.cancel_abandoned,
            room,
            heard,
            pauses: crate::limiter::room::Pauses::default(),
            remembered: Default::default(),
        })
    }

    /// Builds the limiter and installs it as the process-global one used by
    /// `#[rate_limit]`. Fails if one is already installed.
    ///
    /// # Errors
    /// As [`LimiterBuilder::build`], and [`Error::AlreadyInstalled`] when a
    /// global limiter is installed already (the one built here is dropped; the
    /// installed one stays).
    pub fn install(self) -> Result<&'static Limiter, Error> {
        let limiter = self.build()?;
        let mut fresh = false;
        let installed = GLOBAL.get_or_init(|| {
            fresh = true;
            limiter
        });
        if fresh {
            Ok(installed)
        } else {
            Err(Error::AlreadyInstalled)
        }
    }
}
