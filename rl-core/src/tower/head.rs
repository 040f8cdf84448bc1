//! What a route limit reads of a request, whichever server it comes from:
//! [`RequestHead`], for `http` requests ([`HttpHead`], tower's) and for
//! actix-web's (`crate::actix`).

use std::fmt;
use std::net::IpAddr;

use http::HeaderName;
use http::request::Parts;
#[cfg(feature = "tower")]
use http::{Extensions, HeaderMap, Method, Uri};

use super::key::ExtensionGetters;
#[cfg(feature = "tower")]
use super::key::{self, PathParams};
use crate::http::{IpPrefix, TrustedProxies};

/// A path parameter as a request has it.
#[cfg_attr(
    not(any(feature = "axum", feature = "actix")),
    allow(
        dead_code,
        reason = "path parameters come from axum's or actix-web's router"
    )
)]
pub(crate) enum Param<'p> {
    /// Its value, percent-decoded.
    Found(&'p str),
    /// Present, but not UTF-8 once decoded.
    #[cfg_attr(
        not(all(feature = "axum", feature = "tower")),
        allow(dead_code, reason = "axum's parameters only")
    )]
    NotUtf8,
    /// Not there (no such parameter, or not routed yet).
    Missing,
}

/// The request line of a refused request, as a [`Refusal`](super::Refusal)
/// shows it (object-safe: the refusal is not generic).
pub(crate) trait Line {
    /// The method (`GET`).
    fn method(&self) -> &str;
    /// The path, without the query.
    fn path(&self) -> &str;
    /// Whether the request is a gRPC call (`content-type: application/grpc*`).
    fn is_grpc(&self) -> bool;
}

/// A request's head, borrowed for `'p`: what keys, tiers and exemptions
/// read.
pub(crate) trait RequestHead<'p>: Line + Copy {
    /// The first line of header `name`.
    fn header(&self, name: &HeaderName) -> Option<&'p [u8]>;
    /// The client's address, by the rules of
    /// [`ClientIp`](crate::http::ClientIp), trusting `trusted`, else the
    /// request's [`TrustedProxies`] extension; `None` when the server gives
    /// no peer address.
    fn client_address(&self, trusted: Option<&TrustedProxies>) -> Option<IpAddr>;
    /// The request's [`IpPrefix`] extension.
    fn ip_prefix(&self) -> Option<IpPrefix>;
    /// An extension, through its `Display`.
    fn extension(&self, get: &ExtensionGetters) -> Option<&'p (dyn fmt::Display + Send + Sync)>;
    /// A path parameter of the matched route.
    #[cfg_attr(
        not(any(feature = "axum", feature = "actix")),
        allow(
            dead_code,
            reason = "path parameters come from axum's or actix-web's router"
        )
    )]
    fn path_param(&self, name: &str) -> Param<'p>;
    /// The whole head as `http` parts, when a key, a tier or an exemption
    /// reads it.
    fn parts(&self) -> Option<&'p Parts>;
}

/// Whether headers say gRPC (`content-type: application/grpc*`).
#[cfg(feature = "tower")]
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The head of an `http` request (hyper's, axum's, tonic's).
#[cfg(feature = "tower")]
#[derive(Clone, Copy)]
pub(crate) struct HttpHead<'p> {
    pub(crate) headers: &'p HeaderMap,
    pub(crate) extensions: &'p Extensions,
    method: &'p Method,
    uri: &'p Uri,
    parts: Option<&'p Parts>,
    #[cfg_attr(
        not(any(feature = "axum", feature = "actix")),
        allow(
            dead_code,
            reason = "path parameters come from axum's or actix-web's router"
        )
    )]
    params: &'p PathParams,
}

/// No path parameters read.
#[cfg(feature = "tower")]
static NO_PARAMS: PathParams = None;

#[cfg(feature = "tower")]
impl<'p> HttpHead<'p> {
    /// The head of split request `parts`, with the path parameters read
    /// from it.
    pub(crate) fn of_parts(parts: &'p Parts, params: &'p PathParams) -> Self {
        Self {
            headers: &parts.headers,
            extensions: &parts.extensions,
            method: &parts.method,
            uri: &parts.uri,
            parts: Some(parts),
            params,
        }
    }

    /// The head of a whole request (no parts, no parameters).
    #[inline]
    pub(crate) fn of_request<B>(request: &'p http::Request<B>) -> Self {
        Self {
            headers: request.headers(),
            extensions: request.extensions(),
            method: request.method(),
            uri: request.uri(),
            parts: None,
            params: &NO_PARAMS,
        }
    }
}

#[cfg(feature = "tower")]
impl Line for HttpHead<'_> {
    fn method(&self) -> &str {
        self.method.as_str()
    }

    fn path(&self) -> &str {
        self.uri.path()
    }

    fn is_grpc(&self) -> bool {
        is_grpc(self.headers)
    }
}

#[cfg(feature = "tower")]
impl<'p> RequestHead<'p> for HttpHead<'p> {
    #[inline]
    fn header(&self, name: &HeaderName) -> Option<&'p [u8]> {
        self.headers.get(name).map(http::HeaderValue::as_bytes)
    }

    #[inline]
    fn client_address(&self, trusted: Option<&TrustedProxies>) -> Option<IpAddr> {
        let peer = crate::http::peer(self.extensions)?;
        let trusted = trusted.or_else(|| self.extensions.get::<TrustedProxies>());
        Some(crate::http::resolve_ip(peer, self.headers, trusted))
    }

    #[inline]
    fn ip_prefix(&self) -> Option<IpPrefix> {
        self.extensions.get::<IpPrefix>().copied()
    }

    fn extension(&self, get: &ExtensionGetters) -> Option<&'p (dyn fmt::Display + Send + Sync)> {
        (get.http)(self.extensions)
    }

    fn path_param(&self, name: &str) -> Param<'p> {
        key::axum_param(self.params, name)
    }

    fn parts(&self) -> Option<&'p Parts> {
        self.parts
    }
}
