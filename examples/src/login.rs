//! Login-failure protection: only failed logins count. After 3 failures for
//! one username within a minute, attempts without a valid captcha get
//! `429 {"error":"captcha_required"}`; a correct password with a valid
//! captcha succeeds and starts the count again. Per client IP, 100 failures
//! per day, then `429`.
//!
//! Routes:
//! - `POST /login` `{"username":"alice","password":"wonderland","captcha":"..."}`
//!   → `200`, `401 {"error":"invalid_credentials"}`, `429`, or `400`.
//! - `GET /captcha` → `{"captcha":"<token>"}`: a single-use token valid for
//!   5 minutes. This stands in for a real captcha provider: a deployment
//!   verifies the provider's answer where [`Captchas::redeem`] is called.
//! - `GET /metrics`: Prometheus.
//!
//! Demo users: `alice` / `wonderland`, `bob` / `builder`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rl_core::http::ClientIp;
use rl_core::{Algorithm, FailurePolicy, Limit, Limiter, Rejection, rate_limit};
use serde::{Deserialize, Serialize};

use crate::{StartupError, json_error};

/// Name of the per-username failure limit.
pub const USER_FAILURES: &str = "login_user";
/// Name of the per-IP failure limit.
pub const IP_FAILURES: &str = "login_ip";

/// The per-username limit as compiled in (3 failures per minute, exact).
pub static USER_LIMIT: LazyLock<Limit> = LazyLock::new(|| {
    Limit::per_minute(3)
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .expect("a valid literal limit")
});

const USERS: [(&str, &str); 2] = [("alice", "wonderland"), ("bob", "builder")];

/// Single-use captcha tokens.
#[derive(Debug, Default)]
pub struct Captchas {
    issued: Mutex<HashMap<String, Instant>>,
}

impl Captchas {
    const VALID_FOR: Duration = Duration::from_secs(300);

    /// Issues a token.
    pub fn issue(&self) -> String {
        let token = format!("{:032x}", rand::random::<u128>());
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        issued.retain(|_, at| at.elapsed() < Self::VALID_FOR);
        issued.insert(token.clone(), Instant::now());
        token
    }

    /// Whether `token` was issued, is fresh, and was not used before.
    pub fn redeem(&self, token: &str) -> bool {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        issued
            .remove(token)
            .is_some_and(|at| at.elapsed() < Self::VALID_FOR)
    }
}

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
        .limits(USER_FAILURES)
        .map_or_else(|| vec![*USER_LIMIT], |l| l.to_vec());
    if let Err(error) = limiter
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
    let username = request.username.trim().to_lowercase();
    if username.is_empty() || username.len() > 256 {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_username",
            "username must be 1 to 256 bytes",
        );
    }
    let credentials = Credentials {
        username,
        password: request.password,
    };
    let solved = request
        .captcha
        .as_deref()
        .is_some_and(|token| captchas.redeem(token));
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

async fn captcha(State(captchas): State<Arc<Captchas>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "captcha": captchas.issue() }))
}

/// The service's router.
pub fn router() -> Router {
    Router::new()
        .route("/login", post(login))
        .route("/captcha", get(captcha))
        .with_state(Arc::new(Captchas::default()))
        .merge(crate::metrics_router())
}

/// Applies `LOGIN_USER_FAILURES` / `LOGIN_IP_FAILURES` (rates such as
/// `"3/1m"`, comma-separated) over the compiled-in limits.
pub fn apply_env_limits(limiter: &Limiter) -> Result<(), String> {
    for (var, name, algorithm) in [
        ("LOGIN_USER_FAILURES", USER_FAILURES, Algorithm::SlidingLog),
        ("LOGIN_IP_FAILURES", IP_FAILURES, Algorithm::FixedWindow),
    ] {
        if let Ok(rates) = std::env::var(var) {
            let limits = crate::parse_rates(rates.split(','), algorithm)
                .map_err(|e| format!("{var}: {e}"))?;
            limiter
                .set_limits(name, limits)
                .map_err(|e| format!("{var}: {e}"))?;
        }
    }
    Ok(())
}

/// The `login` binary. When the backend fails, failures are counted in
/// process with the full threshold (`FailurePolicy::Local { share: 1 }`):
/// brute force stays limited during a Redis outage, logins keep working.
pub async fn main() -> Result<(), StartupError> {
    crate::init_tracing();
    let limiter = crate::install(
        crate::builder_from_env(Limiter::builder())
            .await?
            .prefix("login")
            .failure_policy(FailurePolicy::Local { share: 1 }),
    )?;
    apply_env_limits(limiter)
        .map_err(|e| StartupError::new(format!("invalid login limits: {e}")))?;
    if let Ok(path) = std::env::var("LIMITS_FILE") {
        crate::watch_limits_file(limiter, path)?; // rl_core::LimitsFile, reloaded on SIGHUP
    }
    tracing::info!("demo users: alice (wonderland), bob (builder)");
    crate::serve(router(), "127.0.0.1:3001").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captchas_are_single_use() {
        let captchas = Captchas::default();
        let token = captchas.issue();
        assert!(captchas.redeem(&token));
        assert!(!captchas.redeem(&token));
        assert!(!captchas.redeem("forged"));
    }

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
