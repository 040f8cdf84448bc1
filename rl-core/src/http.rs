//! HTTP integration (feature `axum` or `tower`): the `429` response and the
//! client's IP, over the `http` crate's types; with feature `axum`, a
//! [`Rejection`] is an axum `IntoResponse` and [`ClientIp`] an extractor.
//!
//! A [`Rejection`] is answered (axum's `IntoResponse`, the tower layer) with
//! `429 Too Many Requests` and
//! - `Retry-After`: whole seconds, rounded up, so a client that waits exactly
//!   that long is allowed;
//! - the IETF `RateLimit-Policy` and `RateLimit` fields
//!   (draft-ietf-httpapi-ratelimit-headers): `"name";q=QUOTA;w=WINDOW` and
//!   `"name";r=REMAINING;t=RESET`, seconds rounded up;
//! - a JSON body `{"error":"rate_limited","retry_after_ms":N}`.
//!
//! A rejection because the limiter could not decide (fail-closed) becomes
//! `503 Service Unavailable` with `{"error":"rate_limiter_unavailable"}`; a
//! deny-listed identity `403 Forbidden` with `{"error":"denied"}` (and a
//! `Retry-After` only when the entry expires).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arrayvec::{ArrayString, ArrayVec};
#[cfg(feature = "axum")]
use axum::extract::{ConnectInfo, FromRequestParts};
#[cfg(feature = "axum")]
use axum::response::{IntoResponse, Response};
#[cfg(any(feature = "axum", feature = "tower"))]
use http::Extensions;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
#[cfg(feature = "axum")]
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ipnet::IpNet;

use crate::model::decision::Decision;
use crate::model::limit::Limit;
use crate::model::rejection::Rejection;
use crate::refusal::{self, Wire};

mod forwarded;
pub(crate) use forwarded::HeaderLines;
pub use forwarded::ProxyHeader;

/// The `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`: the binding limit's quota (the legacy fields
/// express-rate-limit and GitHub send; the route layer's
/// `legacy_headers`, feature `tower` or `actix`).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: what is left of the binding limit's quota.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: the seconds (rounded up) until the binding limit
/// is whole again: a delay, as express-rate-limit sends it, not a time.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Adds `RateLimit-Policy` and `RateLimit` for one limit's decision, e.g. to
/// an allowed response.
///
/// ```
/// use ratewall::{Decision, Limit, backend::Figures, http::insert_rate_limit_headers};
/// let mut headers = http::HeaderMap::new();
/// let decision = Decision::new(Figures {
///     allowed: true,
///     limit: 5,
///     remaining: 4,
///     reset_after_us: 720_000_000,
///     ..Figures::default()
/// });
/// insert_rate_limit_headers(&mut headers, "sms", &decision, &Limit::per_hour(5).unwrap());
/// assert_eq!(headers["ratelimit-policy"], "\"sms\";q=5;w=3600");
/// assert_eq!(headers["ratelimit"], "\"sms\";r=4;t=720");
/// ```
pub fn insert_rate_limit_headers(
    headers: &mut HeaderMap,
    name: &str,
    decision: &Decision,
    limit: &Limit,
) {
    let (policy, current) = refusal::fields(name, decision, limit);
    if let (Ok(policy), Ok(current)) = (
        HeaderValue::try_from(policy),
        HeaderValue::try_from(current),
    ) {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, current);
    }
}

/// Responses that can carry rate-limit headers (`#[rate_limit(headers)]`,
/// [`crate::Permit::add_headers`]).
#[diagnostic::on_unimplemented(
    message = "`headers` needs the function to return an `http::Response` or a `Result` of one, not `{Self}`"
)]
pub trait WithHeaders {
    /// The headers to add to, if this is a successful response.
    fn headers_mut(&mut self) -> Option<&mut HeaderMap>;
}

impl<B> WithHeaders for http::Response<B> {
    fn headers_mut(&mut self) -> Option<&mut HeaderMap> {
        Some(http::Response::headers_mut(self))
    }
}

impl<T: WithHeaders, E> WithHeaders for Result<T, E> {
    fn headers_mut(&mut self) -> Option<&mut HeaderMap> {
        self.as_mut().ok().and_then(WithHeaders::headers_mut)
    }
}

