//! Login-failure protection: only failed logins count. After 3 failures for
//! one username within a minute, attempts without a valid captcha get
//! `429 {"error":"captcha_required"}`; a correct password with a valid
//! captcha succeeds and starts the count again. Per client IP, 100 failures
//! per day, then `429`.
//!
//! Routes:
//! - `POST /login` `{"username":"alice","password":"wonderland","captcha":"..."}`
//!   → `200`, `401 {"error":"invalid_credentials"}`, `429`, or `400`.
//! - `GET /captcha?username=alice` → `{"captcha":"<token>","expires_in_s":300}`:
//!   a single-use token for that username only, valid for 5 minutes
//!   (`LOGIN_CAPTCHA_TTL`), at most 10 per minute per client IP
//!   (`LOGIN_CAPTCHA_LIMITS`, limit name `login_captcha`). This stands in
//!   for a real captcha provider: a deployment verifies the provider's
//!   answer where [`Captchas::redeem`] is called.
//! - `GET /metrics`: Prometheus.
//!
//! Demo users: `alice` / `wonderland`, `bob` / `builder`.

use std::sync::{Arc, LazyLock};

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ratewall::http::ClientIp;
use ratewall::{Algorithm, FailurePolicy, Limit, Limiter, Rejection, rate_limit};
use serde::{Deserialize, Serialize};

pub use crate::captcha::Captchas;
use crate::{StartupError, json_error};

/// Name of the per-username failure limit.
pub const USER_FAILURES: &str = "login_user";
/// Name of the per-IP failure limit.
pub const IP_FAILURES: &str = "login_ip";
/// Name of the per-IP limit on issuing captchas.
pub const CAPTCHA_ISSUES: &str = "login_captcha";

/// The per-username limit as compiled in (3 failures per minute, exact).
pub static USER_LIMIT: LazyLock<Limit> = LazyLock::new(|| {
    Limit::per_minute(3)
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .expect("a valid literal limit")
});

const USERS: [(&str, &str); 2] = [("alice", "wonderland"), ("bob", "builder")];

#[derive(Debug, Deserialize)]
struct LoginRequest {
    username: String,
    password: String,
    #[serde(default)]
    captcha: Option<String>,
}

/// A login attempt, username normalised (trimmed, lower case) so that
/// `Alice` and `alice ` share one failure count.
#[derive(Debug)]
pub struct Credentials {
    username: String,
    password: String,
}

#[derive(Debug, Serialize)]
struct LoggedIn {
    user: String,
}

/// Why a login did not succeed.
#[derive(Debug)]
pub enum LoginError {
    /// Wrong username or password.
    InvalidCredentials,
    /// Too many failures for this username: solve a captcha.
    CaptchaRequired(Rejection),
    /// Over another limit (per IP), or the limiter refused (fail-closed).
    Limited(Rejection),
}

impl From<Rejection> for LoginError {
    fn from(rejection: Rejection) -> Self {
        LoginError::Limited(rejection)
    }
}

impl IntoResponse for LoginError {
    fn into_response(self) -> Response {
        match self {
            LoginError::InvalidCredentials => json_error(
                StatusCode::UNAUTHORIZED,
                "invalid_credentials",
                "wrong username or password",
            ),
            LoginError::CaptchaRequired(rejection) => {
                let retry_after_ms = rejection.retry_after().unwrap_or_default().as_millis() as u64;
                let (mut parts, _) = rejection.into_response().into_parts();
                parts.headers.remove(axum::http::header::CONTENT_LENGTH);
                let body = Json(
                    serde_json::json!({ "error": "captcha_required", "retry_after_ms": retry_after_ms }),
                );
                (parts, body).into_response()
            }
            LoginError::Limited(rejection) => rejection.into_response(),
        }
    }
}

fn verify(credentials: &Credentials) -> Result<Json<LoggedIn>, LoginError> {
    use subtle::ConstantTimeEq;
    let known = USERS.iter().find(|(user, _)| *user == credentials.username);
    // Compare against something even for unknown users, so timing does not tell.
    let expected = known.map_or("\u{0}", |(_, password)| password);
    let matches: bool = credentials
        .password
        .as_bytes()
        .ct_eq(expected.as_bytes())
        .into();
    if known.is_some() && matches {
        Ok(Json(LoggedIn {
            user: credentials.username.clone(),
        }))
    } else {
        Err(LoginError::InvalidCredentials)
    }
}

