//! What a route limit answers instead of calling the service: a
//! [`Refusal`] (a rejection, or a request without a key), said by default
//! as the crate says a [`Rejection`] over HTTP or gRPC, or by the
//! application's own hook
//! ([`on_refusal`](super::RateLimitLayerBuilder::on_refusal),
//! [`on_grpc_refusal`](super::RateLimitLayerBuilder::on_grpc_refusal)).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::head::Line;
use super::key::Problem;
use crate::http::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
    rejection_response,
};
use crate::model::decision::Decision;
use crate::model::rejection::{Rejection, RejectionReason};
use crate::refusal::{self, GRPC_RETRY_PUSHBACK_MS, Wire};

/// gRPC `INVALID_ARGUMENT`.
const GRPC_INVALID_ARGUMENT: u8 = 3;
/// gRPC `INTERNAL`.
const GRPC_INTERNAL: u8 = 13;

/// Why a route limit answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalKind {
    /// Over a rate limit, or no slot of a concurrency limit
    /// ([`Rejection::is_in_flight`] tells): `429` by default.
    Limited,
    /// The identity is on a deny list: `403` by default.
    Denied,
    /// The limiter could not decide and fails closed, or no limiter is
    /// installed: `503` by default.
    Unavailable,
    /// The request lacks its key (a header absent, empty or not UTF-8, a
    /// key function's `None`): `400` by default.
    MissingKey,
    /// The server lacks what a key needs (no peer address, no extension, no
    /// path parameter before routing): `500` by default, and an error log.
    Misconfigured,
}

/// A request a route limit answers itself, as a response hook sees it:
/// why ([`kind`](Refusal::kind), the [`Rejection`] with its
/// [`Decision`]), the request's method and path, and the parts of the
/// default answer ([`status`](Refusal::status),
/// [`headers`](Refusal::headers), [`code`](Refusal::code),
/// [`message`](Refusal::message)) so that a body of your own keeps the
/// standard fields.
pub struct Refusal<'a> {
    rejection: Option<&'a Rejection>,
    problem: Option<&'a Problem>,
    line: &'a dyn Line,
    legacy: bool,
}

impl fmt::Debug for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal")
            .field("kind", &self.kind())
            .field("code", &self.code())
            .field("method", &self.method())
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

impl<'a> Refusal<'a> {
    /// A refusal of the request `line` for `rejection`.
    pub(crate) fn rejected(rejection: &'a Rejection, line: &'a dyn Line, legacy: bool) -> Self {
        Self {
            rejection: Some(rejection),
            problem: None,
            line,
            legacy,
        }
    }

    /// A refusal of the request `line`, which has no key.
    pub(crate) fn keyless(problem: &'a Problem, line: &'a dyn Line, legacy: bool) -> Self {
        Self {
            rejection: None,
            problem: Some(problem),
            line,
            legacy,
        }
    }

    /// Why the request is refused.
    pub fn kind(&self) -> RefusalKind {
        match (self.rejection, self.problem) {
            (Some(rejection), _) => match rejection.reason() {
                RejectionReason::Limited { .. } => RefusalKind::Limited,
                RejectionReason::Denied { .. } => RefusalKind::Denied,
                RejectionReason::Unavailable(_) => RefusalKind::Unavailable,
            },
            (None, Some(problem)) if problem.server => RefusalKind::Misconfigured,
            (None, _) => RefusalKind::MissingKey,
        }
    }

