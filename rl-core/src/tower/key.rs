//! Where a request's keys come from ([`KeyFrom`]), and what a request
//! without one is answered.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::sync::Arc;

use arrayvec::ArrayString;
#[cfg(all(feature = "tower", feature = "axum"))]
use axum::extract::{FromRequestParts, RawPathParams};
use http::request::Parts;
use http::{Extensions, HeaderName};

use super::head::{Param, RequestHead};
use crate::http::{IpKey, IpPrefix, TrustedProxies};

/// Where one key of a [`RateLimitLayer`](super::RateLimitLayer) comes from.
///
/// | source | a request without it gets |
/// |---|---|
/// | [`KeyFrom::client_ip`], [`KeyFrom::client_network`] | `500`: the server gives no peer address (axum: serve with `into_make_service_with_connect_info::<SocketAddr>()`; tonic servers give it; others insert a [`PeerAddr`](crate::http::PeerAddr)) |
/// | [`KeyFrom::header`] | `400` when absent, empty or not UTF-8 |
/// | `KeyFrom::path_param` (feature `axum`) | `500` when the request has no such parameter (add the layer with `route_layer`), `400` when not UTF-8 |
/// | [`KeyFrom::extension`] | `500`: the layer that inserts it must run before this one |
/// | [`KeyFrom::from_fn`] | `400` when the function returns `None` |
///
/// unless the layer lets such requests through
/// ([`MissingKey::Allow`](super::MissingKey::Allow)). gRPC requests get
/// `INVALID_ARGUMENT` instead of `400` and `INTERNAL` instead of `500`.
#[derive(Clone)]
pub struct KeyFrom {
    pub(crate) source: Source,
}

/// The forms a key source takes (type-erased, so a layer holds any mix).
#[derive(Clone)]
pub(crate) enum Source {
    /// The client's network under this prefix, or the request's
    /// [`IpPrefix`] extension's (else the default) when `None`.
    ClientIp(Option<IpPrefix>),
    /// A header; an invalid name is reported by the layer's `build`.
    Header(Result<HeaderName, Box<str>>),
    /// A path parameter of the matched route (axum's router, actix-web's).
    #[cfg(any(feature = "axum", feature = "actix"))]
    PathParam(Box<str>),
    /// A value an earlier layer put in the request's extensions.
    Extension {
        get: ExtensionGetters,
        type_name: &'static str,
    },
    /// A function of the request.
    Fn(KeyFn),
}

/// Reads a typed extension as a `Display`, from each server's extensions.
#[derive(Clone, Copy)]
pub(crate) struct ExtensionGetters {
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "tower's requests only")
    )]
    pub(crate) http: fn(&Extensions) -> Option<&(dyn fmt::Display + Send + Sync)>,
    #[cfg(feature = "actix")]
    pub(crate) actix: fn(&actix_web::dev::Extensions) -> Option<&(dyn fmt::Display + Send + Sync)>,
}

/// A user's key function, rendering into a [`Text`]; `false`: no key.
pub(crate) type KeyFn = Arc<dyn Fn(&Parts, &mut Text) -> bool + Send + Sync>;

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFrom::")?;
        match &self.source {
            Source::ClientIp(None) => f.write_str("client_ip()"),
            Source::ClientIp(Some(prefix)) => write!(f, "client_network({prefix:?})"),
            Source::Header(Ok(name)) => write!(f, "header({:?})", name.as_str()),
            Source::Header(Err(name)) => write!(f, "header({name:?}) (invalid)"),
            #[cfg(any(feature = "axum", feature = "actix"))]
            Source::PathParam(name) => write!(f, "path_param({name:?})"),
            Source::Extension { type_name, .. } => write!(f, "extension::<{type_name}>()"),
            Source::Fn(_) => f.write_str("from_fn(..)"),
        }
    }
}

fn get_extension<T: fmt::Display + Send + Sync + 'static>(
    extensions: &Extensions,
) -> Option<&(dyn fmt::Display + Send + Sync)> {
    extensions
        .get::<T>()
        .map(|value| value as &(dyn fmt::Display + Send + Sync))
}