/// Over the per-user limit: ask for a captcha; over the per-IP limit: 429.
fn refused(rejection: Rejection) -> Result<Json<LoggedIn>, LoginError> {
    if rejection.name() == USER_FAILURES && !rejection.is_unavailable() {
        Err(LoginError::CaptchaRequired(rejection))
    } else {
        Err(LoginError::Limited(rejection))
    }
}

/// A login without a (valid) captcha: failures count per username and per IP;
/// a success forgets the username's failures.
#[rate_limit(
    name = "login_user",
    key = credentials.username,
    period = "1m",
    threshold = 3,
    algorithm = sliding_log,
    count = failures,
    reset_on_success,
    on_reject = refused,
    also(name = "login_ip", key = ip, period = "1d", threshold = 100, algorithm = fixed_window)
)]
async fn attempt(ip: ClientIp, credentials: Credentials) -> Result<Json<LoggedIn>, LoginError> {
    verify(&credentials)
}

/// A login with a solved captcha: only the per-IP failure limit applies, and
/// a success starts the username's failure count again.
#[rate_limit(name = "login_ip", key = ip, period = "1d", threshold = 100, algorithm = fixed_window, count = failures)]
async fn attempt_with_captcha(
    ip: ClientIp,
    credentials: Credentials,
) -> Result<Json<LoggedIn>, LoginError> {
    let logged_in = verify(&credentials)?;
    let limiter = Limiter::global()
        .map_err(|e| LoginError::Limited(Rejection::unavailable(USER_FAILURES, e)))?;
    let user_limits = limiter
        .settings()
        .limits(USER_FAILURES)
        .map_or_else(|| vec![*USER_LIMIT], |l| l.to_vec());
    if let Err(error) = limiter
        .requests()
        .reset_identity(USER_FAILURES, &credentials.username, &user_limits)
        .await
    {
        tracing::warn!(%error, "could not reset the failure count after a captcha login");
    }
    Ok(logged_in)
}

async fn login(
    State(captchas): State<Arc<Captchas>>,
    ip: ClientIp,
    body: Result<Json<LoginRequest>, JsonRejection>,
) -> Response {
    let request = match crate::json_body(body) {
        Ok(value) => value,
        Err(bad) => return bad,
    };
    let username = match normalise_username(&request.username) {
        Ok(username) => username,
        Err(bad) => return bad,
    };
    let solved = request
        .captcha
        .as_deref()
        .is_some_and(|token| captchas.redeem(token, &username));
    let credentials = Credentials {
        username,
        password: request.password,
    };
    let result = if solved {
        attempt_with_captcha(ip, credentials).await
    } else {
        attempt(ip, credentials).await
    };
    if let Err(LoginError::InvalidCredentials) = &result {
        tracing::info!(%ip, "login failed");
    }
    result.into_response()
}

/// A username as failures are counted and captchas bound: trimmed, lower
/// case, 1 to 256 bytes; else the `400` to answer.
#[allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response to send, as in axum's own rejections; boxing it buys nothing"
)]
fn normalise_username(username: &str) -> Result<String, Response> {
    let username = username.trim().to_lowercase();
    if username.is_empty() || username.len() > 256 {
        return Err(json_error(
            StatusCode::BAD_REQUEST,
            "bad_username",
            "username must be 1 to 256 bytes",
        ));
    }
    Ok(username)
}

#[derive(Debug, Deserialize)]
struct CaptchaRequest {
    username: String,
}

async fn captcha(
    State(captchas): State<Arc<Captchas>>,
    ip: ClientIp,
    query: Result<Query<CaptchaRequest>, QueryRejection>,
) -> Response {
    let Ok(Query(request)) = query else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the username the captcha is for is required: GET /captcha?username=...",
        );
    };
    match normalise_username(&request.username) {
        Ok(username) => issue_captcha(ip, &captchas, &username)
            .await
            .into_response(),
        Err(bad) => bad,
    }
}

