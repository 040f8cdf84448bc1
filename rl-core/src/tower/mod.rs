//! Route-level rate limits (feature `tower`), and limits on what we send
//! out (`UpstreamLayer`, for client services). The route layer: a `tower::Layer` for axum
//! routers and routes (`Router::layer`, `route_layer`), tonic servers and
//! any tower service over `http` requests (hyper's), built on
//! [`Limiter::call`](crate::Limiter::call) like `#[rate_limit]`. It needs
//! no axum: feature `tower` compiles none, and with feature `axum` keys
//! also come from the path parameters of axum's router
//! (`KeyFrom::path_param`) and the client address from axum's
//! `ConnectInfo`; elsewhere from a [`PeerAddr`](crate::http::PeerAddr)
//! extension or tonic's peer address (feature `tonic`). With feature
//! `actix`, the same layer is actix-web middleware
//! (`ratewall::actix::RateLimitMiddleware`): this module then holds its
//! configuration ([`RateLimitLayer`], [`KeyFrom`], the hooks'
//! [`Refusal`]) without the tower crate.
//!
//! The layer's answers can be shaped: a response hook
//! ([`RateLimitLayerBuilder::on_refusal`], `on_grpc_refusal` for gRPC)
//! turns a [`Refusal`] into the application's own response; exemptions
//! ([`RateLimitLayerBuilder::exempt_methods`], `exempt_path_prefix`,
//! `exempt_path`, `exempt_if`) let requests through without a store call;
//! [`RateLimitLayerBuilder::legacy_headers`] adds `X-RateLimit-*` beside
//! the IETF fields.
//!
//! A [`RateLimitLayer`] has a name and one or more keys, each read from the
//! request by a [`KeyFrom`] (the client IP or its network, a header, a path
//! parameter, an extension set by an earlier layer, or a function) and
//! limited by its own group of limits; all of a request's keys are decided
//! together, all-or-nothing, in one round trip. Keys are limits by name,
//! shared with the macro and changed at run time by
//! [`Settings::set_limits`](crate::settings::Settings::set_limits). A key can be
//! tiered ([`RateLimitLayerBuilder::tiered_key`]): its limits then depend
//! on a tier read from each request (e.g. the plan of an API key).
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratewall::Limiter;
//! use ratewall::tower::{KeyFrom, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = std::sync::Arc::new(Limiter::builder().memory().build()?);
//! let layer = RateLimitLayer::builder("search")
//!     .key("search_key", ["2/1m"], KeyFrom::header("x-api-key"))
//!     .limiter(limiter.clone())
//!     .build()?;
//! let app = Router::new().route("/search", get(|| async { "results" })).layer(layer);
//! let request = || {
//!     http::Request::get("/search").header("x-api-key", "k1").body(axum::body::Body::empty())
//! };
//! let first = app.clone().oneshot(request()?).await?;
//! assert_eq!(first.headers()["ratelimit"], "\"search_key\";r=1;t=30"); // GCRA: one back every 30 s
//! app.clone().oneshot(request()?).await?;
//! let third = app.clone().oneshot(request()?).await?;
//! assert_eq!(third.status(), 429);
//! assert_eq!(third.headers()["retry-after"], "30");
//! // Limits by name: a new limit applies to the next request (a new period
//! // starts from fresh state).
//! limiter.settings().set_limits("search_key", vec!["1000/1h".parse()?])?;
//! assert_eq!(app.clone().oneshot(request()?).await?.status(), 200);
//! // No key: 400, naming it.
//! let anonymous = http::Request::get("/search").body(axum::body::Body::empty())?;
//! assert_eq!(app.oneshot(anonymous).await?.status(), 400);
//! # Ok(())
//! # }
//! ```

mod answer;
#[cfg(feature = "tower")]
mod body;
mod head;
mod key;
mod layer;
#[cfg(feature = "tower")]
mod service;
#[cfg(all(test, feature = "tower"))]
mod tests;
#[cfg(feature = "tower")]
mod upstream;

pub use answer::{GrpcReply, Refusal, RefusalKind};
#[cfg(feature = "tower")]
pub use body::ResponseBody;
#[cfg(feature = "actix")]
pub(crate) use head::{Line, Param, RequestHead};
pub use key::KeyFrom;
#[cfg(feature = "actix")]
pub(crate) use key::{ExtensionGetters, Keys};
#[cfg(feature = "actix")]
pub(crate) use layer::{Extras, Fields, Shared, Verdict};
pub use layer::{IntoLimit, LayerError, MissingKey, RateLimitLayer, RateLimitLayerBuilder};
#[cfg(feature = "tower")]
pub use service::{RateLimit, ResponseFuture};
#[cfg(feature = "tower")]
pub use upstream::{Upstream, UpstreamError, UpstreamFuture, UpstreamLayer};
