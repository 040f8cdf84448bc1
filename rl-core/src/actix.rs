//! Route-level rate limits in actix-web (feature `actix`): a middleware
//! with the tower layer's semantics, configured by the same builder
//! ([`RateLimitLayer::builder`]) and deciding by the same code.
//!
//! [`RateLimitMiddleware`] wraps an `App`, a `Scope` or a `Resource`
//! (`.wrap(..)`): keys from the client IP or its network (the connection's
//! peer, or behind [`TrustedProxies`] the hop their header names), a
//! header, a path parameter (`match_info`: wrap the resource or scope, not
//! the app, whose middleware runs before routing), an extension an earlier
//! middleware inserted (`req.extensions_mut().insert(..)`) or a function
//! of the head; limits by name, tiers, several keys decided
//! all-or-nothing, the `RateLimit` fields (and the legacy ones), the
//! response hook, exemptions and concurrency slots, on memory or Redis.
//! Answers are the tower layer's: a `429` with `Retry-After`, the
//! `RateLimit` fields and `{"error":"rate_limited","retry_after_ms":N}`,
//! a `400` or `500` without a key, ... (see [`RateLimitLayer`]).
//!
//! Key functions, tiers and [`exempt_if`](crate::tower::RateLimitLayerBuilder::exempt_if)
//! read an `http::request::Parts` copied from actix-web's head (method,
//! URI, version, headers, and the peer as a
//! [`PeerAddr`] extension; not actix-web's
//! extensions): one copy per request when a layer has one.
//!
//! ```no_run
//! use actix_web::{App, HttpServer, web};
//! use ratewall::Limiter;
//! use ratewall::actix::RateLimitMiddleware;
//! use ratewall::tower::{KeyFrom, RateLimitLayer};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     Limiter::builder().memory().install()?;
//!     let api = RateLimitLayer::builder("api")
//!         .key("api_ip", ["100/1m"], KeyFrom::client_ip())
//!         .exempt_path_prefix("/health")
//!         .build()?;
//!     let per_user = RateLimitLayer::new("user_reads", ["10/1s"], KeyFrom::path_param("id"))?;
//!     let api = RateLimitMiddleware::new(api);
//!     let per_user = RateLimitMiddleware::new(per_user);
//!     // In actix-web's runtime (or under #[actix_web::main], with its `macros` feature).
//!     actix_web::rt::System::new().block_on(async move {
//!         HttpServer::new(move || {
//!             App::new()
//!                 .wrap(api.clone())
//!                 .route("/health", web::get().to(|| async { "ok" }))
//!                 .service(
//!                     web::resource("/users/{id}")
//!                         .wrap(per_user.clone()) // after routing: `{id}` is known
//!                         .route(web::get().to(|| async { "user" })),
//!                 )
//!         })
//!         .bind(("127.0.0.1", 8080))?
//!         .run()
//!         .await
//!     })?;
//!
//!     Ok(())
//! }
//! ```

use std::fmt;
use std::future::{Future, Ready, ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Extensions, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::{Error, HttpMessage, HttpResponse};
use bytes::Bytes;
use http::request::Parts;
use smallvec::SmallVec;

use crate::http::{HeaderLines, IpPrefix, PeerAddr, TrustedProxies};
use crate::tower::{
    ExtensionGetters, Extras, Fields, Keys, Line, Param, RateLimitLayer, RequestHead, Shared,
    Verdict,
};

/// A [`RateLimitLayer`] as actix-web middleware: `.wrap(RateLimitMiddleware::new(layer))`
/// on an `App`, a `Scope` or a `Resource` (see the [module](self) docs).
/// Cloned into each worker's app: the clones share the layer.
#[derive(Clone)]
pub struct RateLimitMiddleware {
    shared: Arc<Shared>,
}

impl RateLimitMiddleware {
    /// The middleware of `layer`.
    pub fn new(layer: RateLimitLayer) -> Self {
        Self {
            shared: layer.shared,
        }
    }
}

impl From<RateLimitLayer> for RateLimitMiddleware {
    fn from(layer: RateLimitLayer) -> Self {
        Self::new(layer)
    }
}

impl fmt::Debug for RateLimitMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitMiddleware")
            .field("call", &self.shared.spec.name())
            .finish_non_exhaustive()
    }
}

impl<S, B> Transform<S, ServiceRequest> for RateLimitMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = RateLimitService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            shared: self.shared.clone(),
        }))
    }
}

/// The service of a [`RateLimitMiddleware`]: decides each request, then
/// calls the wrapped service or answers.
pub struct RateLimitService<S> {
    service: Rc<S>,
    shared: Arc<Shared>,
}

impl<S> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("call", &self.shared.spec.name())
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for RateLimitService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Error>>>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let (service, shared) = (self.service.clone(), self.shared.clone());
        Box::pin(async move {
            match decide(&shared, &request).await {
                Verdict::Admit(extras) => {
                    let mut response = service.call(request).await?;
                    // The response is ready: its slots go back now (on an
                    // error too, with `extras` dropped).
                    if let Some(extras) = extras {
                        finish(*extras, response.headers_mut());
                    }
                    Ok(response.map_into_left_body())
                }
                Verdict::Answer(answer) => {
                    let answer = actix_response(*answer);
                    Ok(request.into_response(answer).map_into_right_body())
                }
            }
        })
    }
}

