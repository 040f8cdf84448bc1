//! SMS anti-abuse: per phone 1 per minute, 5 per hour and 10 per day, plus
//! 20 per hour per client IP, decided together and all-or-nothing.
//!
//! Routes:
//! - `POST /sms/send` `{"phone":"+8613800000000"}` → `200 {"sent":true}`, a
//!   `429` with `Retry-After` and the IETF `RateLimit` fields, or `400` for a
//!   malformed body or a phone number that is not valid, with the reason
//!   (which consumes nothing). Phones are limited by their E.164 form, so
//!   every way of writing one number shares one quota ([`Phone`]).
//! - `GET /admin/limits/{phone}` and `DELETE /admin/limits/{phone}`: remaining
//!   and reset per limit, and unblocking a phone (support staff).
//! - `GET /admin/config` and `PUT /admin/config`: the limits of the running
//!   process, changed without a restart.
//! - `PUT /admin/lists/{allow|deny}/{phone}` (optional `?for=1h`),
//!   `DELETE /admin/lists/{phone}` and `GET /admin/lists`: phones that skip
//!   the per-phone limits, or are refused at once (`403`), shared by every
//!   instance through Redis.
//! - `GET /metrics`: Prometheus.
//!
//! Admin routes need `Authorization: Bearer $ADMIN_TOKEN` (the scheme in
//! any case) and are not mounted when `ADMIN_TOKEN` is unset; the phone in
//! their path may be written in any accepted form.
//!
//! When Redis fails, decisions are made in process with each instance's
//! share of the limits (`SMS_INSTANCES`, default 1), and phones Redis had
//! blocked stay blocked (the limiter's deny cache): see [`main`].
//!
//! Limits come from `SMS_LIMITS_FILE` (TOML, reloaded on SIGHUP), else from
//! `SMS_PHONE_LIMITS` / `SMS_IP_LIMITS` (comma-separated, e.g. `1/1m,5/1h`),
//! else the defaults above.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use ratewall::http::ClientIp;
use ratewall::{Algorithm, FailurePolicy, Limit, Limiter, Rejection, key::Masked, rate_limit};
use serde::{Deserialize, Serialize};

use crate::phone::{BadPhone, Phone};
use crate::{StartupError, bearer_matches, json_error};

/// Name of the per-phone limits (metrics label, key scope, runtime override).
pub const PHONE_LIMITS: &str = "sms_phone";
/// Name of the per-IP limit.
pub const IP_LIMITS: &str = "sms_ip";

/// The service's limits as rates such as `"5/1h"` (sliding log: never more
/// than the threshold in any window).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsConfig {
    /// Per phone number.
    pub phone: Vec<String>,
    /// Per client IP.
    pub ip: Vec<String>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            phone: vec!["1/1m".into(), "5/1h".into(), "10/1d".into()],
            ip: vec!["20/1h".into()],
        }
    }
}

/// Parsed limits, ready for the limiter.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Per phone number.
    pub phone: Vec<Limit>,
    /// Per client IP.
    pub ip: Vec<Limit>,
}

fn parse_rates(rates: &[String]) -> Result<Vec<Limit>, String> {
    crate::parse_rates(rates.iter().map(String::as_str), Algorithm::SlidingLog)
}

impl LimitsConfig {
    /// Validates every rate.
    pub fn parse(&self) -> Result<Limits, String> {
        Ok(Limits {
            phone: parse_rates(&self.phone)?,
            ip: parse_rates(&self.ip)?,
        })
    }

    /// From `SMS_LIMITS_FILE`, else `SMS_PHONE_LIMITS` / `SMS_IP_LIMITS`, else defaults.
    pub fn from_env() -> Result<Self, String> {
        if let Ok(path) = std::env::var("SMS_LIMITS_FILE") {
            return Self::from_file(&PathBuf::from(path));
        }
        let list = |var: &str| {
            std::env::var(var).ok().map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
        };
        let defaults = Self::default();
        Ok(Self {
            phone: list("SMS_PHONE_LIMITS").unwrap_or(defaults.phone),
            ip: list("SMS_IP_LIMITS").unwrap_or(defaults.ip),
        })
    }

