//! HTTP integration (feature `axum`): the `429` response and the client's IP.
//!
//! A [`Rejection`] converts into `429 Too Many Requests` with
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

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ipnet::IpNet;

use crate::model::decision::Decision;
use crate::model::limit::Limit;
use crate::model::rejection::{Rejection, RejectionReason};

/// The `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Adds `RateLimit-Policy` and `RateLimit` for one limit's decision, e.g. to
/// an allowed response.
///
/// ```
/// use rl_core::{Decision, Figures, Limit, http::insert_rate_limit_headers};
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
    let name = sf_string(name);
    let window = limit.period().as_micros().div_ceil(1_000_000);
    let policy = format!("{name};q={};w={window}", decision.limit);
    let current = format!(
        "{name};r={};t={}",
        decision.remaining,
        decision.reset_after_secs()
    );
    if let (Ok(policy), Ok(current)) = (
        HeaderValue::from_str(&policy),
        HeaderValue::from_str(&current),
    ) {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, current);
    }
}

/// A structured-field string: printable ASCII, `"` and `\` escaped; other
/// characters replaced by `_`.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
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

fn json(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self.reason() {
            RejectionReason::Limited { decision, limit } => {
                let retry_ms = decision.retry_after.as_micros().div_ceil(1_000) as u64;
                let mut response = json(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(r#"{{"error":"rate_limited","retry_after_ms":{retry_ms}}}"#),
                );
                let headers = response.headers_mut();
                headers.insert(
                    RETRY_AFTER,
                    HeaderValue::from(decision.retry_after_secs().max(1)),
                );
                insert_rate_limit_headers(headers, self.name(), decision, limit);
                response
            }
            RejectionReason::Denied { .. } => {
                let mut response = json(StatusCode::FORBIDDEN, r#"{"error":"denied"}"#.to_owned());
                if let Some(wait) = self.retry_after() {
                    let secs = wait.as_micros().div_ceil(1_000_000) as u64;
                    response
                        .headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
                }
                response
            }
            RejectionReason::Unavailable(_) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":"rate_limiter_unavailable"}"#.to_owned(),
            ),
        }
    }
}

/// Proxies whose `X-Forwarded-For` is believed. Add it as an axum
/// `Extension`; without it [`ClientIp`] uses the socket's address only.
///
/// ```
/// use rl_core::http::TrustedProxies;
/// let proxies: TrustedProxies = "10.0.0.0/8, 127.0.0.1/32".parse().unwrap();
/// assert!(proxies.contains("10.1.2.3".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
/// ```
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<[IpNet]>);

impl TrustedProxies {
    /// Trusts the given networks.
    pub fn new(networks: impl IntoIterator<Item = IpNet>) -> Self {
        Self(networks.into_iter().collect())
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
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

/// The client's IP address: the socket peer, or, when the peer is a
/// [`TrustedProxies`] member, the right-most `X-Forwarded-For` entry that is
/// not itself a trusted proxy. Spoofed entries left of a trusted hop are
/// ignored. Needs `into_make_service_with_connect_info::<SocketAddr>()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp(pub IpAddr);

impl std::fmt::Display for ClientIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl ClientIp {
    /// Resolves the client from the peer address, the headers and the trusted proxies.
    pub fn resolve(peer: IpAddr, headers: &HeaderMap, trusted: Option<&TrustedProxies>) -> Self {
        let peer = peer.to_canonical();
        let Some(trusted) = trusted.filter(|t| t.contains(peer)) else {
            return Self(peer);
        };
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) if trusted.contains(ip) => continue,
                Ok(ip) => return Self(ip.to_canonical()),
                // An unparsable hop: stop believing the chain here.
                Err(_) => break,
            }
        }
        Self(peer)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()).ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "ClientIp needs the router served with into_make_service_with_connect_info::<SocketAddr>()",
        ))?;
        Ok(Self::resolve(
            peer,
            &parts.headers,
            parts.extensions.get::<TrustedProxies>(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limited(retry_us: u64) -> Rejection {
        let decision = Decision::new(crate::model::decision::Figures {
            allowed: false,
            limit: 5,
            retry_after_us: retry_us,
            reset_after_us: 3_000_000_000,
            ..Default::default()
        });
        Rejection::limited("sms::send", decision, Limit::per_hour(5).unwrap())
    }

    #[tokio::test]
    async fn a_limited_rejection_is_a_429_with_retry_after_rounded_up_and_ietf_fields() {
        let response = limited(1_000_001).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let headers = response.headers().clone();
        assert_eq!(headers[RETRY_AFTER], "2");
        assert_eq!(headers["ratelimit-policy"], "\"sms::send\";q=5;w=3600");
        assert_eq!(headers["ratelimit"], "\"sms::send\";r=0;t=3000");
        assert_eq!(headers[CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(
            &body[..],
            br#"{"error":"rate_limited","retry_after_ms":1001}"#
        );
    }

    #[test]
    fn retry_after_is_never_zero_on_a_429() {
        assert_eq!(limited(1).into_response().headers()[RETRY_AFTER], "1");
        assert_eq!(
            limited(Duration::from_secs(60).as_micros() as u64)
                .into_response()
                .headers()[RETRY_AFTER],
            "60"
        );
    }

    #[test]
    fn an_unavailable_rejection_is_a_503() {
        let rejection = Rejection::unavailable("x", crate::Error::NotInstalled);
        assert_eq!(
            rejection.into_response().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn policy_names_are_valid_structured_field_strings() {
        assert_eq!(sf_string("a\"b\\c é"), r#""a\"b\\c _""#);
    }

    fn xff(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", value.parse().unwrap());
        headers
    }

    #[test]
    fn forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy() {
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(ClientIp::resolve(peer, &xff("1.2.3.4"), None).0, peer);
        let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        assert_eq!(
            ClientIp::resolve(peer, &xff("1.2.3.4"), Some(&trusted)).0,
            peer
        );
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client_and_spoofed_hops_are_skipped() {
        let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let proxy: IpAddr = "10.0.0.2".parse().unwrap();
        let client = ClientIp::resolve(
            proxy,
            &xff("6.6.6.6, 198.51.100.7, 10.0.0.1"),
            Some(&trusted),
        );
        assert_eq!(client.0, "198.51.100.7".parse::<IpAddr>().unwrap());
        let garbage = ClientIp::resolve(proxy, &xff("nonsense"), Some(&trusted));
        assert_eq!(garbage.0, proxy);
    }
}