/// The verdict on `request`: exempted, decided in memory at once, or by
/// the remote store.
async fn decide(shared: &Shared, request: &ServiceRequest) -> Verdict {
    // The head's copy, made once when a predicate or a key function reads
    // it.
    let mut parts = None;
    if let Some(exempt) = &shared.exempt {
        if exempt.by_line(request.method().as_str(), request.path()) {
            return Verdict::Admit(None);
        }
        if exempt.reads_parts() {
            parts = parts_of(request);
            if parts.as_ref().is_some_and(|parts| exempt.by_parts(parts)) {
                return Verdict::Admit(None);
            }
        }
    }
    let line = ActixLine(request);
    let limiter = match shared.limiter() {
        Ok(limiter) => limiter,
        Err(rejection) => return shared.refused(&rejection, &line),
    };
    // The extensions are borrowed while the keys are read, not while the
    // store decides: the call holds its keys' copies, not the request.
    let call = {
        let extensions = request.extensions();
        if shared.fns && parts.is_none() {
            parts = parts_of(request);
        }
        let head = ActixHead {
            request,
            extensions: &extensions,
            parts: parts.as_ref().filter(|_| shared.fns),
        };
        if !limiter.is_remote()
            && let Some(verdict) = shared.decide_now(limiter, head)
        {
            return verdict;
        }
        let mut keys = Keys::new();
        if let Err(problem) = shared.keys(head, &mut keys) {
            return shared.no_key(&problem, &line);
        }
        shared.call(limiter, head, &keys)
    };
    shared.verdict(call.await, &line)
}

/// Adds an admitted response's fields, unless it has its own.
fn finish(extras: Extras, headers: &mut HeaderMap) {
    let (fields, legacy) = extras.finish();
    let mut add = |fields: &[(&'static str, &http::HeaderValue)]| {
        if headers.contains_key(fields[0].0) {
            return;
        }
        for (name, value) in fields {
            if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
    };
    if let Some((policy, current)) = &fields as &Option<Fields> {
        add(&[("ratelimit", current), ("ratelimit-policy", policy)]);
    }
    if let Some(legacy) = &legacy {
        let [limit, remaining, reset] = &**legacy;
        add(&[
            ("x-ratelimit-limit", limit),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-reset", reset),
        ]);
    }
}

/// An answer of the layer as actix-web's response.
fn actix_response(answer: http::Response<Bytes>) -> HttpResponse {
    let (parts, body) = answer.into_parts();
    let status = actix_web::http::StatusCode::from_u16(parts.status.as_u16())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, body);
    let headers = response.headers_mut();
    for (name, value) in &parts.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    response.map_into_boxed_body()
}

/// actix-web's head as `http` parts, for key functions, tiers and
/// predicates: method, URI, version, headers, and the peer as a
/// [`PeerAddr`].
fn parts_of(request: &ServiceRequest) -> Option<Parts> {
    use actix_web::http::Version;
    let version = match request.version() {
        Version::HTTP_09 => http::Version::HTTP_09,
        Version::HTTP_10 => http::Version::HTTP_10,
        Version::HTTP_2 => http::Version::HTTP_2,
        Version::HTTP_3 => http::Version::HTTP_3,
        _ => http::Version::HTTP_11,
    };
    let (mut parts, ()) = http::Request::builder()
        .method(request.method().as_str())
        .uri(request.uri().to_string())
        .version(version)
        .body(())
        .ok()?
        .into_parts();
    for (name, value) in request.headers() {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_str().as_bytes()),
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            parts.headers.append(name, value);
        }
    }
    if let Some(peer) = request.peer_addr() {
        parts.extensions.insert(PeerAddr(peer));
    }
    Some(parts)
}

impl HeaderLines for HeaderMap {
    fn lines(&self, name: &'static str) -> SmallVec<[&[u8]; 2]> {
        self.get_all(name).map(HeaderValue::as_bytes).collect()
    }
}

/// An actix-web request's head, with its extensions borrowed.
#[derive(Clone, Copy)]
struct ActixHead<'p> {
    request: &'p ServiceRequest,
    extensions: &'p Extensions,
    parts: Option<&'p Parts>,
}

/// An actix-web request's line, as a refusal shows it.
#[derive(Clone, Copy)]
struct ActixLine<'p>(&'p ServiceRequest);

impl Line for ActixLine<'_> {
    fn method(&self) -> &str {
        self.0.method().as_str()
    }

    fn path(&self) -> &str {
        self.0.path()
    }

    fn is_grpc(&self) -> bool {
        self.0
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
    }
}

impl Line for ActixHead<'_> {
    fn method(&self) -> &str {
        self.request.method().as_str()
    }

    fn path(&self) -> &str {
        self.request.path()
    }

    fn is_grpc(&self) -> bool {
        ActixLine(self.request).is_grpc()
    }
}

impl<'p> RequestHead<'p> for ActixHead<'p> {
    fn header(&self, name: &http::HeaderName) -> Option<&'p [u8]> {
        self.request
            .headers()
            .get(name.as_str())
            .map(HeaderValue::as_bytes)
    }

    fn client_address(&self, trusted: Option<&TrustedProxies>) -> Option<IpAddr> {
        let peer = match self.extensions.get::<PeerAddr>() {
            Some(PeerAddr(peer)) => peer.ip(),
            None => self.request.peer_addr()?.ip(),
        };
        let trusted = trusted.or_else(|| self.extensions.get::<TrustedProxies>());
        Some(crate::http::resolve_ip(
            peer,
            self.request.headers(),
            trusted,
        ))
    }

    fn ip_prefix(&self) -> Option<IpPrefix> {
        self.extensions.get::<IpPrefix>().copied()
    }

    fn extension(&self, get: &ExtensionGetters) -> Option<&'p (dyn fmt::Display + Send + Sync)> {
        (get.actix)(self.extensions)
    }

    fn path_param(&self, name: &str) -> Param<'p> {
        match self.request.match_info().get(name) {
            Some(value) => Param::Found(value),
            None => Param::Missing,
        }
    }

    fn parts(&self) -> Option<&'p Parts> {
        self.parts
    }
}