/// `rejection` as an HTTP response: its status (`429`, `403`, `503`),
/// `Content-Type: application/json`, `Retry-After` and the `RateLimit`
/// fields when it has them, and its JSON body (see the module docs).
pub(crate) fn rejection_response<B: From<String>>(rejection: &Rejection) -> http::Response<B> {
    let refusal = Wire::of(rejection);
    let mut response = http::Response::new(B::from(refusal.body));
    *response.status_mut() =
        StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(secs) = refusal.retry_after_secs {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some((policy, current)) = refusal.fields
        && let (Ok(policy), Ok(current)) = (
            HeaderValue::try_from(policy),
            HeaderValue::try_from(current),
        )
    {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, current);
    }
    response
}

/// The response of the module docs (feature `axum`).
#[cfg(feature = "axum")]
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        rejection_response(&self)
    }
}

/// The address of a request's peer (the other end of its connection), for
/// servers that do not give axum's `ConnectInfo<SocketAddr>`: a hyper
/// server (`service_fn` knows the address it accepted), a tonic server
/// behind a custom transport. Insert it into the request's extensions,
/// `request.extensions_mut().insert(PeerAddr(remote))`, before
/// [`ClientIp`] or the tower layer's `KeyFrom::client_ip` reads it.
///
/// The peer is read, in this order, from axum's `ConnectInfo<SocketAddr>`
/// (feature `axum`), a `PeerAddr`, then tonic's `TcpConnectInfo` (features
/// `tower` and `tonic`).
///
/// ```
/// use ratewall::http::PeerAddr;
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(PeerAddr("192.0.2.7:52100".parse().unwrap()));
/// assert_eq!(request.extensions().get::<PeerAddr>().unwrap().0.port(), 52100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// The socket peer the server put in a request's `extensions` (see
/// [`PeerAddr`] for where it is read from).
#[cfg(any(feature = "axum", feature = "tower"))]
#[inline]
pub(crate) fn peer(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(ConnectInfo(addr)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(all(feature = "tower", feature = "tonic"))]
    if let Some(info) = extensions.get::<tonic::transport::server::TcpConnectInfo>() {
        return info.remote_addr().map(|addr| addr.ip());
    }
    None
}

/// Proxies whose word on the client is believed, and the headers they
/// tell it in ([`ProxyHeader`]: `X-Forwarded-For` alone by default, or
/// `Forwarded` (RFC 7239) and `X-Real-IP`, in an order of precedence:
/// [`with_headers`](TrustedProxies::with_headers)). Add it to the
/// request's extensions (e.g. as an axum `Extension`), or give it to the
/// route layer; without it [`ClientIp`] uses the socket's address only.
///
/// ```
/// use ratewall::http::{ProxyHeader, TrustedProxies};
/// let proxies: TrustedProxies = "10.0.0.0/8, 127.0.0.1/32".parse().unwrap();
/// assert!(proxies.contains("10.1.2.3".parse().unwrap()));
/// assert_eq!(proxies.headers(), [ProxyHeader::XForwardedFor]);
/// assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
/// // Proxies that set `Forwarded`, some older ones `X-Real-IP`.
/// let proxies = proxies.with_headers([ProxyHeader::Forwarded, ProxyHeader::XRealIp]);
/// assert_eq!(proxies.headers(), [ProxyHeader::Forwarded, ProxyHeader::XRealIp]);
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    networks: Arc<[IpNet]>,
    /// The headers read, in order of precedence.
    headers: ArrayVec<ProxyHeader, 3>,
}

impl Default for TrustedProxies {
    /// No proxy trusted (and `X-Forwarded-For` the header read).
    fn default() -> Self {
        Self::new([])
    }
}

impl TrustedProxies {
    /// Trusts the given networks, whose `X-Forwarded-For` is read.
    pub fn new(networks: impl IntoIterator<Item = IpNet>) -> Self {
        let mut headers = ArrayVec::new();
        headers.push(ProxyHeader::XForwardedFor);
        Self {
            networks: networks.into_iter().collect(),
            headers,
        }
    }

    /// The same proxies, read in the headers `headers`, in this order of
    /// precedence: the first of them present in a request is the one
    /// read, alone (its right-most hop that is not a trusted proxy, as for
    /// `X-Forwarded-For`); a repeated header counts once; none: the peer
    /// is always the client. Name only headers your proxies set or
    /// overwrite: one they pass through as the client sent it lets the
    /// client write its own address (e.g. `Forwarded` first behind a proxy
    /// that only appends to `X-Forwarded-For`).
    pub fn with_headers(mut self, headers: impl IntoIterator<Item = ProxyHeader>) -> Self {
        self.headers.clear();
        for header in headers {
            if !self.headers.contains(&header) {
                // At most the three kinds: never full.
                let _ = self.headers.try_push(header);
            }
        }
        self
    }

