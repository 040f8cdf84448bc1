//! How a [`Rejection`] is said on the wire, once for every integration
//! (axum, the tower layer, tonic, actix-web): the HTTP status, `Retry-After`,
//! the IETF `RateLimit-Policy` / `RateLimit` fields, the JSON body, and the
//! gRPC status code, message and retry pushback.

use std::fmt::Write as _;

use crate::model::decision::Decision;
use crate::model::limit::Limit;
use crate::model::rejection::{Rejection, RejectionReason};

/// `429 Too Many Requests`.
pub(crate) const TOO_MANY_REQUESTS: u16 = 429;
/// `403 Forbidden`: the identity is on a deny list.
pub(crate) const FORBIDDEN: u16 = 403;
/// `503 Service Unavailable`.
pub(crate) const SERVICE_UNAVAILABLE: u16 = 503;
/// gRPC `RESOURCE_EXHAUSTED`.
pub(crate) const GRPC_RESOURCE_EXHAUSTED: u8 = 8;
/// gRPC `PERMISSION_DENIED`.
pub(crate) const GRPC_PERMISSION_DENIED: u8 = 7;
/// gRPC `UNAVAILABLE`.
pub(crate) const GRPC_UNAVAILABLE: u8 = 14;
/// The gRPC metadata key of the server's retry pushback (gRFC A6).
pub(crate) const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// A rejection's wire form, rendered once.
#[derive(Debug)]
pub(crate) struct Wire {
    /// The HTTP status: 429, 403 when deny-listed, or 503 when the limiter
    /// could not decide.
    pub(crate) status: u16,
    /// `Retry-After` in whole seconds (never 0), when over a limit or denied
    /// until a known time.
    pub(crate) retry_after_secs: Option<u64>,
    /// The retry delay in milliseconds, rounded up, when over a limit.
    pub(crate) retry_after_ms: Option<u64>,
    /// `RateLimit-Policy` and `RateLimit` of the refusing limit.
    pub(crate) fields: Option<(String, String)>,
    /// The JSON body.
    pub(crate) body: String,
    /// The gRPC status code.
    pub(crate) grpc_code: u8,
}