    /// Reads a TOML file: `phone = ["1/1m", "5/1h", "10/1d"]` and `ip = ["20/1h"]`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The service's state.
#[derive(Debug)]
pub struct Sms {
    limiter: &'static Limiter,
    config: RwLock<(LimitsConfig, Limits)>,
    admin_token: Option<String>,
}

impl Sms {
    /// Applies `config` to the limiter (every later decision uses it).
    pub fn apply(&self, config: LimitsConfig) -> Result<(), String> {
        let limits = config.parse()?;
        Limit::check_distinct(&limits.ip).map_err(|e| format!("ip: {e}"))?;
        self.limiter
            .settings()
            .set_limits(PHONE_LIMITS, limits.phone.clone())
            .map_err(|e| format!("phone: {e}"))?;
        self.limiter
            .settings()
            .set_limits(IP_LIMITS, limits.ip.clone())
            .map_err(|e| format!("ip: {e}"))?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = (config, limits);
        Ok(())
    }

    fn limits(&self) -> Limits {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }
}

#[derive(Debug, Deserialize)]
struct SendRequest {
    phone: String,
}

async fn send(ip: ClientIp, body: Result<Json<SendRequest>, JsonRejection>) -> Response {
    let request = match crate::json_body(body) {
        Ok(value) => value,
        Err(bad) => return bad,
    };
    let phone = match Phone::parse(&request.phone) {
        Ok(phone) => phone,
        Err(reason) => return bad_phone(&reason),
    };
    deliver(ip, phone).await.into_response()
}

/// Sends one SMS, at most 1/min, 5/h and 10/day per phone and 20/h per IP.
/// The compiled-in limits are defaults; [`Sms::apply`] replaces them at runtime.
#[rate_limit(
    name = "sms_phone",
    key = phone,
    limits = ["1/1m", "5/1h", "10/1d"],
    algorithm = sliding_log,
    also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = sliding_log),
    headers
)]
async fn deliver(ip: ClientIp, phone: Phone) -> Result<Response, Rejection> {
    // A real service hands the message to its SMS gateway here.
    tracing::info!(phone = %Masked(phone.e164()), %ip, "sms sent");
    Ok(Json(serde_json::json!({ "sent": true })).into_response())
}

#[derive(Debug, Serialize)]
struct LimitState {
    name: &'static str,
    rate: String,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
}

fn bad_phone(reason: &BadPhone) -> Response {
    json_error(StatusCode::BAD_REQUEST, "bad_phone", &reason.to_string())
}

/// An admin call's phone, once the bearer token is checked.
#[allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response to send, as in axum's own rejections; boxing it buys nothing"
)]
fn admin_phone(sms: &Sms, headers: &HeaderMap, phone: &str) -> Result<Phone, Response> {
    if let Some(denied) = denied(sms, headers) {
        return Err(denied);
    }
    Phone::parse(phone).map_err(|reason| bad_phone(&reason))
}

/// `None` when the bearer token is right, else the `401` to answer.
fn denied(sms: &Sms, headers: &HeaderMap) -> Option<Response> {
    match &sms.admin_token {
        Some(token) if bearer_matches(headers, token) => None,
        _ => Some(json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )),
    }
}

async fn show_limits(
    State(sms): State<Arc<Sms>>,
    headers: HeaderMap,
    Path(phone): Path<String>,
) -> Response {
    let phone = match admin_phone(&sms, &headers, &phone) {
        Ok(phone) => phone,
        Err(refused) => return refused,
    };
    let limits = sms.limits().phone;
    match sms
        .limiter
        .requests()
        .peek_identity(PHONE_LIMITS, &phone, &limits)
        .await
    {
        Ok(decisions) => {
            let states: Vec<LimitState> = limits
                .iter()
                .zip(decisions.iter())
                .map(|(limit, d)| LimitState {
                    name: PHONE_LIMITS,
                    rate: limit.to_string(),
                    limit: d.limit(),
                    remaining: d.remaining(),
                    reset_after_ms: d.reset_after().as_millis() as u64,
                })
                .collect();
            Json(serde_json::json!({ "phone": phone.e164(), "limits": states })).into_response()
        }
        Err(error) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "limiter_unavailable",
            &error.to_string(),
        ),
    }
}