    /// The headers read, in order of precedence.
    pub fn headers(&self) -> &[ProxyHeader] {
        &self.headers
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.networks.iter().any(|net| net.contains(&ip))
    }
}

impl std::str::FromStr for TrustedProxies {
    type Err = ipnet::AddrParseError;

    /// A comma-separated list of CIDR networks or single addresses.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(|part| {
                part.parse::<IpNet>()
                    .or_else(|e| part.parse::<IpAddr>().map(IpNet::from).map_err(|_| e))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self::new)
    }
}

/// How many leading bits of a client's address its limits are keyed by:
/// IPv4 addresses in full by default (`/32`), IPv6 addresses by their `/64`
/// network, since one host or subscriber commonly holds a whole `/64` and
/// could otherwise pick a fresh address (and a fresh quota) per request.
///
/// Set it for [`ClientIp`] in the request's extensions (e.g. as an axum
/// `Extension`, like [`TrustedProxies`]), or per key of the tower layer
/// (`ratewall::tower::KeyFrom::client_network`, feature `tower`).
///
/// ```
/// use ratewall::http::IpPrefix;
/// use std::net::IpAddr;
/// let ip: IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
/// assert_eq!(IpPrefix::default().key(ip).to_string(), "2001:db8:1:2::/64");
/// assert_eq!(IpPrefix::V6_48.key(ip).to_string(), "2001:db8:1::/48");
/// assert_eq!(IpPrefix::FULL.key(ip).to_string(), "2001:db8:1:2:3:4:5:6");
/// let v4: IpAddr = "192.0.2.77".parse().unwrap();
/// assert_eq!(IpPrefix::default().key(v4).to_string(), "192.0.2.77");
/// assert_eq!(IpPrefix::new(24, 64)?.key(v4).to_string(), "192.0.2.0/24");
/// assert_eq!("v4=24, v6=56".parse::<IpPrefix>()?, IpPrefix::new(24, 56)?);
/// assert!(IpPrefix::new(32, 129).is_err());
/// # Ok::<(), ratewall::http::IpPrefixError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    v4: u8,
    v6: u8,
}

/// An IPv4 or IPv6 prefix length out of range, or an unreadable
/// [`IpPrefix`] text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IpPrefixError {
    /// An IPv4 prefix must be 1 to 32 bits.
    #[error("IPv4 prefix /{0} is out of range: give 1 to 32 (32 keys each address)")]
    V4(u8),
    /// An IPv6 prefix must be 1 to 128 bits.
    #[error(
        "IPv6 prefix /{0} is out of range: give 1 to 128 (64, the default, keys each /64 network)"
    )]
    V6(u8),
    /// The text is not `v4=N`, `v6=N` or both, comma-separated.
    #[error("cannot read IP prefixes `{0}`: expected e.g. `v6=64` or `v4=24, v6=48`")]
    Syntax(String),
}

impl IpPrefix {
    /// IPv4 addresses in full, IPv6 addresses by their `/64` (the default).
    pub const DEFAULT: Self = Self { v4: 32, v6: 64 };
    /// Every address in full (`/32`, `/128`): one host holding a `/64` gets
    /// 2^64 quotas.
    pub const FULL: Self = Self { v4: 32, v6: 128 };
    /// IPv4 in full, IPv6 by `/56` (a common home-subscriber delegation).
    pub const V6_56: Self = Self { v4: 32, v6: 56 };
    /// IPv4 in full, IPv6 by `/48` (a common site delegation): the outer
    /// level of hierarchical per-IP limits.
    pub const V6_48: Self = Self { v4: 32, v6: 48 };

    /// Keys IPv4 addresses by their first `v4` bits and IPv6 addresses by
    /// their first `v6` bits.
    ///
    /// # Errors
    /// [`IpPrefixError::V4`] for a `v4` of 0 or above 32, and
    /// [`IpPrefixError::V6`] for a `v6` of 0 or above 128.
    pub const fn new(v4: u8, v6: u8) -> Result<Self, IpPrefixError> {
        if v4 == 0 || v4 > 32 {
            return Err(IpPrefixError::V4(v4));
        }
        if v6 == 0 || v6 > 128 {
            return Err(IpPrefixError::V6(v6));
        }
        Ok(Self { v4, v6 })
    }