#[cfg(feature = "actix")]
fn get_actix_extension<T: fmt::Display + Send + Sync + 'static>(
    extensions: &actix_web::dev::Extensions,
) -> Option<&(dyn fmt::Display + Send + Sync)> {
    extensions
        .get::<T>()
        .map(|value| value as &(dyn fmt::Display + Send + Sync))
}

impl KeyFrom {
    /// The client's IP address, by the rules of [`ClientIp`](crate::http::ClientIp): the socket
    /// peer (axum's `ConnectInfo<SocketAddr>` with feature `axum`, a
    /// [`PeerAddr`](crate::http::PeerAddr) extension, or tonic's
    /// `TcpConnectInfo` with feature `tonic`), or the right-most untrusted `X-Forwarded-For`
    /// hop when the peer is a trusted proxy (the layer's
    /// [`trusted_proxies`](super::RateLimitLayerBuilder::trusted_proxies),
    /// else a [`TrustedProxies`] extension). Keyed by the request's
    /// [`IpPrefix`] extension, else the default: IPv4 in full, IPv6 by
    /// `/64`; the same key as `#[rate_limit(key = ip)]` with a [`ClientIp`](crate::http::ClientIp).
    pub fn client_ip() -> Self {
        Self {
            source: Source::ClientIp(None),
        }
    }

    /// The client's network under `prefix` (e.g. [`IpPrefix::V6_48`] for a
    /// second, wider per-IP limit beside [`KeyFrom::client_ip`]).
    pub fn client_network(prefix: IpPrefix) -> Self {
        Self {
            source: Source::ClientIp(Some(prefix)),
        }
    }

    /// The value of header `name` (its first line), which must be UTF-8 and
    /// not empty. An invalid name is reported by the layer's `build`.
    pub fn header(name: &str) -> Self {
        let name = HeaderName::try_from(name).map_err(|_| Box::from(name));
        Self {
            source: Source::Header(name),
        }
    }

    /// The path parameter `name` of the matched route (`/users/{name}`),
    /// percent-decoded. Needs the layer to run after routing: add it with
    /// axum's `route_layer` (`Router::layer` also wraps the fallback, where
    /// an unmatched request has no parameters and would get `500` instead of
    /// `404`; a layer around a whole router runs before routing and never
    /// sees any), or in actix-web with `wrap` on the resource or scope (its
    /// `match_info`). Reading it in axum copies the route's parameters (one
    /// allocation). Feature `axum` or `actix`: the parameters are those of
    /// their routers.
    #[cfg(any(feature = "axum", feature = "actix"))]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "axum", feature = "actix"))))]
    pub fn path_param(name: &str) -> Self {
        Self {
            source: Source::PathParam(name.into()),
        }
    }

    /// The `T` an earlier layer put in the request's extensions (e.g. the
    /// authenticated user), through its `Display`.
    pub fn extension<T: fmt::Display + Send + Sync + 'static>() -> Self {
        Self {
            source: Source::Extension {
                get: ExtensionGetters {
                    http: get_extension::<T>,
                    #[cfg(feature = "actix")]
                    actix: get_actix_extension::<T>,
                },
                type_name: std::any::type_name::<T>(),
            },
        }
    }

    /// Whatever `key` computes from the request's head, through its
    /// `Display`; `None`: the request has no key. Keys up to 64 bytes are
    /// rendered without allocating.
    ///
    /// ```
    /// use ratewall::tower::KeyFrom;
    /// // The tenant: the first label of the host name.
    /// let tenant = KeyFrom::from_fn(|parts| {
    ///     let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
    ///     host.split('.').next().map(str::to_owned)
    /// });
    /// # let _ = tenant;
    /// ```
    pub fn from_fn<D, F>(key: F) -> Self
    where
        D: fmt::Display,
        F: Fn(&Parts) -> Option<D> + Send + Sync + 'static,
    {
        let render = move |parts: &Parts, out: &mut Text| match key(parts) {
            Some(value) => {
                let _ = write!(out, "{value}");
                true
            }
            None => false,
        };
        Self {
            source: Source::Fn(Arc::new(render)),
        }
    }

    /// Whether the key is a function of the request's [`Parts`].
    pub(crate) fn is_fn(&self) -> bool {
        matches!(self.source, Source::Fn(_))
    }

    pub(crate) fn is_path_param(&self) -> bool {
        #[cfg(any(feature = "axum", feature = "actix"))]
        {
            matches!(self.source, Source::PathParam(_))
        }
        #[cfg(not(any(feature = "axum", feature = "actix")))]
        {
            false
        }
    }
}