async fn reset_limits(
    State(sms): State<Arc<Sms>>,
    headers: HeaderMap,
    Path(phone): Path<String>,
) -> Response {
    let phone = match admin_phone(&sms, &headers, &phone) {
        Ok(phone) => phone,
        Err(refused) => return refused,
    };
    match sms
        .limiter
        .requests()
        .reset_identity(PHONE_LIMITS, &phone, &sms.limits().phone)
        .await
    {
        Ok(()) => {
            tracing::info!(phone = %Masked(phone.e164()), "limits reset by admin");
            Json(serde_json::json!({ "reset": true })).into_response()
        }
        Err(error) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "limiter_unavailable",
            &error.to_string(),
        ),
    }
}

async fn show_lists(State(sms): State<Arc<Sms>>, headers: HeaderMap) -> Response {
    if let Some(denied) = denied(&sms, &headers) {
        return denied;
    }
    let entries: Vec<serde_json::Value> = sms
        .limiter
        .settings()
        .list_entries()
        .iter()
        .map(|e| {
            serde_json::json!({
                "list": e.kind.name(),
                "name": e.name.as_deref().unwrap_or("*"),
                "identity": e.identity,
                "expires_in_s": crate::expires_in_s(e),
            })
        })
        .collect();
    Json(serde_json::json!({ "entries": entries })).into_response()
}

async fn list_phone(
    State(sms): State<Arc<Sms>>,
    headers: HeaderMap,
    Path((list, phone)): Path<(String, String)>,
    Query(listed_for): Query<crate::ListFor>,
) -> Response {
    let phone = match admin_phone(&sms, &headers, &phone) {
        Ok(phone) => phone,
        Err(refused) => return refused,
    };
    if let Err(refused) =
        crate::change_list(sms.limiter, &list, PHONE_LIMITS, &phone, &listed_for).await
    {
        return refused;
    }
    tracing::info!(phone = %Masked(phone.e164()), list, "phone listed by admin");
    Json(serde_json::json!({ "listed": list, "phone": phone.e164() })).into_response()
}

async fn unlist_phone(
    State(sms): State<Arc<Sms>>,
    headers: HeaderMap,
    Path(phone): Path<String>,
) -> Response {
    match admin_phone(&sms, &headers, &phone) {
        Ok(phone) => crate::unlist(sms.limiter, PHONE_LIMITS, &phone).await,
        Err(refused) => refused,
    }
}

async fn show_config(State(sms): State<Arc<Sms>>, headers: HeaderMap) -> Response {
    if let Some(denied) = denied(&sms, &headers) {
        return denied;
    }
    let config = sms
        .config
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .0
        .clone();
    Json(config).into_response()
}

async fn change_config(
    State(sms): State<Arc<Sms>>,
    headers: HeaderMap,
    body: Result<Json<LimitsConfig>, JsonRejection>,
) -> Response {
    if let Some(denied) = denied(&sms, &headers) {
        return denied;
    }
    let config = match crate::json_body(body) {
        Ok(value) => value,
        Err(bad) => return bad,
    };
    match sms.apply(config.clone()) {
        Ok(()) => Json(config).into_response(),
        Err(message) => json_error(StatusCode::BAD_REQUEST, "bad_limits", &message),
    }
}

/// The service's router, on the global limiter with `config` applied.
pub fn router(
    limiter: &'static Limiter,
    config: LimitsConfig,
    admin_token: Option<String>,
) -> Result<(Router, Arc<Sms>), String> {
    let limits = config.parse()?;
    let sms = Arc::new(Sms {
        limiter,
        config: RwLock::new((config.clone(), limits)),
        admin_token,
    });
    sms.apply(config)?;
    let mut router = Router::new().route("/sms/send", post(send));
    if sms.admin_token.is_some() {
        router = router
            .route(
                "/admin/limits/{phone}",
                get(show_limits).delete(reset_limits),
            )
            .route("/admin/config", get(show_config).put(change_config))
            .route("/admin/lists", get(show_lists))
            .route("/admin/lists/{list}/{phone}", put(list_phone))
            .route("/admin/lists/{phone}", delete(unlist_phone));
    }
    Ok((
        router
            .with_state(sms.clone())
            .merge(crate::metrics_router()),
        sms,
    ))
}