    /// The IPv4 prefix length.
    pub const fn v4(self) -> u8 {
        self.v4
    }

    /// The IPv6 prefix length.
    pub const fn v6(self) -> u8 {
        self.v6
    }

    /// The key of `ip` (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn key(self, ip: IpAddr) -> IpKey {
        match ip.to_canonical() {
            IpAddr::V4(ip) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.v4)).unwrap_or(0);
                IpKey {
                    network: IpAddr::V4((u32::from(ip) & mask).into()),
                    len: self.v4,
                }
            }
            IpAddr::V6(ip) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.v6)).unwrap_or(0);
                IpKey {
                    network: IpAddr::V6((u128::from(ip) & mask).into()),
                    len: self.v6,
                }
            }
        }
    }
}

impl Default for IpPrefix {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::str::FromStr for IpPrefix {
    type Err = IpPrefixError;

    /// `v4=N`, `v6=N` or both, comma-separated; an omitted family keeps its
    /// default (IPv4 `/32`, IPv6 `/64`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || IpPrefixError::Syntax(s.to_owned());
        let (mut v4, mut v6) = (Self::DEFAULT.v4, Self::DEFAULT.v6);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (family, len) = part.split_once('=').ok_or_else(syntax)?;
            let len = len.trim().trim_start_matches('/');
            let len: u8 = len.parse().map_err(|_| syntax())?;
            match family.trim() {
                "v4" => v4 = len,
                "v6" => v6 = len,
                _ => return Err(syntax()),
            }
        }
        Self::new(v4, v6)
    }
}

/// The network a client is keyed by: its address masked to an
/// [`IpPrefix`]. `Display` renders the address alone for a full-length
/// prefix (`192.0.2.7`, as keys always were) and `network/len` otherwise
/// (`2001:db8:1:2::/64`); either form identifies one network, so keys stay
/// injective (and are escaped by the limiter like any identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpKey {
    network: IpAddr,
    len: u8,
}

impl IpKey {
    /// The network's first address.
    pub const fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether `ip` belongs to this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let prefix = match self.network {
            IpAddr::V4(_) => IpPrefix {
                v4: self.len,
                v6: 128,
            },
            IpAddr::V6(_) => IpPrefix {
                v4: 32,
                v6: self.len,
            },
        };
        prefix.key(ip) == *self
    }
}

impl IpKey {
    /// The key's text, on the stack; IPv4 without `core::fmt` (the layer's
    /// hot path).
    pub(crate) fn render(&self) -> ArrayString<{ IpKey::MAX_LEN }> {
        use std::fmt::Write as _;
        let mut out = ArrayString::new();
        let full = match self.network {
            IpAddr::V4(ip) => {
                crate::model::key::push_ipv4(&mut out, ip);
                32
            }
            IpAddr::V6(ip) => {
                let _ = write!(out, "{ip}");
                128
            }
        };
        if self.len != full {
            out.push('/');
            out.push_str(itoa::Buffer::new().format(self.len));
        }
        out
    }

    /// The longest text: a full IPv6 address and `/127`.
    pub(crate) const MAX_LEN: usize = 48;
}

impl std::fmt::Display for IpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// The client's IP address: the socket peer, or, when the peer is a
/// [`TrustedProxies`] member, the right-most hop that is not itself a
/// trusted proxy in the header its proxies set (`X-Forwarded-For` by
/// default; `Forwarded` or `X-Real-IP` by [`ProxyHeader`]). Entries
/// left of the client's hop (what a client may write itself) are ignored. As an axum extractor (feature `axum`) it needs the peer
/// address: `into_make_service_with_connect_info::<SocketAddr>()`, or a
/// [`PeerAddr`] extension.
///
/// As a rate-limit key (`#[rate_limit(key = ip)]`), it is its network under
/// its [`IpPrefix`] (`Display` renders [`ClientIp::key`]): an IPv4 address
/// in full, an IPv6 address by its `/64` unless an `IpPrefix` extension says
/// otherwise. [`ClientIp::ip`] is the address itself (e.g. for logs).
///
/// Hierarchical per-IP limits, each `/64` and each `/48`, decided together:
///
/// ```
/// use ratewall::http::{ClientIp, IpPrefix};
/// use ratewall::{Limiter, Rejection, rate_limit};
///
/// #[rate_limit(name = "api_net", key = ip, limits = ["5/1m"],
///              also(name = "api_site", key = ip.network(IpPrefix::V6_48), limits = ["8/1m"]))]
/// async fn api(ip: ClientIp) -> Result<(), Rejection> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// Limiter::builder().memory().install().unwrap();
/// let host = |net: u16, i: u16| ClientIp::new(std::net::Ipv6Addr::new(0x2001, 0xdb8, 7, net, 0, 0, 0, i).into());
/// for i in 0..5 {
///     assert!(api(host(1, i)).await.is_ok()); // five addresses of one /64
/// }
/// assert_eq!(api(host(1, 99)).await.unwrap_err().name(), "api_net"); // its /64 is spent
/// for i in 0..3 {
///     assert!(api(host(2, i)).await.is_ok()); // another /64 of the same /48
/// }
/// assert_eq!(api(host(3, 0)).await.unwrap_err().name(), "api_site"); // the /48 is spent
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp {
    ip: IpAddr,
    prefix: IpPrefix,
}

