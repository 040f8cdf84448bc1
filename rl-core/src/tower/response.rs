//! What the layer answers instead of calling the service: a refusal, or a
//! request without a key, over HTTP or as a gRPC status.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::key::Problem;
use crate::http::{RATELIMIT, RATELIMIT_POLICY, rejection_response};
use crate::model::rejection::Rejection;
use crate::refusal::{self, GRPC_RETRY_PUSHBACK_MS, Refusal};

/// gRPC `INVALID_ARGUMENT`.
const GRPC_INVALID_ARGUMENT: u8 = 3;
/// gRPC `INTERNAL`.
const GRPC_INTERNAL: u8 = 13;

/// Whether the request is a gRPC call (`content-type: application/grpc*`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The answer to a refused call: the `429` / `503` of
/// [`crate::http`] (axum's `IntoResponse for Rejection` gives the same), or
/// for gRPC a trailers-only response with `RESOURCE_EXHAUSTED` /
/// `UNAVAILABLE`, `grpc-retry-pushback-ms` and the `RateLimit` fields.
pub(crate) fn refused(rejection: Rejection, grpc: bool) -> Response<Bytes> {
    if !grpc {
        return rejection_response(&rejection);
    }
    let refusal = Refusal::of(&rejection);
    let mut response = grpc_status(refusal.grpc_code, &rejection.to_string());
    let headers = response.headers_mut();
    if let Some(ms) = refusal.retry_after_ms {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
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

/// The answer to a request without a key: `400` (the request lacks it) or
/// `500` (the server does), with `{"error":CODE,"message":...}`; for gRPC
/// `INVALID_ARGUMENT` or `INTERNAL`.
pub(crate) fn no_key(problem: &Problem, grpc: bool) -> Response<Bytes> {
    if grpc {
        let code = if problem.server {
            GRPC_INTERNAL
        } else {
            GRPC_INVALID_ARGUMENT
        };
        return grpc_status(code, &problem.message);
    }
    let status = if problem.server {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::BAD_REQUEST
    };
    let mut body = String::with_capacity(problem.message.len() + 48);
    body.push_str(r#"{"error":""#);
    body.push_str(problem.code);
    body.push_str(r#"","message":""#);
    refusal::push_json_str(&mut body, &problem.message);
    body.push_str(r#""}"#);
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::decision::{Decision, Figures};
    use crate::model::limit::Limit;

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let mut headers = HeaderMap::new();
        assert!(!is_grpc(&headers));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&headers));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_grpc(&headers));
    }

    #[test]
    fn a_refused_grpc_call_is_resource_exhausted_with_the_pushback() {
        let decision = Decision::new(Figures {
            allowed: false,
            limit: 2,
            retry_after_us: 2_500_000,
            reset_after_us: 5_000_000,
            ..Figures::default()
        });
        let rejection = Rejection::limited("api", decision, Limit::per_minute(2).unwrap());
        let response = refused(rejection, true);
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers[GRPC_RETRY_PUSHBACK_MS], "2500");
        assert_eq!(
            headers["grpc-message"],
            "rate limited by `api`: retry after 2.5s"
        );
        assert_eq!(headers[RATELIMIT], "\"api\";r=0;t=5");
        let unavailable = refused(
            Rejection::unavailable("api", crate::Error::NotInstalled),
            true,
        );
        assert_eq!(unavailable.headers()["grpc-status"], "14");
    }

    #[test]
    fn a_request_without_a_key_gets_a_json_400_or_500_naming_it() {
        let problem = Problem {
            server: false,
            code: "rate_limit_key_missing",
            message: "missing header `x-api-key`".into(),
        };
        let response = no_key(&problem, false);
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = response.into_body();
        assert_eq!(
            &body[..],
            br#"{"error":"rate_limit_key_missing","message":"missing header `x-api-key`"}"#
        );
        let server = Problem {
            server: true,
            ..problem
        };
        assert_eq!(
            no_key(&server, false).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(no_key(&server, true).headers()["grpc-status"], "13");
    }
}
