//! Configuring a route layer ([`RateLimitLayerBuilder`]).

use super::*;
use std::time::Duration;

/// Configures a [`RateLimitLayer`]; errors surface in
/// [`build`](RateLimitLayerBuilder::build).
#[derive(Debug)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct RateLimitLayerBuilder {
    pub(super) name: String,
    pub(super) groups: Vec<GroupSpec>,
    pub(super) keys: SmallVec<[KeyFrom; 2]>,
    pub(super) tiers: SmallVec<[Option<TierFn>; 2]>,
    /// Each key's block ([`RateLimitLayerBuilder::block_for`]).
    pub(super) blocks: SmallVec<[Option<Duration>; 2]>,
    pub(super) error: Option<LayerError>,
    pub(super) limiter: Option<Arc<Limiter>>,
    pub(super) policy: Option<FailurePolicy>,
    pub(super) headers: bool,
    pub(super) legacy: bool,
    pub(super) missing: MissingKey,
    pub(super) trusted: Option<TrustedProxies>,
    pub(super) exempt: Exempt,
    pub(super) hooks: Hooks,
}

impl RateLimitLayerBuilder {
    /// A layer named `name`, without keys (see [`RateLimitLayer::builder`]).
    pub(super) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            groups: Vec::new(),
            keys: SmallVec::new(),
            tiers: SmallVec::new(),
            blocks: SmallVec::new(),
            error: None,
            limiter: None,
            policy: None,
            headers: true,
            legacy: false,
            missing: MissingKey::Reject,
            trusted: None,
            exempt: Exempt::default(),
            hooks: Hooks::default(),
        }
    }

    /// Adds a key: `limits` per key from `key`, in a group named `name` (the
    /// key's scope, the name in rejections and the name
    /// [`Settings::set_limits`](crate::settings::Settings::set_limits) changes). Every key of a layer is decided in
    /// the same call, all-or-nothing: a request refused by one consumes
    /// nothing from the others.
    pub fn key<L: IntoLimit>(
        mut self,
        name: &str,
        limits: impl IntoIterator<Item = L>,
        key: KeyFrom,
    ) -> Self {
        let limits: Result<Vec<Limit>, LimitError> =
            limits.into_iter().map(IntoLimit::into_limit).collect();
        match limits {
            Ok(limits) => self.group(GroupSpec::owned(name, limits), key),
            Err(source) => {
                self.error.get_or_insert(LayerError::Limit {
                    group: name.to_owned(),
                    source,
                });
                self
            }
        }
    }

    /// Adds a concurrency limit: at most `max` requests per key from `key`
    /// being served at once, in a group named `name` ([`Limit::in_flight`],
    /// lease 10 s; for another lease, `.key(name, [Limit::in_flight_with_ttl(..)?], key)`).
    /// A request holds its slot from admission until the service's response
    /// is ready (or the request is dropped), decided in the same call as
    /// the layer's other keys, all-or-nothing. A request refused for lack of
    /// a slot gets a `429` with `Retry-After: 1` and
    /// `{"error":"too_many_in_flight","max_in_flight":N,"retry_after_ms":1000}`
    /// (gRPC: `RESOURCE_EXHAUSTED`).
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let reports = RateLimitLayer::builder("reports")
    ///     .key("reports_ip", ["60/1m"], KeyFrom::client_ip())
    ///     .in_flight("reports_tenant", 4, KeyFrom::header("x-tenant"))
    ///     .build()?;
    /// # let _ = reports;
    /// # Ok(())
    /// # }
    /// ```
    pub fn in_flight(self, name: &str, max: u64, key: KeyFrom) -> Self {
        self.key(name, [Limit::in_flight(max)], key)
    }

    /// Adds a key with a prepared group (e.g. with a cost per request).
    pub fn group(mut self, group: GroupSpec, key: KeyFrom) -> Self {
        if let key::Source::Header(Err(header)) = &key.source {
            self.error.get_or_insert(LayerError::Header {
                group: group.name().to_owned(),
                header: header.to_string(),
            });
        }
        if self.groups.iter().any(|g| g.name() == group.name()) {
            self.error
                .get_or_insert(LayerError::DuplicateGroup(group.name().to_owned()));
        }
        self.groups.push(group);
        self.keys.push(key);
        self.tiers.push(None);
        self.blocks.push(None);
        self
    }

    /// A penalty box for the key added last: once a request is refused by
    /// one of its rate limits (its tiers' included, declared before or
    /// after), the key is refused by that limit for `block`, with a
    /// `Retry-After` until the block ends, on every instance sharing the
    /// store ([`Limit::with_block`]; its in-flight slots never block).
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer};
    /// use std::time::Duration;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let login = RateLimitLayer::builder("login")
    ///     .key("login_ip", ["10/1m"], KeyFrom::client_ip())
    ///     .block_for(Duration::from_secs(15 * 60))
    ///     .build()?;
    /// # let _ = login;
    /// assert!(RateLimitLayer::builder("x").block_for(Duration::from_secs(1)).build().is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn block_for(mut self, block: Duration) -> Self {
        match self.blocks.last_mut() {
            Some(last) => *last = Some(block),
            None => {
                self.error.get_or_insert(LayerError::Limit {
                    group: String::new(),
                    source: LimitError::BadCall(
                        "`block_for` blocks the key added last: add one with `key` first".into(),
                    ),
                });
            }
        }
        self
    }

    /// Adds a tiered key: requests are limited per key from `key` by the
    /// limits of the tier `tier` reads from the request (e.g. a plan header,
    /// or the plan of the user an authentication layer put in the
    /// extensions), each tier on its own state. Declare its tiers with
    /// [`tier`](RateLimitLayerBuilder::tier) right after; tiers configured
    /// at run time as `<name>@<tier>` ([`Settings::set_limits`](crate::settings::Settings::set_limits)) are used
    /// too. A request whose tier is none of these (or `None`) is decided by
    /// the tier named `default` when there is one, else it cannot be
    /// decided and the failure policy answers (see [`crate::call::Tier`]): give a
    /// `default` when the tier comes from the client.
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder("api")
    ///     .tiered_key("api_key", KeyFrom::header("x-api-key"), |parts| {
    ///         parts.headers.get("x-plan")?.to_str().ok()
    ///     })
    ///     .tier("free", ["10/1m"])
    ///     .tier("pro", ["1000/1m", "20/1s"])
    ///     .tier("default", ["5/1m"])
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tiered_key<F>(self, name: &str, key: KeyFrom, tier: F) -> Self
    where
        F: Fn(&Parts) -> Option<&str> + Send + Sync + 'static,
    {
        self.tiered_group(GroupSpec::owned_tiered(name, Vec::new()), key, tier)
    }

    /// Adds a tiered key with a prepared tiered group
    /// ([`GroupSpec::tiered`], e.g. with its tiers and a cost).
    pub fn tiered_group<F>(mut self, group: GroupSpec, key: KeyFrom, tier: F) -> Self
    where
        F: Fn(&Parts) -> Option<&str> + Send + Sync + 'static,
    {
        if !group.is_tiered() {
            self.error.get_or_insert(LayerError::Tier {
                tier: String::new(),
                message: format!(
                    "`tiered_group` needs a tiered group (`GroupSpec::tiered`), but `{}` is not one",
                    group.name()
                ),
            });
        }
        self = self.group(group, key);
        if let Some(last) = self.tiers.last_mut() {
            *last = Some(TierFn(Arc::new(tier)));
        }
        self
    }

    /// Declares a tier of the tiered key added last
    /// ([`tiered_key`](RateLimitLayerBuilder::tiered_key)): its `limits`,
    /// live-configurable as `<key name>@<tier>`.
    pub fn tier<L: IntoLimit>(mut self, tier: &str, limits: impl IntoIterator<Item = L>) -> Self {
        let limits: Result<Vec<Limit>, LimitError> =
            limits.into_iter().map(IntoLimit::into_limit).collect();
        let tiered = matches!(self.tiers.last(), Some(Some(_)));
        match (self.groups.pop(), limits) {
            (Some(group), Ok(limits)) if tiered => {
                self.groups
                    .push(group.with_tier(crate::limiter::spec::Tier::owned(tier, limits)));
            }
            (Some(group), Err(source)) if tiered => {
                self.error.get_or_insert(LayerError::Limit {
                    group: format!("{}@{tier}", group.name()),
                    source,
                });
                self.groups.push(group);
            }
            (group, _) => {
                self.error.get_or_insert(LayerError::Tier {
                    tier: tier.to_owned(),
                    message: "a tier belongs to a tiered key: add one with `tiered_key` first"
                        .into(),
                });
                self.groups.extend(group);
            }
        }
        self
    }

    /// Decides on `limiter` instead of the global one (by default, the one
    /// [`LimiterBuilder::install`](crate::builder::LimiterBuilder::install) sets,
    /// looked up per request: `503` until it is installed).
    pub fn limiter(mut self, limiter: Arc<Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The failure policy of these calls, over the limiter's (a runtime
    /// [`Settings::set_policy`](crate::settings::Settings::set_policy) for the layer's name wins over both).
    pub fn policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Whether admitted responses get `RateLimit-Policy` and `RateLimit` for
    /// their binding limit (on by default; two small allocations per
    /// response).
    pub fn headers(mut self, headers: bool) -> Self {
        self.headers = headers;
        self
    }

    /// Whether responses also get the legacy fields `X-RateLimit-Limit`
    /// (the binding limit's quota), `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (the seconds until the limit is whole again,
    /// rounded up: a delay, as express-rate-limit's `legacyHeaders` and
    /// the `t` of `RateLimit`, not a Unix time), on admitted responses and
    /// on `429`s over a rate limit (off by default; three small
    /// allocations per admitted response). Independent of
    /// [`headers`](RateLimitLayerBuilder::headers): a response that has
    /// `X-RateLimit-Limit` keeps its own.
    pub fn legacy_headers(mut self, legacy: bool) -> Self {
        self.legacy = legacy;
        self
    }

    /// Answers refused requests with `hook`'s response instead of the
    /// default (over a limit, deny-listed, unavailable, and without a key
    /// unless [`MissingKey::Allow`]): the [`Refusal`] says why, with the
    /// [`Rejection`] and its [`Decision`], and gives the default answer's
    /// parts ([`Refusal::status`], [`Refusal::headers`] for `Retry-After`
    /// and the `RateLimit` fields, [`Refusal::code`],
    /// [`Refusal::message`]) so that a body of your own keeps them. Called
    /// only for refusals: an admitted request never reaches it. gRPC calls
    /// keep their default unless
    /// [`on_grpc_refusal`](RateLimitLayerBuilder::on_grpc_refusal) says
    /// otherwise.
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer, Refusal};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // An `{"error": {...}}` envelope, keeping `Retry-After` and the `RateLimit` fields.
    /// let layer = RateLimitLayer::builder("api")
    ///     .key("api_key", ["100/1m"], KeyFrom::header("x-api-key"))
    ///     .on_refusal(|refusal: &Refusal<'_>| {
    ///         let body = format!(r#"{{"error":{{"code":"{}","status":{}}}}}"#, refusal.code(), refusal.status().as_u16());
    ///         let mut response = http::Response::new(body);
    ///         *response.status_mut() = refusal.status();
    ///         *response.headers_mut() = refusal.headers();
    ///         response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    ///         response
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_refusal<F, B>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.hooks.http = Some(Arc::new(move |refusal| hook(refusal).map(Into::into)));
        self
    }

    /// Answers refused gRPC calls (`content-type: application/grpc*`) with
    /// `hook`'s reply instead of the default `RESOURCE_EXHAUSTED` (or
    /// `PERMISSION_DENIED`, `UNAVAILABLE`, `INVALID_ARGUMENT`, `INTERNAL`)
    /// with `grpc-retry-pushback-ms`: a `tonic::Status` (feature `tonic`)
    /// or the response parts ([`GrpcReply`]);
    /// [`Refusal::default_grpc_response`] is the default, to start from.
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer, Refusal};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder("rpc")
    ///     .key("rpc_ip", ["100/1m"], KeyFrom::client_ip())
    ///     .on_grpc_refusal(|refusal: &Refusal<'_>| {
    ///         // UNAVAILABLE, which clients retry, with the server's pushback kept.
    ///         let mut response = refusal.default_grpc_response();
    ///         response.headers_mut().insert("grpc-status", http::HeaderValue::from(14));
    ///         response
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_grpc_refusal<F, R>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal<'_>) -> R + Send + Sync + 'static,
        R: GrpcReply,
    {
        self.hooks.grpc = Some(Arc::new(move |refusal| hook(refusal).into_response()));
        self
    }

    /// Lets requests with these methods through untouched (e.g. CORS
    /// preflights, `[Method::OPTIONS]`): no store call, no fields.
    pub fn exempt_methods(mut self, methods: impl IntoIterator<Item = http::Method>) -> Self {
        self.exempt.methods.extend(methods);
        self
    }

    /// Lets requests whose path is `prefix` or below it, segment by
    /// segment (`/health` covers `/health` and `/health/live`, not
    /// `/healthz`; a prefix ending with `/` covers everything that starts
    /// with it), through untouched: no store call, no fields. Paths are
    /// compared as received, not decoded or normalised: a request written
    /// another way (`/%68ealth`, `//health`) is limited, never exempted by
    /// mistake.
    pub fn exempt_path_prefix(mut self, prefix: &str) -> Self {
        if self.check_path(prefix) {
            self.exempt.prefixes.push(prefix.into());
        }
        self
    }

    /// Lets requests whose path is exactly `path` (as received, without
    /// the query) through untouched: no store call, no fields.
    pub fn exempt_path(mut self, path: &str) -> Self {
        if self.check_path(path) {
            self.exempt.paths.push(path.into());
        }
        self
    }

    /// Lets requests for which `exempt` holds through untouched: no store
    /// call, no fields. It reads the request's head (method, URI, headers
    /// and, in tower, extensions; in actix-web, the head without its
    /// extensions, copied for it).
    ///
    /// ```
    /// use ratewall::tower::{KeyFrom, RateLimitLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder("api")
    ///     .key("api_ip", ["100/1m"], KeyFrom::client_ip())
    ///     .exempt_methods([http::Method::OPTIONS])
    ///     .exempt_path_prefix("/health")
    ///     // Internal jobs, with a header the edge proxy strips from outside requests.
    ///     .exempt_if(|parts| parts.headers.contains_key("x-internal-job"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn exempt_if<F>(mut self, exempt: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.exempt.predicates.push(Arc::new(exempt));
        self
    }

    /// Whether `path` can be one (else the build's error).
    fn check_path(&mut self, path: &str) -> bool {
        if path.starts_with('/') {
            return true;
        }
        self.error.get_or_insert(LayerError::Path(path.to_owned()));
        false
    }

    /// What requests without a key get (default [`MissingKey::Reject`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// Proxies whose word on the client the client-IP keys believe, in the
    /// headers they name (`X-Forwarded-For` by default; `Forwarded`,
    /// `X-Real-IP`: [`TrustedProxies::with_headers`]); else a
    /// [`TrustedProxies`] request extension, else none.
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = Some(trusted);
        self
    }

    /// The layer, or the first problem of its configuration.
    ///
    /// # Errors
    /// The first problem of the configuration: [`LayerError::Limit`] for a
    /// limit that cannot be built or read (or blocked, see
    /// [`block_for`](RateLimitLayerBuilder::block_for)), [`LayerError::Header`] for a header
    /// name that is not one, [`LayerError::DuplicateGroup`] for two keys with
    /// one name, [`LayerError::Tier`] for a tier without a tiered key, and
    /// [`LayerError::Spec`] when the keys cannot be decided together (see
    /// [`CallSpec::check`]), [`LayerError::Path`] for an exempted path
    /// without its leading `/`.
    pub fn build(self) -> Result<RateLimitLayer, LayerError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let groups = self
            .groups
            .into_iter()
            .zip(&self.blocks)
            .map(|(group, block)| match block {
                None => Ok(group),
                Some(block) => {
                    let name = group.name().to_owned();
                    group
                        .with_block(*block)
                        .map_err(|source| LayerError::Limit {
                            group: name,
                            source,
                        })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut spec = CallSpec::owned(self.name, groups);
        if let Some(policy) = self.policy {
            spec = spec.with_policy(policy);
        }
        spec.check().map_err(LayerError::Spec)?;
        let params = self.keys.iter().any(KeyFrom::is_path_param);
        let tiered = self.tiers.iter().any(Option::is_some);
        let fns = tiered || self.keys.iter().any(KeyFrom::is_fn);
        let split = params || fns || self.exempt.reads_parts();
        let exempt = (!self.exempt.is_empty()).then(|| Box::new(self.exempt));
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                spec,
                keys: self.keys,
                tiers: self.tiers,
                tiered,
                limiter: self.limiter,
                headers: self.headers,
                legacy: self.legacy,
                missing: self.missing,
                trusted: self.trusted,
                params,
                fns,
                split,
                exempt,
                hooks: self.hooks,
                id: NEXT_LAYER.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }
}