    /// The limiter's rejection (its name, reason, decision and
    /// `retry_after`); `None` for a request without a key.
    pub fn rejection(&self) -> Option<&'a Rejection> {
        self.rejection
    }

    /// The refusing limit's decision (`limit`, `remaining`, `retry_after`,
    /// `reset_after`), when over a limit.
    pub fn decision(&self) -> Option<&'a Decision> {
        self.rejection?.decision()
    }

    /// How long to wait before trying again, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.rejection?.retry_after()
    }

    /// The default answer's error code: `rate_limited`,
    /// `too_many_in_flight`, `denied`, `rate_limiter_unavailable`,
    /// `rate_limit_key_missing`, `rate_limit_key_invalid` or
    /// `rate_limit_misconfigured`.
    pub fn code(&self) -> &'static str {
        match (self.rejection, self.problem) {
            (Some(rejection), _) => match rejection.reason() {
                RejectionReason::Limited { limit, .. } if limit.is_in_flight() => {
                    "too_many_in_flight"
                }
                RejectionReason::Limited { .. } => "rate_limited",
                RejectionReason::Denied { .. } => "denied",
                RejectionReason::Unavailable(_) => "rate_limiter_unavailable",
            },
            (None, Some(problem)) => problem.code,
            (None, None) => "rate_limit_key_missing",
        }
    }

    /// What happened, for a person: the rejection's message (``rate
    /// limited by `api`: retry after 2.5s``) or what key is missing
    /// (``missing header `x-api-key` ``).
    pub fn message(&self) -> String {
        match (self.rejection, self.problem) {
            (Some(rejection), _) => rejection.to_string(),
            (None, Some(problem)) => problem.message.clone(),
            (None, None) => String::new(),
        }
    }

    /// The default answer's HTTP status: `429`, `403`, `503`, `400` or
    /// `500` (see [`RefusalKind`]).
    pub fn status(&self) -> StatusCode {
        let code = match (self.rejection, self.problem) {
            (Some(rejection), _) => Wire::of(rejection).status,
            (None, Some(problem)) if problem.server => 500,
            (None, _) => 400,
        };
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The refused request's method (`GET`).
    pub fn method(&self) -> &str {
        self.line.method()
    }

    /// The refused request's path, without the query (an RFC 9457
    /// `instance`).
    pub fn path(&self) -> &str {
        self.line.path()
    }

    /// Whether the refused request is a gRPC call (`content-type:
    /// application/grpc*`).
    pub fn is_grpc(&self) -> bool {
        self.line.is_grpc()
    }

    /// The default answer's header fields, for a response of your own to
    /// keep: `Retry-After` (whole seconds, rounded up), `RateLimit-Policy`
    /// and `RateLimit` (over a rate limit) and, with
    /// [`legacy_headers`](super::RateLimitLayerBuilder::legacy_headers),
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`. Not the
    /// `Content-Type`, which is the body's.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(rejection) = self.rejection {
            let wire = Wire::of(rejection);
            if let Some(secs) = wire.retry_after_secs {
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            }
            insert_fields(&mut headers, wire.fields);
            self.insert_legacy(&mut headers);
        }
        headers
    }

    /// The default HTTP answer: the [`Rejection`]'s response (`429` with
    /// `Retry-After`, the `RateLimit` fields and
    /// `{"error":"rate_limited","retry_after_ms":N}`, ...; and the legacy
    /// headers when on) or, without a key, `400`/`500` with
    /// `{"error":CODE,"message":...}`.
    pub fn default_response(&self) -> Response<Bytes> {
        match (self.rejection, self.problem) {
            (Some(rejection), _) => {
                let mut response: Response<Bytes> = rejection_response(rejection);
                self.insert_legacy(response.headers_mut());
                response
            }
            (None, problem) => {
                let (code, message) = problem.map_or(("rate_limit_key_missing", ""), |p| {
                    (p.code, p.message.as_str())
                });
                let mut body = String::with_capacity(message.len() + 48);
                body.push_str(r#"{"error":""#);
                body.push_str(code);
                body.push_str(r#"","message":""#);
                refusal::push_json_str(&mut body, message);
                body.push_str(r#""}"#);
                let mut response = Response::new(Bytes::from(body));
                *response.status_mut() = self.status();
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
        }
    }

    /// The default gRPC answer: a trailers-only response (HTTP `200`) with
    /// `grpc-status` `RESOURCE_EXHAUSTED` (`8`), `PERMISSION_DENIED` (`7`)
    /// or `UNAVAILABLE` (`14`) and `grpc-retry-pushback-ms` and the
    /// `RateLimit` fields as for HTTP; `INVALID_ARGUMENT` (`3`) or
    /// `INTERNAL` (`13`) without a key.
    pub fn default_grpc_response(&self) -> Response<Bytes> {
        let Some(rejection) = self.rejection else {
            let server = self.problem.is_some_and(|p| p.server);
            let code = if server {
                GRPC_INTERNAL
            } else {
                GRPC_INVALID_ARGUMENT
            };
            return grpc_status(code, &self.message());
        };
        let wire = Wire::of(rejection);
        let mut response = grpc_status(wire.grpc_code, &rejection.to_string());
        let headers = response.headers_mut();
        if let Some(ms) = wire.retry_after_ms {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        }
        insert_fields(headers, wire.fields);
        response
    }

    /// Adds `X-RateLimit-*` for the refusing limit, when on and over a
    /// rate limit (a concurrency limit has no quota over a window).
    fn insert_legacy(&self, headers: &mut HeaderMap) {
        if !self.legacy {
            return;
        }
        if let Some(rejection) = self.rejection
            && let RejectionReason::Limited { decision, limit } = rejection.reason()
            && !limit.is_in_flight()
        {
            insert_legacy(headers, decision);
        }
    }
}

/// Adds `X-RateLimit-Limit`, `-Remaining` and `-Reset` for `decision`.
pub(crate) fn insert_legacy(headers: &mut HeaderMap, decision: &Decision) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(decision.limit()));
    headers.insert(
        X_RATELIMIT_REMAINING,
        HeaderValue::from(decision.remaining()),
    );
    headers.insert(
        X_RATELIMIT_RESET,
        HeaderValue::from(decision.reset_after_secs()),
    );
}

/// Adds `RateLimit-Policy` and `RateLimit`, when valid values.
fn insert_fields(headers: &mut HeaderMap, fields: Option<(String, String)>) {
    if let Some((policy, current)) = fields
        && let (Ok(policy), Ok(current)) = (
            HeaderValue::try_from(policy),
            HeaderValue::try_from(current),
        )
    {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, current);
    }
}

/// A trailers-only gRPC response: HTTP `200`, the status in the headers.
fn grpc_status(code: u8, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(message) = HeaderValue::try_from(refusal::grpc_message(message)) {
        headers.insert("grpc-message", message);
    }
    response
}

/// A response hook, its body made `Bytes`.
pub(crate) type Hook = Arc<dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync>;

/// The hooks of a layer: what refused requests get, over HTTP and gRPC.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    pub(crate) http: Option<Hook>,
    pub(crate) grpc: Option<Hook>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("http", &self.http.is_some())
            .field("grpc", &self.grpc.is_some())
            .finish()
    }
}

impl Hooks {
    /// The answer to `refusal`: its hook's, else the default (gRPC calls by
    /// the gRPC hook only).
    pub(crate) fn answer(&self, refusal: &Refusal<'_>) -> Response<Bytes> {
        if refusal.is_grpc() {
            match &self.grpc {
                Some(hook) => hook(refusal),
                None => refusal.default_grpc_response(),
            }
        } else {
            match &self.http {
                Some(hook) => hook(refusal),
                None => refusal.default_response(),
            }
        }
    }
}

/// What a gRPC refusal hook
/// ([`on_grpc_refusal`](super::RateLimitLayerBuilder::on_grpc_refusal))
/// returns: the gRPC response parts (an `http::Response`, trailers-only:
/// HTTP `200` with `grpc-status` and `grpc-message` in its headers) or,
/// with feature `tonic`, a `tonic::Status` (its code, message, details and
/// metadata).
pub trait GrpcReply: sealed::Sealed {
    /// The response.
    fn into_response(self) -> Response<Bytes>;
}

mod sealed {
    pub trait Sealed {}
    impl<B> Sealed for http::Response<B> {}
    #[cfg(feature = "tonic")]
    impl Sealed for tonic::Status {}
}

impl<B: Into<Bytes>> GrpcReply for Response<B> {
    fn into_response(self) -> Response<Bytes> {
        self.map(Into::into)
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl GrpcReply for tonic::Status {
    /// A trailers-only response with the status in its headers (as tonic
    /// writes one).
    fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::new());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        if self.add_header(headers).is_err() {
            // A message or details that cannot be a header: the code alone.
            headers.insert("grpc-status", HeaderValue::from(self.code() as i32));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::decision::Figures;
    use crate::model::limit::Limit;

    struct Get;

    impl Line for Get {
        fn method(&self) -> &str {
            "GET"
        }

        fn path(&self) -> &str {
            "/x"
        }

        fn is_grpc(&self) -> bool {
            false
        }
    }

    fn limited() -> Rejection {
        let decision = Decision::new(Figures {
            allowed: false,
            limit: 2,
            retry_after_us: 2_500_000,
            reset_after_us: 5_000_000,
            ..Figures::default()
        });
        Rejection::limited("api", decision, Limit::per_minute(2).unwrap())
    }

    #[test]
    fn a_refused_grpc_call_is_resource_exhausted_with_the_pushback() {
        let rejection = limited();
        let response = Refusal::rejected(&rejection, &Get, false).default_grpc_response();
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers[GRPC_RETRY_PUSHBACK_MS], "2500");
        assert_eq!(
            headers["grpc-message"],
            "rate limited by `api`: retry after 2.5s"
        );
        assert_eq!(headers[RATELIMIT], "\"api\";r=0;t=5");
        let down = Rejection::unavailable("api", crate::Error::NotInstalled);
        let unavailable = Refusal::rejected(&down, &Get, false).default_grpc_response();
        assert_eq!(unavailable.headers()["grpc-status"], "14");
    }

    #[test]
    fn a_request_without_a_key_gets_a_json_400_or_500_naming_it() {
        let problem = Problem {
            server: false,
            code: "rate_limit_key_missing",
            message: "missing header `x-api-key`".into(),
        };
        let refusal = Refusal::keyless(&problem, &Get, false);
        assert_eq!(refusal.kind(), RefusalKind::MissingKey);
        let response = refusal.default_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            &response.into_body()[..],
            br#"{"error":"rate_limit_key_missing","message":"missing header `x-api-key`"}"#
        );
        let server = Problem {
            server: true,
            ..problem
        };
        let refusal = Refusal::keyless(&server, &Get, false);
        assert_eq!(refusal.kind(), RefusalKind::Misconfigured);
        assert_eq!(refusal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            refusal.default_grpc_response().headers()["grpc-status"],
            "13"
        );
    }

    #[test]
    fn the_default_headers_are_the_default_answers_and_legacy_ones_on_demand() {
        let rejection = limited();
        let plain = Refusal::rejected(&rejection, &Get, false);
        assert_eq!(plain.kind(), RefusalKind::Limited);
        assert_eq!(
            (plain.code(), plain.status().as_u16()),
            ("rate_limited", 429)
        );
        let headers = plain.headers();
        assert_eq!(headers[RETRY_AFTER], "3");
        assert_eq!(headers[RATELIMIT_POLICY], "\"api\";q=2;w=60");
        assert!(headers.get(X_RATELIMIT_LIMIT).is_none());
        let default = plain.default_response();
        for (name, value) in &headers {
            assert_eq!(&default.headers()[name], value);
        }
        let legacy = Refusal::rejected(&rejection, &Get, true);
        let headers = legacy.headers();
        assert_eq!(headers[X_RATELIMIT_LIMIT], "2");
        assert_eq!(headers[X_RATELIMIT_REMAINING], "0");
        assert_eq!(headers[X_RATELIMIT_RESET], "5");
        assert_eq!(legacy.default_response().headers()[X_RATELIMIT_RESET], "5");
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn a_tonic_status_is_a_trailers_only_response() {
        let response = tonic::Status::resource_exhausted("slow down").into_response();
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(response.headers()["grpc-message"], "slow%20down");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
    }
}