/// How many instances share the limits (`SMS_INSTANCES`, default 1): while
/// Redis is down each decides alone with its share of every limit.
pub fn instances_from_env() -> Result<std::num::NonZeroU64, StartupError> {
    match std::env::var("SMS_INSTANCES") {
        Err(_) => Ok(std::num::NonZeroU64::MIN),
        Ok(text) => text
            .trim()
            .parse::<std::num::NonZeroU64>()
            .ok()
            .ok_or_else(|| {
                StartupError::new(format!(
                    "SMS_INSTANCES must be a whole number of instances, at least 1, not {text:?}"
                ))
            }),
    }
}

/// The `sms` binary. When Redis fails, each instance decides in process
/// with its share of every limit (`FailurePolicy::Local`, share
/// `SMS_INSTANCES`), and a phone Redis had blocked stays blocked
/// (the limiter's deny cache answers, while Redis fails, what Redis last
/// said was refused or at its limit): failing open would send paid SMS to a
/// phone that is being flooded, failing closed would stop every SMS for
/// the length of the outage.
pub async fn main() -> Result<(), StartupError> {
    crate::init_tracing();
    let share = instances_from_env()?;
    let invalid = |e: String| StartupError::new(format!("invalid sms limits: {e}"));
    let config = LimitsConfig::from_env().map_err(invalid)?;
    config.parse().map_err(invalid)?;
    let builder = match crate::backend_from_env().await? {
        Some(redis) => {
            tracing::info!(
                instances = share,
                "if Redis fails, each instance decides alone with 1/{share} of every limit"
            );
            Limiter::builder().backend(redis)
        }
        None => Limiter::builder().memory(),
    };
    let limiter = crate::install(
        builder
            .prefix("sms")
            .failure_policy(FailurePolicy::Local { share }),
    )?;
    let admin_token = std::env::var("ADMIN_TOKEN").ok().filter(|t| !t.is_empty());
    if admin_token.is_none() {
        tracing::info!("ADMIN_TOKEN unset: admin routes disabled");
    }
    let (router, sms) = router(limiter, config, admin_token).map_err(invalid)?;
    if std::env::var_os("LIMITS_FILE").is_some() {
        // The SMS service keeps its limits in its own config (shown and changed
        // through /admin/config); a generic file would bypass that view.
        tracing::warn!("LIMITS_FILE is ignored by the sms service; use SMS_LIMITS_FILE");
    }
    tracing::info!(limits = ?sms.config.read().unwrap_or_else(|e| e.into_inner()).0, "sms limits");
    #[cfg(unix)]
    if let Ok(path) = std::env::var("SMS_LIMITS_FILE") {
        reload_on_sighup(sms, PathBuf::from(path))?;
    }
    crate::serve(router, "127.0.0.1:3000").await
}

/// Re-reads the limits file on SIGHUP; a bad file is logged and ignored.
#[cfg(unix)]
fn reload_on_sighup(sms: Arc<Sms>, path: PathBuf) -> Result<(), StartupError> {
    let mut hangups = crate::signal_hangup()?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match LimitsConfig::from_file(&path).and_then(|config| sms.apply(config)) {
                Ok(()) => tracing::info!(path = %path.display(), "limits reloaded"),
                Err(error) => {
                    tracing::error!(%error, "limits file rejected; keeping the current limits")
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_config_rejects_bad_rates_with_the_offending_text() {
        let bad = LimitsConfig {
            phone: vec!["1/1m".into(), "5 per fortnight".into()],
            ip: vec!["20/1h".into()],
        };
        assert!(bad.parse().unwrap_err().contains("5 per fortnight"));
        let too_big = LimitsConfig {
            phone: vec!["20000/1h".into()],
            ip: vec!["20/1h".into()],
        };
        assert!(
            too_big
                .parse()
                .unwrap_err()
                .contains("sliding-window counter")
        );
        assert_eq!(LimitsConfig::default().parse().unwrap().phone.len(), 3);
    }

    #[test]
    fn limits_files_are_toml() {
        let config: LimitsConfig = toml::from_str("phone = [\"2/1m\"]\nip = [\"50/1h\"]").unwrap();
        assert_eq!(config.phone, ["2/1m"]);
    }
}
