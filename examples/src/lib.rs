//! Shared start-up code of the examples, the showcase services ([`sms`],
//! [`login`], [`gateway`], [`upstream`]) as libraries so their binaries stay short,
//! and the accuracy simulation behind `docs/accuracy.md` ([`accuracy`]).

#![forbid(unsafe_code)]
// An unpublished crate: its functions are the examples' own start-up code,
// read beside their callers, not an API with `# Errors` sections
// (`missing_errors_doc` holds the published crates).
#![allow(clippy::missing_errors_doc)]

pub mod accuracy;
pub mod captcha;
pub mod gateway;
pub mod login;
pub mod phone;
pub mod sms;
pub mod upstream;

use std::net::SocketAddr;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use ratewall::builder::LimiterBuilder;

/// Logs to stderr; `RUST_LOG` filters (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Why a program could not start: one sentence naming what failed and
/// where, with no secret in it (Redis URLs go through
/// [`ratewall_redis::redact_url`]). Its `Debug` is its message too, so it reads
/// the same however it is printed.
pub struct StartupError(String);

impl StartupError {
    /// A start-up failure described by `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for StartupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for StartupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartupError {}

/// The exit code of a program whose `main` ended with `result`: success, or
/// `1` after printing `program: <the error>` as one line on stderr.
pub fn exit_code(program: &str, result: Result<(), StartupError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long start-up waits for Redis to answer.
const REDIS_STARTUP_TIMEOUT: std::time::Duration =
    ratewall_redis::RedisBackend::DEFAULT_CONNECT_TIMEOUT;

/// Reads a Redis URL in the one grammar of [`ratewall_redis::RedisUrl`] (a
/// server, comma-separated cluster nodes, or
/// `redis+sentinel://h1:26379,h2:26379/master`), as the services read
/// `REDIS_URL`: a refusal names the variable, then what is wrong.
pub fn redis_url(text: &str) -> Result<ratewall_redis::RedisUrl, StartupError> {
    text.parse()
        .map_err(|error| StartupError::new(format!("REDIS_URL: {error}")))
}

/// The Redis backend `REDIS_URL` names ([`redis_url`]: a server, a
/// comma-separated list of node URLs for Redis Cluster,
/// `redis+sentinel://h1:26379,h2:26379/master` for Redis Sentinel), or
/// `None` when it is unset (the in-memory backend); says which, URLs
/// masked. Each Redis node is asked `PING` first, so a failure is reported
/// as what it is (authentication required or refused, no answer,
/// connection refused, not a Redis server, TLS or not) and where.
pub async fn backend_from_env() -> Result<Option<ratewall_redis::RedisBackend>, StartupError> {
    let text = match std::env::var("REDIS_URL") {
        Ok(text) if !text.trim().is_empty() => text,
        _ => {
            tracing::info!("rate limiter backend: in-memory (set REDIS_URL to use Redis)");
            return Ok(None);
        }
    };
    let url = redis_url(&text)?;
    let shown: Vec<String> = url
        .nodes()
        .iter()
        .map(|u| ratewall_redis::redact_url(u))
        .collect();
    let target = if let Some(master) = url.master_name() {
        tracing::info!(sentinels = %shown.join(","), master = %master, "rate limiter backend: Redis Sentinel");
        format!(
            "the master `{master}` of the sentinels {}",
            shown.join(", ")
        )
    } else {
        for node in url.nodes() {
            ping(node).await?;
        }
        let target = shown.join(", ");
        if url.is_cluster() {
            tracing::info!(nodes = %target, "rate limiter backend: Redis Cluster");
        } else {
            tracing::info!(url = %target, "rate limiter backend: Redis");
        }
        format!("Redis at {target}")
    };
    let backend = url
        .connect()
        .await
        .map_err(|error| backend_failed(&target, &error))?;
    Ok(Some(backend))
}

/// A backend that did not connect, as a sentence naming `target`.
fn backend_failed(target: &str, error: &ratewall::error::BackendError) -> StartupError {
    match error {
        ratewall::error::BackendError::Timeout(after) => StartupError::new(format!(
            "{target} did not answer within {} s",
            after.as_secs_f64()
        )),
        other => StartupError::new(format!("cannot use {target}: {other}")),
    }
}

/// Connects to one Redis node (a URL [`redis_url`] accepted) and asks
/// `PING`, turning what goes wrong into a sentence that names the node
/// (credentials masked). What `PING` cannot tell apart (an answer that is
/// not Redis, a reset) is left to the backend's connect, which looks at
/// the address and says what answers there; so is a TLS node
/// (`rediss://`, `valkeys://`): ratewall-redis makes its TLS connections
/// itself, and redis-rs here has no TLS of its own (its TLS would set the
/// process-wide rustls provider).
async fn ping(url: &str) -> Result<(), StartupError> {
    let shown = ratewall_redis::redact_url(url);
    let lower = url.trim_start().to_ascii_lowercase();
    if lower.starts_with("rediss") || lower.starts_with("valkeys") {
        return Ok(());
    }
    let client = redis::Client::open(url).map_err(|error| {
        StartupError::new(format!("REDIS_URL: invalid Redis URL `{shown}`: {error}"))
    })?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REDIS_STARTUP_TIMEOUT))
        .set_response_timeout(Some(REDIS_STARTUP_TIMEOUT));
    let answered = tokio::time::timeout(REDIS_STARTUP_TIMEOUT, async {
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
    })
    .await;
    let no_answer = || {
        StartupError::new(format!(
            "Redis at {shown} did not answer within {} s",
            REDIS_STARTUP_TIMEOUT.as_secs_f64()
        ))
    };
    let error = match answered {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(error)) => error,
        Err(_) => return Err(no_answer()),
    };
    let reason = if error.is_timeout() {
        return Err(no_answer());
    } else if error.kind() == redis::ErrorKind::AuthenticationFailed {
        "refused the user name or password given in REDIS_URL (authentication failed)".to_owned()
    } else if error.code() == Some("NOAUTH") {
        "requires a password (authentication required): give it in REDIS_URL, e.g. redis://:PASSWORD@host:6379/".to_owned()
    } else if error.is_connection_refusal() {
        "refused the connection (is redis-server running there?)".to_owned()
    } else if error.is_io_error() || error.kind() == redis::ErrorKind::Parse {
        return Ok(());
    } else {
        format!("answered PING with an error: {error}")
    };
    Err(StartupError::new(format!("Redis at {shown} {reason}")))
}