/// A key rendered in place: inline up to 64 bytes, else on the heap.
#[derive(Debug, Default)]
pub(crate) struct Text {
    inline: ArrayString<64>,
    spilled: Option<String>,
}

impl Text {
    fn as_str(&self) -> &str {
        self.spilled.as_deref().unwrap_or(&self.inline)
    }
}

impl fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if let Some(spilled) = &mut self.spilled {
            spilled.push_str(s);
        } else if self.inline.try_push_str(s).is_err() {
            let mut spilled = String::with_capacity(self.inline.len() + s.len() + 32);
            spilled.push_str(&self.inline);
            spilled.push_str(s);
            self.spilled = Some(spilled);
        }
        Ok(())
    }
}

/// One key of one request, borrowed from it where possible.
pub(crate) enum Extracted<'p> {
    /// A client keyed by its whole IPv4 address: the limiter takes the
    /// address as is (no rendering).
    Address(IpAddr),
    /// A client keyed by a network (or an IPv6 address), rendered.
    Ip(ArrayString<{ IpKey::MAX_LEN }>),
    Text(&'p str),
    Display(&'p (dyn fmt::Display + Send + Sync)),
    Rendered(Text),
}

impl fmt::Display for Extracted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Extracted::Address(ip) => ip.fmt(f),
            Extracted::Ip(key) => f.write_str(key),
            Extracted::Text(text) => f.write_str(text),
            Extracted::Display(value) => value.fmt(f),
            Extracted::Rendered(text) => f.write_str(text.as_str()),
        }
    }
}

impl Extracted<'_> {
    /// The key as the limiter takes it: text as is (escaped and keyed by
    /// the limiter exactly as its `Display` form), without `core::fmt`.
    pub(crate) fn part(&self) -> crate::model::key::Part<'_> {
        use crate::model::key::Part;
        match self {
            Extracted::Address(ip) => Part::Ip(*ip),
            Extracted::Ip(key) => Part::Text(key),
            Extracted::Text(text) => Part::Text(text),
            Extracted::Display(value) => Part::Display(*value),
            Extracted::Rendered(text) => Part::Text(text.as_str()),
        }
    }
}

/// The keys of one request (two inline).
pub(crate) type Keys<'p> = smallvec::SmallVec<[Extracted<'p>; 2]>;

/// The path parameters of a request, read once when a key needs them.
#[cfg(all(feature = "tower", feature = "axum"))]
pub(crate) type PathParams =
    Option<Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>>;

/// Without axum's router there are no path parameters to read.
#[cfg(all(feature = "tower", not(feature = "axum")))]
pub(crate) type PathParams = Option<std::convert::Infallible>;

/// A parameter of the path parameters read (axum's).
#[cfg(all(feature = "tower", feature = "axum"))]
pub(crate) fn axum_param<'p>(params: &'p PathParams, name: &str) -> Param<'p> {
    match params {
        Some(Ok(params)) => params
            .iter()
            .find(|(param, _)| *param == name)
            .map_or(Param::Missing, |(_, value)| Param::Found(value)),
        Some(Err(axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(_))) => {
            Param::NotUtf8
        }
        _ => Param::Missing,
    }
}

/// Without axum's router there are no path parameters.
#[cfg(all(feature = "tower", not(feature = "axum")))]
#[cfg_attr(
    not(any(feature = "axum", feature = "actix")),
    allow(
        dead_code,
        reason = "path parameters come from axum's or actix-web's router"
    )
)]
pub(crate) fn axum_param<'p>(_params: &'p PathParams, _name: &str) -> Param<'p> {
    Param::Missing
}

/// Reads the route's path parameters (axum's extractor completes at once).
#[cfg(all(feature = "tower", feature = "axum"))]
pub(crate) fn path_params(parts: &mut Parts) -> PathParams {
    use std::task::{Context, Poll, Waker};
    let future = std::pin::pin!(RawPathParams::from_request_parts(parts, &()));
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => Some(result),
        Poll::Pending => None,
    }
}