/// Issues a captcha for `username`, at most 10 per minute per client IP.
#[rate_limit(name = "login_captcha", key = ip, period = "1m", threshold = 10)]
async fn issue_captcha(
    ip: ClientIp,
    captchas: &Captchas,
    username: &str,
) -> Result<Json<serde_json::Value>, Rejection> {
    Ok(Json(serde_json::json!({
        "captcha": captchas.issue(username),
        "expires_in_s": captchas.ttl().as_secs(),
    })))
}

/// The service's router, with `captchas` issued and redeemed.
pub fn router(captchas: Captchas) -> Router {
    Router::new()
        .route("/login", post(login))
        .route("/captcha", get(captcha))
        .with_state(Arc::new(captchas))
        .merge(crate::metrics_router())
}

/// Captchas valid for `LOGIN_CAPTCHA_TTL` (e.g. `5m`, `90s`; default 5
/// minutes).
pub fn captchas_from_env() -> Result<Captchas, String> {
    let ttl = match std::env::var("LOGIN_CAPTCHA_TTL") {
        Ok(text) => ratewall::clock::parse_duration(text.trim())
            .map_err(|e| format!("LOGIN_CAPTCHA_TTL: {e}"))?,
        Err(_) => crate::captcha::DEFAULT_TTL,
    };
    if ttl.is_zero() {
        return Err("LOGIN_CAPTCHA_TTL must be longer than zero".into());
    }
    Ok(Captchas::new(ttl, crate::captcha::DEFAULT_CAPACITY))
}

/// Applies `LOGIN_USER_FAILURES` / `LOGIN_IP_FAILURES` /
/// `LOGIN_CAPTCHA_LIMITS` (rates such as `"3/1m"`, comma-separated) over the
/// compiled-in limits.
pub fn apply_env_limits(limiter: &Limiter) -> Result<(), String> {
    for (var, name, algorithm) in [
        ("LOGIN_USER_FAILURES", USER_FAILURES, Algorithm::SlidingLog),
        ("LOGIN_IP_FAILURES", IP_FAILURES, Algorithm::FixedWindow),
        ("LOGIN_CAPTCHA_LIMITS", CAPTCHA_ISSUES, Algorithm::Gcra),
    ] {
        if let Ok(rates) = std::env::var(var) {
            let limits = crate::parse_rates(rates.split(','), algorithm)
                .map_err(|e| format!("{var}: {e}"))?;
            limiter
                .settings()
                .set_limits(name, limits)
                .map_err(|e| format!("{var}: {e}"))?;
        }
    }
    Ok(())
}

/// The `login` binary. When the backend fails, failures are counted in
/// process with the full threshold (`FailurePolicy::local(1)`):
/// brute force stays limited during a Redis outage, logins keep working.
pub async fn main() -> Result<(), StartupError> {
    crate::init_tracing();
    let captchas = captchas_from_env().map_err(StartupError::new)?;
    let limiter = crate::install(
        crate::builder_from_env(Limiter::builder())
            .await?
            .prefix("login")
            .failure_policy(FailurePolicy::local(1).expect("a share of one")),
    )?;
    apply_env_limits(limiter)
        .map_err(|e| StartupError::new(format!("invalid login limits: {e}")))?;
    if let Ok(path) = std::env::var("LIMITS_FILE") {
        crate::watch_limits_file(limiter, path)?; // ratewall::config::LimitsFile, reloaded on SIGHUP
    }
    tracing::info!("demo users: alice (wonderland), bob (builder)");
    crate::serve(router(captchas), "127.0.0.1:3001").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_password_of_a_known_user_verifies() {
        let creds = |u: &str, p: &str| Credentials {
            username: u.into(),
            password: p.into(),
        };
        assert!(verify(&creds("alice", "wonderland")).is_ok());
        assert!(verify(&creds("alice", "wonderlan")).is_err());
        assert!(verify(&creds("mallory", "wonderland")).is_err());
        assert!(verify(&creds("mallory", "\u{0}")).is_err());
    }
}