/// `builder` on the backend [`backend_from_env`] chooses.
pub async fn builder_from_env(builder: LimiterBuilder) -> Result<LimiterBuilder, StartupError> {
    Ok(match backend_from_env().await? {
        Some(redis) => builder.backend(redis),
        None => builder.memory(),
    })
}

/// Installs `builder`'s limiter as the global one.
pub fn install(builder: LimiterBuilder) -> Result<&'static ratewall::Limiter, StartupError> {
    builder
        .install()
        .map_err(|error| StartupError::new(format!("cannot set up the rate limiter: {error}")))
}

/// Installs the Prometheus recorder and returns a router serving `GET /metrics`.
pub fn metrics_router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(handle) => Router::new().route(
            "/metrics",
            axum::routing::get(move || async move { handle.render() }),
        ),
        Err(error) => {
            tracing::warn!(%error, "metrics recorder not installed");
            Router::new()
        }
    }
}

/// Serves `router` on `BIND` (or `default_bind`) with the peer address
/// available to [`ratewall::http::ClientIp`], until Ctrl-C / SIGTERM.
/// `TRUSTED_PROXIES` (comma-separated CIDRs) makes `X-Forwarded-For` from
/// those proxies count.
pub async fn serve(router: Router, default_bind: &str) -> Result<(), StartupError> {
    let router = match std::env::var("TRUSTED_PROXIES") {
        Ok(list) => {
            let proxies: ratewall::http::TrustedProxies = list.parse().map_err(|e| {
                StartupError::new(format!("TRUSTED_PROXIES is not a list of CIDRs: {e}"))
            })?;
            tracing::info!(?proxies, "X-Forwarded-For trusted from these proxies");
            router.layer(axum::Extension(proxies))
        }
        Err(_) => router,
    };
    let bind = std::env::var("BIND").unwrap_or_else(|_| default_bind.to_owned());
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|e| StartupError::new(format!("cannot listen on {bind} (BIND): {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartupError::new(format!("cannot listen on {bind} (BIND): {e}")))?;
    tracing::info!(%addr, "listening");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await
    .map_err(|e| StartupError::new(format!("serving on {addr} failed: {e}")))
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Parses rates such as `"5/1h"` with `algorithm`; the error names the bad rate.
pub fn parse_rates<'a>(
    rates: impl IntoIterator<Item = &'a str>,
    algorithm: ratewall::Algorithm,
) -> Result<Vec<ratewall::Limit>, String> {
    let limits = rates
        .into_iter()
        .map(str::trim)
        .map(|rate| {
            rate.parse::<ratewall::Limit>()
                .and_then(|limit| limit.with_algorithm(algorithm))
                .map_err(|e| format!("{rate:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if limits.is_empty() {
        return Err("at least one rate is needed".into());
    }
    Ok(limits)
}

/// The JSON body of a request, or the `400` answering a malformed one.
#[allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response to send, as in axum's own rejections; boxing it buys nothing"
)]
pub fn json_body<T>(
    body: Result<axum::Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, Response> {
    body.map(|axum::Json(value)| value).map_err(|rejection| {
        json_error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &rejection.body_text(),
        )
    })
}

/// A JSON error response: `{"error": code, "message": message}`.
pub fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": code, "message": message })),
    )
        .into_response()
}

/// `?for=1h` on an admin route that lists an identity: how long the entry
/// lasts (none: until removed).
#[derive(Debug, serde::Deserialize)]
pub struct ListFor {
    /// A duration such as `90s` or `1h`.
    #[serde(rename = "for")]
    pub duration: Option<String>,
}

/// Puts `identity` on the list `list` (`allow` or `deny`) of the limit
/// `name`, for as long as `listed_for` says. `Err` is the response to
/// answer: `404 unknown_list` for another list, `400 bad_duration`, or
/// `503 limiter_unavailable` when the limiter cannot store the entry.
pub async fn change_list(
    limiter: &ratewall::Limiter,
    list: &str,
    name: &str,
    identity: &(dyn std::fmt::Display + Sync),
    listed_for: &ListFor,
) -> Result<(), Response> {
    let until = match listed_for
        .duration
        .as_deref()
        .map(ratewall::clock::parse_duration)
    {
        None => None,
        Some(Ok(duration)) => Some(std::time::SystemTime::now() + duration),
        Some(Err(error)) => {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                "bad_duration",
                &error.to_string(),
            ));
        }
    };
    let done = match list {
        "allow" => limiter.settings().allow(Some(name), identity, until).await,
        "deny" => limiter.settings().deny(Some(name), identity, until).await,
        other => {
            return Err(json_error(
                StatusCode::NOT_FOUND,
                "unknown_list",
                &format!("no list {other:?}: expected allow or deny"),
            ));
        }
    };
    done.map_err(|error| limiter_unavailable(&error))
}