/// Without axum's router there are no path parameters to read.
#[cfg(all(feature = "tower", not(feature = "axum")))]
pub(crate) fn path_params(_parts: &mut Parts) -> PathParams {
    None
}

/// Why a request has no key, and what it is answered.
#[derive(Debug)]
pub(crate) struct Problem {
    /// The request lacks the key (`400`), or the server does (`500`).
    pub(crate) server: bool,
    /// `rate_limit_key_missing`, `rate_limit_key_invalid` or `rate_limit_misconfigured`.
    pub(crate) code: &'static str,
    /// For the client (and, for a server problem, the log).
    pub(crate) message: String,
}

impl Problem {
    fn client(code: &'static str, message: String) -> Self {
        Self {
            server: false,
            code,
            message,
        }
    }

    fn server(message: String) -> Self {
        Self {
            server: true,
            code: "rate_limit_misconfigured",
            message,
        }
    }
}

/// The request's client address, found once for all its keys.
#[derive(Default)]
pub(crate) struct Client(Option<Option<IpAddr>>);

impl Client {
    fn ip<'p>(
        &mut self,
        head: impl RequestHead<'p>,
        trusted: Option<&TrustedProxies>,
    ) -> Option<IpAddr> {
        *self.0.get_or_insert_with(|| head.client_address(trusted))
    }
}

/// Extracts the key of `source` (group `group`) from a request.
#[inline]
pub(crate) fn extract<'p>(
    source: &KeyFrom,
    group: &str,
    head: impl RequestHead<'p>,
    client: &mut Client,
    trusted: Option<&TrustedProxies>,
) -> Result<Extracted<'p>, Problem> {
    match &source.source {
        // The commonest key, inline.
        Source::ClientIp(prefix) => {
            let Some(ip) = client.ip(head, trusted) else {
                return Err(no_client_address());
            };
            Ok(client_ip(*prefix, head, ip))
        }
        _ => extract_other(source, group, head),
    }
}

/// The key of a request from client address `ip`: its network under
/// `prefix`, else under the request's [`IpPrefix`] extension, else the
/// default.
#[inline]
pub(crate) fn client_ip<'p>(
    prefix: Option<IpPrefix>,
    head: impl RequestHead<'p>,
    ip: IpAddr,
) -> Extracted<'static> {
    let prefix = prefix.or_else(|| head.ip_prefix()).unwrap_or_default();
    let key = prefix.key(ip);
    match key.network() {
        // Keyed as its `Display` form would be, without rendering.
        IpAddr::V4(_) if key.prefix_len() == 32 => Extracted::Address(key.network()),
        _ => Extracted::Ip(key.render()),
    }
}

/// Why a request from a server that gives no client address has no key.
#[cold]
pub(crate) fn no_client_address() -> Problem {
    Problem::server(
        "no client address for the rate limit: serve an axum router with \
         into_make_service_with_connect_info::<SocketAddr>(), or insert a \
         ratewall::http::PeerAddr into the request's extensions"
            .to_owned(),
    )
}

/// [`extract`] for every source but the client's address.
#[inline(never)]
fn extract_other<'p>(
    source: &KeyFrom,
    group: &str,
    head: impl RequestHead<'p>,
) -> Result<Extracted<'p>, Problem> {
    match &source.source {
        // Extracted by `extract` itself; never passed here.
        Source::ClientIp(_) => Err(no_client_address()),
        Source::Header(Ok(name)) => header(head.header(name), name).map(Extracted::Text),
        Source::Header(Err(name)) => Err(Problem::server(format!("invalid header name `{name}`"))),
        #[cfg(any(feature = "axum", feature = "actix"))]
        Source::PathParam(name) => match head.path_param(name) {
            Param::Found(value) => Ok(Extracted::Text(value)),
            Param::NotUtf8 => Err(Problem::client(
                "rate_limit_key_invalid",
                format!("path parameter `{name}` is not valid UTF-8"),
            )),
            Param::Missing => Err(no_path_param(name)),
        },
        Source::Extension { get, type_name } => match head.extension(get) {
            Some(value) => Ok(Extracted::Display(value)),
            None => Err(Problem::server(format!(
                "no `{type_name}` in the request's extensions for rate limit `{group}`: \
                 the layer that inserts it must run before the rate limit"
            ))),
        },
        Source::Fn(key) => {
            let Some(parts) = head.parts() else {
                return Err(Problem::server(format!(
                    "rate limit `{group}`: a key function was not given the request"
                )));
            };
            let mut text = Text::default();
            if key(parts, &mut text) {
                Ok(Extracted::Rendered(text))
            } else {
                Err(Problem::client(
                    "rate_limit_key_missing",
                    format!("the request has no key for rate limit `{group}`"),
                ))
            }
        }
    }
}

