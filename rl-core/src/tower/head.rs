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

/// The head of a split `http` request (hyper's, axum's, tonic's), with
/// the path parameters read from it.
#[cfg(feature = "tower")]
#[derive(Clone, Copy)]
pub(crate) struct HttpHead<'p> {
    parts: &'p Parts,
    #[cfg_attr(
        not(any(feature = "axum", feature = "actix")),
        allow(
            dead_code,
            reason = "path parameters come from axum's or actix-web's router"
        )
    )]
    params: &'p PathParams,
}

#[cfg(feature = "tower")]
impl<'p> HttpHead<'p> {
    /// The head of split request `parts`, with the path parameters read
    /// from it.
    pub(crate) fn of_parts(parts: &'p Parts, params: &'p PathParams) -> Self {
        Self { parts, params }
    }

    /// The head of a whole request (no parts, no parameters): one pointer.
    #[inline]
    pub(crate) fn of_request<B>(request: &'p http::Request<B>) -> WholeRequest<'p, B> {
        WholeRequest(request)
    }
}

/// The head of a whole `http` request, borrowed: what the in-memory path
/// reads keys from without splitting the request.
#[cfg(feature = "tower")]
pub(crate) struct WholeRequest<'p, B>(&'p http::Request<B>);

#[cfg(feature = "tower")]
impl<B> Clone for WholeRequest<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

#[cfg(feature = "tower")]
impl<B> Copy for WholeRequest<'_, B> {}

/// `Line` and `RequestHead` of an `http` head, from its parts' accessors.
macro_rules! http_head {
    ($ty:ty, $($generics:tt)*) => {
        #[cfg(feature = "tower")]
        impl<$($generics)*> Line for $ty {
            fn method(&self) -> &str {
                self.method().as_str()
            }

            fn path(&self) -> &str {
                self.uri().path()
            }

            fn is_grpc(&self) -> bool {
                is_grpc(self.headers())
            }
        }

        #[cfg(feature = "tower")]
        impl<$($generics)*> RequestHead<'p> for $ty {
            #[inline]
            fn header(&self, name: &HeaderName) -> Option<&'p [u8]> {
                self.headers().get(name).map(http::HeaderValue::as_bytes)
            }

            #[inline(always)]
            fn client_address(&self, trusted: Option<&TrustedProxies>) -> Option<IpAddr> {
                let extensions = self.extensions();
                let peer = crate::http::peer(extensions)?;
                let trusted = trusted.or_else(|| extensions.get::<TrustedProxies>());
                Some(crate::http::resolve_ip(peer, self.headers(), trusted))
            }

            #[inline]
            fn ip_prefix(&self) -> Option<IpPrefix> {
                self.extensions().get::<IpPrefix>().copied()
            }

            fn extension(
                &self,
                get: &ExtensionGetters,
            ) -> Option<&'p (dyn fmt::Display + Send + Sync)> {
                (get.http)(self.extensions())
            }

            fn path_param(&self, name: &str) -> Param<'p> {
                self.param(name)
            }

            fn parts(&self) -> Option<&'p Parts> {
                self.split()
            }
        }
    };
}

http_head!(HttpHead<'p>, 'p);
http_head!(WholeRequest<'p, B>, 'p, B);

/// The accessors [`http_head!`] reads.
#[cfg(feature = "tower")]
impl<'p> HttpHead<'p> {
    fn method(&self) -> &'p Method {
        &self.parts.method
    }
    fn uri(&self) -> &'p Uri {
        &self.parts.uri
    }
    fn headers(&self) -> &'p HeaderMap {
        &self.parts.headers
    }
    fn extensions(&self) -> &'p Extensions {
        &self.parts.extensions
    }
    fn param(&self, name: &str) -> Param<'p> {
        key::axum_param(self.params, name)
    }
    fn split(&self) -> Option<&'p Parts> {
        Some(self.parts)
    }
}

/// The accessors [`http_head!`] reads.
#[cfg(feature = "tower")]
impl<'p, B> WholeRequest<'p, B> {
    fn method(&self) -> &'p Method {
        self.0.method()
    }
    fn uri(&self) -> &'p Uri {
        self.0.uri()
    }
    fn headers(&self) -> &'p HeaderMap {
        self.0.headers()
    }
    fn extensions(&self) -> &'p Extensions {
        self.0.extensions()
    }
    fn param(&self, _name: &str) -> Param<'p> {
        Param::Missing
    }
    fn split(&self) -> Option<&'p Parts> {
        None
    }
}