/// Takes `identity` off the lists of the limit `name`: `{"unlisted": bool}`,
/// or `503 limiter_unavailable`.
pub async fn unlist(
    limiter: &ratewall::Limiter,
    name: &str,
    identity: &(dyn std::fmt::Display + Sync),
) -> Response {
    match limiter.settings().unlist(Some(name), identity).await {
        Ok(removed) => axum::Json(serde_json::json!({ "unlisted": removed })).into_response(),
        Err(error) => limiter_unavailable(&error),
    }
}

/// Seconds until a list entry expires, from now (`None`: it does not).
pub fn expires_in_s(entry: &ratewall::lists::ListEntry) -> Option<u64> {
    entry.expires_at.map(|at| {
        at.duration_since(std::time::SystemTime::now())
            .map_or(0, |d| d.as_secs())
    })
}

fn limiter_unavailable(error: &ratewall::Error) -> Response {
    json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "limiter_unavailable",
        &error.to_string(),
    )
}

/// Checks `Authorization: Bearer <token>`: the scheme in any case (RFC 9110
/// § 11.1), then the token compared in constant time.
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, given)| {
            bool::from(
                given
                    .trim_start_matches(' ')
                    .as_bytes()
                    .ct_eq(token.as_bytes()),
            )
        })
}

/// Applies the limits file at `path` ([`ratewall::config::LimitsFile`]: per limit
/// name its rates, algorithm, burst, `on_error` and `shadow`) to `limiter`
/// now, and again on every SIGHUP (Unix). A file that cannot be read or is
/// invalid on reload is logged and the limits in force are kept; names
/// removed from the file go back to their compiled-in settings. Fails when
/// the file is bad at startup. Call it inside a Tokio runtime.
pub fn watch_limits_file<L>(
    limiter: L,
    path: impl Into<std::path::PathBuf>,
) -> Result<(), StartupError>
where
    L: std::ops::Deref<Target = ratewall::Limiter> + Send + Sync + 'static,
{
    let path = path.into();
    let in_file = |error: ratewall::config::ConfigError| match error {
        ratewall::config::ConfigError::Read { .. } => StartupError::new(error.to_string()),
        _ => StartupError::new(format!("limits file {}: {error}", path.display())),
    };
    let file = ratewall::config::LimitsFile::load(&path).map_err(in_file)?;
    file.apply(&limiter).map_err(in_file)?;
    tracing::info!(path = %path.display(), names = ?file.names().collect::<Vec<_>>(), "limits file applied");
    #[cfg(unix)]
    {
        let mut hangups = signal_hangup()?;
        tokio::spawn(async move {
            let mut current = file;
            while hangups.recv().await.is_some() {
                let reloaded = ratewall::config::LimitsFile::load(&path)
                    .and_then(|next| next.apply_over(&current, &limiter).map(|()| next));
                match reloaded {
                    Ok(next) => {
                        tracing::info!(path = %path.display(), names = ?next.names().collect::<Vec<_>>(), "limits file reloaded");
                        current = next;
                    }
                    Err(error) => tracing::error!(
                        path = %path.display(),
                        %error,
                        "limits file rejected; keeping the limits in force"
                    ),
                }
            }
        });
    }
    Ok(())
}

/// A stream of SIGHUPs (limits reload).
#[cfg(unix)]
pub fn signal_hangup() -> Result<tokio::signal::unix::Signal, StartupError> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| StartupError::new(format!("cannot listen for SIGHUP (limits reload): {e}")))
}