#[cfg(any(feature = "axum", feature = "actix"))]
fn no_path_param(name: &str) -> Problem {
    Problem::server(format!(
        "no path parameter `{name}` for the rate limit: add the layer after routing, to routes \
         that have `{{{name}}}` (axum: `route_layer`; actix-web: `wrap` on the resource)"
    ))
}

/// The first line `value` of header `name`: present, non-empty UTF-8.
fn header<'p>(value: Option<&'p [u8]>, name: &HeaderName) -> Result<&'p str, Problem> {
    let Some(value) = value else {
        return Err(Problem::client(
            "rate_limit_key_missing",
            format!("missing header `{name}`"),
        ));
    };
    match std::str::from_utf8(value) {
        Ok("") => Err(Problem::client(
            "rate_limit_key_missing",
            format!("empty header `{name}`"),
        )),
        Ok(text) => Ok(text),
        Err(_) => Err(Problem::client(
            "rate_limit_key_invalid",
            format!("header `{name}` is not valid UTF-8"),
        )),
    }
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use super::super::head::HttpHead;
    use super::*;
    #[cfg(feature = "axum")]
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;

    fn parts(request: http::Request<()>) -> Parts {
        request.into_parts().0
    }

    #[test]
    fn long_keys_spill_to_the_heap_and_render_exactly() {
        let mut text = Text::default();
        let long = "k".repeat(100);
        write!(text, "{}", &long[..60]).unwrap();
        write!(text, "{}", &long[60..]).unwrap();
        assert_eq!(text.as_str(), long);
    }

    #[test]
    fn a_missing_empty_or_binary_header_is_a_client_problem() {
        let name = HeaderName::from_static("x-api-key");
        let mut headers = http::HeaderMap::new();
        assert_eq!(
            header(headers.get(&name).map(|v| v.as_bytes()), &name)
                .unwrap_err()
                .code,
            "rate_limit_key_missing"
        );
        headers.insert(&name, "".parse().unwrap());
        assert!(
            header(headers.get(&name).map(|v| v.as_bytes()), &name)
                .unwrap_err()
                .message
                .contains("empty")
        );
        headers.insert(&name, http::HeaderValue::from_bytes(b"\xff").unwrap());
        let invalid = header(headers.get(&name).map(|v| v.as_bytes()), &name).unwrap_err();
        assert_eq!(
            (invalid.code, invalid.server),
            ("rate_limit_key_invalid", false)
        );
        headers.insert(
            &name,
            http::HeaderValue::from_bytes("clé".as_bytes()).unwrap(),
        );
        assert_eq!(
            header(headers.get(&name).map(|v| v.as_bytes()), &name).unwrap(),
            "clé"
        );
    }

    #[test]
    fn the_client_ip_is_read_from_a_peer_addr_extension() {
        let mut request = http::Request::new(());
        let peer: SocketAddr = "198.51.100.7:4000".parse().unwrap();
        request.extensions_mut().insert(crate::http::PeerAddr(peer));
        let parts = parts(request);
        let key = extract(
            &KeyFrom::client_ip(),
            "g",
            HttpHead::of_parts(&parts, &None),
            &mut Client::default(),
            None,
        );
        assert_eq!(key.unwrap().to_string(), "198.51.100.7");
        let no_peer = parts_without_peer();
        let problem = extract(
            &KeyFrom::client_ip(),
            "g",
            HttpHead::of_parts(&no_peer, &None),
            &mut Client::default(),
            None,
        )
        .err()
        .unwrap();
        assert!(problem.server && problem.message.contains("PeerAddr"));
    }

    fn parts_without_peer() -> Parts {
        parts(http::Request::new(()))
    }

    #[cfg(feature = "axum")]
    #[test]
    fn the_client_ip_needs_a_peer_and_uses_the_request_prefix() {
        let no_peer = parts(http::Request::new(()));
        let problem = extract(
            &KeyFrom::client_ip(),
            "g",
            HttpHead::of_parts(&no_peer, &None),
            &mut Client::default(),
            None,
        )
        .err()
        .unwrap();
        assert!(problem.server && problem.message.contains("connect_info"));

        let mut request = http::Request::new(());
        let peer: SocketAddr = "[2001:db8:1:2:3:4:5:6]:443".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let with_peer = parts(request);
        let key = |from: &KeyFrom, parts: &Parts| {
            extract(
                from,
                "g",
                HttpHead::of_parts(parts, &None),
                &mut Client::default(),
                None,
            )
            .unwrap()
            .to_string()
        };
        assert_eq!(key(&KeyFrom::client_ip(), &with_peer), "2001:db8:1:2::/64");
        assert_eq!(
            key(&KeyFrom::client_network(IpPrefix::V6_48), &with_peer),
            "2001:db8:1::/48"
        );
        let mut request = http::Request::new(());
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(IpPrefix::FULL);
        assert_eq!(
            key(&KeyFrom::client_ip(), &parts(request)),
            "2001:db8:1:2:3:4:5:6"
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn the_client_ip_follows_trusted_proxies_given_to_the_layer() {
        let mut request = http::Request::builder()
            .header("x-forwarded-for", "198.51.100.7")
            .body(())
            .unwrap();
        let proxy: SocketAddr = "10.0.0.2:5000".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(proxy));
        let parts = parts(request);
        let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let mut client = Client::default();
        let via = extract(
            &KeyFrom::client_ip(),
            "g",
            HttpHead::of_parts(&parts, &None),
            &mut client,
            Some(&trusted),
        );
        assert_eq!(via.unwrap().to_string(), "198.51.100.7");
        let direct = extract(
            &KeyFrom::client_ip(),
            "g",
            HttpHead::of_parts(&parts, &None),
            &mut Client::default(),
            None,
        );
        assert_eq!(direct.unwrap().to_string(), "10.0.0.2");
    }

    #[derive(Clone)]
    struct User(u64);

    impl fmt::Display for User {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "user-{}", self.0)
        }
    }

    #[test]
    fn extensions_and_functions_give_keys_through_display() {
        let mut request = http::Request::builder()
            .header("host", "acme.example.com")
            .body(())
            .unwrap();
        request.extensions_mut().insert(User(7));
        let parts = parts(request);
        let get = |from: &KeyFrom| {
            extract(
                from,
                "g",
                HttpHead::of_parts(&parts, &None),
                &mut Client::default(),
                None,
            )
            .map(|k| k.to_string())
        };
        assert_eq!(get(&KeyFrom::extension::<User>()).unwrap(), "user-7");
        let missing = get(&KeyFrom::extension::<u32>()).unwrap_err();
        assert!(missing.server && missing.message.contains("`u32`"));
        let tenant = KeyFrom::from_fn(|parts| {
            let host = parts.headers.get("host")?.to_str().ok()?;
            host.split('.').next().map(str::to_owned)
        });
        assert_eq!(get(&tenant).unwrap(), "acme");
        let none = get(&KeyFrom::from_fn(|_| None::<u8>)).unwrap_err();
        assert!(!none.server && none.message.contains("`g`"));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn a_path_param_needs_routing_first() {
        let mut parts = parts(http::Request::new(()));
        let params = path_params(&mut parts);
        let problem = extract(
            &KeyFrom::path_param("id"),
            "g",
            HttpHead::of_parts(&parts, &params),
            &mut Client::default(),
            None,
        )
        .err()
        .unwrap();
        assert!(problem.server && problem.message.contains("route_layer"));
    }
}