impl Wire {
    /// The wire form of `rejection`.
    pub(crate) fn of(rejection: &Rejection) -> Self {
        match rejection.reason() {
            RejectionReason::Limited { decision, limit } if limit.is_in_flight() => {
                let retry_ms = retry_after_ms(decision);
                Self {
                    status: TOO_MANY_REQUESTS,
                    retry_after_secs: Some(decision.retry_after_secs().max(1)),
                    retry_after_ms: Some(retry_ms),
                    // The `RateLimit` fields describe a quota over a window.
                    fields: None,
                    body: format!(
                        r#"{{"error":"too_many_in_flight","max_in_flight":{},"retry_after_ms":{retry_ms}}}"#,
                        limit.threshold()
                    ),
                    grpc_code: GRPC_RESOURCE_EXHAUSTED,
                }
            }
            RejectionReason::Limited { decision, limit } => {
                let retry_ms = retry_after_ms(decision);
                Self {
                    status: TOO_MANY_REQUESTS,
                    retry_after_secs: Some(decision.retry_after_secs().max(1)),
                    retry_after_ms: Some(retry_ms),
                    fields: Some(fields(rejection.name(), decision, limit)),
                    body: format!(r#"{{"error":"rate_limited","retry_after_ms":{retry_ms}}}"#),
                    grpc_code: GRPC_RESOURCE_EXHAUSTED,
                }
            }
            RejectionReason::Denied { .. } => {
                let wait = rejection.retry_after();
                Self {
                    status: FORBIDDEN,
                    retry_after_secs: wait
                        .map(|w| (w.as_micros().div_ceil(1_000_000) as u64).max(1)),
                    retry_after_ms: wait.map(|w| w.as_micros().div_ceil(1_000) as u64),
                    fields: None,
                    body: r#"{"error":"denied"}"#.to_owned(),
                    grpc_code: GRPC_PERMISSION_DENIED,
                }
            }
            RejectionReason::Unavailable(_) => Self {
                status: SERVICE_UNAVAILABLE,
                retry_after_secs: None,
                retry_after_ms: None,
                fields: None,
                body: r#"{"error":"rate_limiter_unavailable"}"#.to_owned(),
                grpc_code: GRPC_UNAVAILABLE,
            },
        }
    }
}

/// A decision's `retry_after` in whole milliseconds, rounded up.
pub(crate) fn retry_after_ms(decision: &Decision) -> u64 {
    decision.retry_after().as_micros().div_ceil(1_000) as u64
}

/// `RateLimit-Policy` (`"name";q=QUOTA;w=WINDOW`) and `RateLimit`
/// (`"name";r=REMAINING;t=RESET`) for one limit's decision, seconds rounded
/// up (draft-ietf-httpapi-ratelimit-headers).
pub(crate) fn fields(name: &str, decision: &Decision, limit: &Limit) -> (String, String) {
    let mut policy = String::with_capacity(name.len() + 32);
    let mut current = String::with_capacity(name.len() + 32);
    let _ = write_fields(&mut policy, &mut current, name, decision, limit);
    (policy, current)
}

/// [`fields`] into any two writers (e.g. on the stack); numbers without
/// `core::fmt`. Fails only when a writer is full.
pub(crate) fn write_fields<W: std::fmt::Write>(
    policy: &mut W,
    current: &mut W,
    name: &str,
    decision: &Decision,
    limit: &Limit,
) -> std::fmt::Result {
    write_policy(policy, name, decision.limit(), window_secs(limit))?;
    write_current(current, name, decision)
}

/// A `RateLimit-Policy` window: the limit's period in seconds, rounded up.
pub(crate) fn window_secs(limit: &Limit) -> u64 {
    limit.period().as_micros().div_ceil(1_000_000) as u64
}

/// `RateLimit-Policy` of a limit named `name` with this quota and window
/// (the same for every decision of the limit: worth keeping).
pub(crate) fn write_policy<W: std::fmt::Write>(
    policy: &mut W,
    name: &str,
    quota: u64,
    window: u64,
) -> std::fmt::Result {
    let mut digits = itoa::Buffer::new();
    push_sf_string(policy, name)?;
    policy.write_str(";q=")?;
    policy.write_str(digits.format(quota))?;
    policy.write_str(";w=")?;
    policy.write_str(digits.format(window))
}

/// `RateLimit` of one decision of the limit named `name`.
pub(crate) fn write_current<W: std::fmt::Write>(
    current: &mut W,
    name: &str,
    decision: &Decision,
) -> std::fmt::Result {
    let mut digits = itoa::Buffer::new();
    push_sf_string(current, name)?;
    current.write_str(";r=")?;
    current.write_str(digits.format(decision.remaining()))?;
    current.write_str(";t=")?;
    current.write_str(digits.format(decision.reset_after_secs()))
}

/// Whether `name` is a structured-field string's contents as is:
/// printable ASCII without `"` or `\`.
fn is_plain(name: &str) -> bool {
    name.bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
}

/// Appends `name` as a structured-field string: printable ASCII, `"` and
/// `\` escaped; other characters replaced by `_`.
pub(crate) fn push_sf_string<W: std::fmt::Write>(out: &mut W, name: &str) -> std::fmt::Result {
    out.write_char('"')?;
    // The common case, a plain name: one byte scan, one write.
    if is_plain(name) {
        out.write_str(name)?;
        return out.write_char('"');
    }
    let mut rest = name;
    while let Some(at) = rest.find(|c: char| !matches!(c, ' '..='~') || c == '"' || c == '\\') {
        out.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or('_');
        match c {
            '"' | '\\' => {
                out.write_char('\\')?;
                out.write_char(c)?;
            }
            _ => out.write_char('_')?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)?;
    out.write_char('"')
}

/// A `grpc-message` value: UTF-8, percent-encoded outside printable ASCII
/// and for `%` itself (the gRPC HTTP/2 protocol's rule).
pub(crate) fn grpc_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        match byte {
            b' '..=b'~' if byte != b'%' => out.push(char::from(byte)),
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// Appends `text` as the contents of a JSON string (quotes not included).
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) fn push_json_str(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<Rejection> for tonic::Status {
    /// `RESOURCE_EXHAUSTED` with the rejection as message and, in the
    /// metadata, `grpc-retry-pushback-ms` (the retry delay, rounded up to a
    /// millisecond) and the `ratelimit-policy` / `ratelimit` fields;
    /// `PERMISSION_DENIED` when deny-listed (with the pushback when the
    /// entry expires); `UNAVAILABLE` when the limiter could not decide.
    ///
    /// ```
    /// use ratewall::{Decision, Limit, Rejection, backend::Figures};
    /// let decision = Decision::new(Figures { allowed: false, limit: 1, retry_after_us: 1_500_000, ..Figures::default() });
    /// let status = tonic::Status::from(Rejection::limited("api", decision, Limit::per_minute(1).unwrap()));
    /// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    /// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1500");
    /// ```
    fn from(rejection: Rejection) -> Self {
        let refusal = Wire::of(&rejection);
        let code = tonic::Code::from(i32::from(refusal.grpc_code));
        let mut status = tonic::Status::new(code, rejection.to_string());
        let metadata = status.metadata_mut();
        if let Some(ms) = refusal.retry_after_ms {
            metadata.insert(GRPC_RETRY_PUSHBACK_MS, ms.into());
        }
        if let Some((policy, current)) = &refusal.fields
            && let (Ok(policy), Ok(current)) = (policy.parse(), current.parse())
        {
            metadata.insert("ratelimit-policy", policy);
            metadata.insert("ratelimit", current);
        }
        status
    }
}

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
impl actix_web::ResponseError for Rejection {
    /// `429 Too Many Requests`, `403 Forbidden` when deny-listed, or
    /// `503 Service Unavailable` when the limiter could not decide.
    fn status_code(&self) -> actix_web::http::StatusCode {
        let status = match self.reason() {
            RejectionReason::Limited { .. } => TOO_MANY_REQUESTS,
            RejectionReason::Denied { .. } => FORBIDDEN,
            RejectionReason::Unavailable(_) => SERVICE_UNAVAILABLE,
        };
        actix_web::http::StatusCode::from_u16(status)
            .unwrap_or(actix_web::http::StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The same response as axum's: `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit` and the JSON body.
    fn error_response(&self) -> actix_web::HttpResponse {
        let refusal = Wire::of(self);
        let mut response = actix_web::HttpResponse::build(self.status_code());
        response.content_type("application/json");
        if let Some(secs) = refusal.retry_after_secs {
            response.insert_header(("retry-after", secs));
        }
        if let Some((policy, current)) = refusal.fields {
            response.insert_header(("ratelimit-policy", policy));
            response.insert_header(("ratelimit", current));
        }
        response.body(refusal.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_deny_listed_refusal_is_forbidden_with_a_retry_only_when_it_expires() {
        let forever = Wire::of(&Rejection::denied("sms::send", None));
        assert_eq!((forever.status, forever.grpc_code), (403, 7));
        assert_eq!(forever.retry_after_secs, None);
        assert_eq!(forever.body, r#"{"error":"denied"}"#);
        assert!(forever.fields.is_none());
    }

    #[test]
    fn a_limited_refusal_has_every_field_rounded_up() {
        let refusal = Wire::of(&limited(1_000_001));
        assert_eq!(refusal.status, 429);
        assert_eq!(refusal.retry_after_secs, Some(2));
        assert_eq!(refusal.retry_after_ms, Some(1001));
        assert_eq!(refusal.grpc_code, 8);
        let (policy, current) = refusal.fields.unwrap();
        assert_eq!(policy, "\"sms::send\";q=5;w=3600");
        assert_eq!(current, "\"sms::send\";r=0;t=3000");
        assert_eq!(
            refusal.body,
            r#"{"error":"rate_limited","retry_after_ms":1001}"#
        );
    }

    fn too_many_in_flight() -> Rejection {
        let decision = Decision::new(crate::backend::Figures {
            allowed: false,
            limit: 10,
            retry_after_us: crate::algorithm::RETRY_HINT_US,
            reset_after_us: 10_000_000,
            ..crate::backend::Figures::default()
        });
        Rejection::limited("jobs", decision, Limit::in_flight(10).unwrap())
    }

    #[test]
    fn an_in_flight_refusal_says_so_with_a_one_second_hint_and_no_rate_fields() {
        let rejection = too_many_in_flight();
        assert!(rejection.is_in_flight());
        let refusal = Wire::of(&rejection);
        assert_eq!(refusal.status, TOO_MANY_REQUESTS);
        assert_eq!(refusal.retry_after_secs, Some(1));
        assert_eq!(refusal.grpc_code, GRPC_RESOURCE_EXHAUSTED);
        assert!(refusal.fields.is_none());
        assert_eq!(
            refusal.body,
            r#"{"error":"too_many_in_flight","max_in_flight":10,"retry_after_ms":1000}"#
        );
        assert_eq!(
            rejection.to_string(),
            "too many calls in flight for `jobs` (at most 10)"
        );
    }

    #[test]
    fn an_unavailable_refusal_is_a_503_and_grpc_unavailable() {
        let refusal = Wire::of(&Rejection::unavailable("x", crate::Error::NotInstalled));
        assert_eq!((refusal.status, refusal.grpc_code), (503, 14));
        assert!(refusal.fields.is_none() && refusal.retry_after_secs.is_none());
    }

    #[test]
    fn grpc_messages_are_percent_encoded_outside_printable_ascii() {
        assert_eq!(grpc_message("a `b` 100% é"), "a `b` 100%25 %C3%A9");
    }

    #[test]
    fn policy_names_are_valid_structured_field_strings() {
        let mut out = String::new();
        push_sf_string(&mut out, "a\"b\\c é").unwrap();
        assert_eq!(out, r#""a\"b\\c _""#);
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn a_rejection_is_a_resource_exhausted_status_with_the_pushback() {
        let status = tonic::Status::from(limited(1_000_001));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "rate limited by `sms::send`: retry after 1.000001s"
        );
        assert_eq!(
            status.metadata().get(GRPC_RETRY_PUSHBACK_MS).unwrap(),
            "1001"
        );
        assert_eq!(
            status.metadata().get("ratelimit").unwrap(),
            "\"sms::send\";r=0;t=3000"
        );
        let down = tonic::Status::from(Rejection::unavailable("x", crate::Error::NotInstalled));
        assert_eq!(down.code(), tonic::Code::Unavailable);
        let busy = tonic::Status::from(too_many_in_flight());
        assert_eq!(busy.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            busy.message(),
            "too many calls in flight for `jobs` (at most 10)"
        );
        assert_eq!(busy.metadata().get(GRPC_RETRY_PUSHBACK_MS).unwrap(), "1000");
        assert!(busy.metadata().get("ratelimit").is_none());
    }

    #[cfg(feature = "actix")]
    #[test]
    fn a_rejection_is_an_actix_429_with_the_same_fields() {
        use actix_web::ResponseError;
        let response = limited(1_000_001).error_response();
        assert_eq!(response.status().as_u16(), 429);
        let headers = response.headers();
        assert_eq!(headers.get("retry-after").unwrap(), "2");
        assert_eq!(
            headers.get("ratelimit-policy").unwrap(),
            "\"sms::send\";q=5;w=3600"
        );
        assert_eq!(headers.get("content-type").unwrap(), "application/json");
        let down = Rejection::unavailable("x", crate::Error::NotInstalled);
        assert_eq!(down.error_response().status().as_u16(), 503);
        let busy = too_many_in_flight().error_response();
        assert_eq!(busy.status().as_u16(), 429);
        assert_eq!(busy.headers().get("retry-after").unwrap(), "1");
        assert!(busy.headers().get("ratelimit-policy").is_none());
    }
}