impl std::fmt::Display for ClientIp {
    /// The key: [`ClientIp::key`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.key().fmt(f)
    }
}

impl From<IpAddr> for ClientIp {
    fn from(ip: IpAddr) -> Self {
        Self::new(ip)
    }
}

impl ClientIp {
    /// The client at `ip` (IPv4-mapped IPv6 addresses count as IPv4), keyed
    /// under the default [`IpPrefix`].
    pub fn new(ip: IpAddr) -> Self {
        Self {
            ip: ip.to_canonical(),
            prefix: IpPrefix::DEFAULT,
        }
    }

    /// The client's address.
    pub const fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The prefix the client is keyed by.
    pub const fn prefix(&self) -> IpPrefix {
        self.prefix
    }

    /// The same client, keyed by `prefix`.
    pub const fn with_prefix(mut self, prefix: IpPrefix) -> Self {
        self.prefix = prefix;
        self
    }

    /// The client's rate-limit key: its network under its prefix.
    pub fn key(&self) -> IpKey {
        self.prefix.key(self.ip)
    }

    /// The client's network under another prefix, e.g. [`IpPrefix::V6_48`]
    /// for a second, wider per-IP limit.
    pub fn network(&self, prefix: IpPrefix) -> IpKey {
        prefix.key(self.ip)
    }

    /// Resolves the client from the peer address, the headers and the
    /// trusted proxies (keyed under the default [`IpPrefix`]): the peer,
    /// unless it is a trusted proxy, then the right-most hop that is not
    /// one in the first of [`TrustedProxies::headers`] present.
    pub fn resolve(peer: IpAddr, headers: &HeaderMap, trusted: Option<&TrustedProxies>) -> Self {
        Self::new(resolve_ip(peer, headers, trusted))
    }
}

/// [`ClientIp::resolve`] over any header map.
#[inline]
pub(crate) fn resolve_ip(
    peer: IpAddr,
    headers: &impl HeaderLines,
    trusted: Option<&TrustedProxies>,
) -> IpAddr {
    let peer = peer.to_canonical();
    match trusted {
        Some(trusted) if trusted.contains(peer) => behind_proxy(peer, headers, trusted),
        _ => peer,
    }
}

/// The client of a request from trusted proxy `peer`.
#[inline(never)]
fn behind_proxy(peer: IpAddr, headers: &impl HeaderLines, trusted: &TrustedProxies) -> IpAddr {
    forwarded::client_behind(peer, headers, trusted).to_canonical()
}

/// The client of a request (feature `axum`); `500` when the server gives
/// no peer address.
#[cfg(feature = "axum")]
impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let peer = peer(&parts.extensions).ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "ClientIp needs the router served with into_make_service_with_connect_info::<SocketAddr>()",
        ))?;
        let client = Self::resolve(
            peer,
            &parts.headers,
            parts.extensions.get::<TrustedProxies>(),
        );
        Ok(match parts.extensions.get::<IpPrefix>() {
            Some(prefix) => client.with_prefix(*prefix),
            None => client,
        })
    }
}

/// What a successful response says of the call's binding limit.
impl crate::limiter::call::Permit<'_> {
    /// Adds `RateLimit-Policy` and `RateLimit` for the binding limit to a
    /// successful response (feature `axum` or `tower`).
    pub fn add_headers<R: WithHeaders>(&self, response: &mut R) {
        if let (Some((name, decision, limit)), Some(headers)) =
            (self.binding(), response.headers_mut())
        {
            insert_rate_limit_headers(headers, name, &decision, &limit);
        }
    }
}

#[cfg(test)]
mod tests;
