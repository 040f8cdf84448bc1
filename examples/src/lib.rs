//! Shared start-up code of the examples, and the two showcase services
//! ([`sms`] and [`login`]) as libraries so their binaries stay one line.

pub mod admin;
pub mod login;
pub mod sms;

use std::net::SocketAddr;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rl_core::LimiterBuilder;

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

/// Reads `redis+sentinel://host:26379[,host:26379...]/master-name` into the
/// sentinels' URLs and the master's name.
pub fn sentinel_url(url: &str) -> Option<(Vec<String>, String)> {
    let rest = url.trim().strip_prefix("redis+sentinel://")?;
    let (hosts, master) = rest.split_once('/')?;
    let master = master.trim_matches('/');
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{h}"))
        .collect();
    (!sentinels.is_empty() && !master.is_empty()).then(|| (sentinels, master.to_owned()))
}

/// Uses Redis when `REDIS_URL` is set — a comma-separated list of node URLs
/// selects Redis Cluster, `redis+sentinel://h1:26379,h2:26379/master` Redis
/// Sentinel — and the in-memory backend otherwise; says which.
pub async fn builder_from_env(
    builder: LimiterBuilder,
) -> Result<LimiterBuilder, Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let urls: Vec<&str> = url.split(',').map(str::trim).collect();
            let backend = if let Some((sentinels, master)) = sentinel_url(&url) {
                tracing::info!(sentinels = sentinels.len(), master = %master, "rate limiter backend: Redis Sentinel");
                rl_redis::RedisBackend::connect_sentinel(sentinels, master).await?
            } else if urls.len() > 1 {
                tracing::info!(nodes = urls.len(), "rate limiter backend: Redis Cluster");
                rl_redis::RedisBackend::connect_cluster(urls).await?
            } else {
                tracing::info!(url = %url, "rate limiter backend: Redis");
                rl_redis::RedisBackend::connect(url.as_str()).await?
            };
            Ok(builder.backend(backend))
        }
        _ => {
            tracing::info!("rate limiter backend: in-memory (set REDIS_URL to use Redis)");
            Ok(builder.memory())
        }
    }
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
/// available to [`rl_core::http::ClientIp`], until Ctrl-C / SIGTERM.
/// `TRUSTED_PROXIES` (comma-separated CIDRs) makes `X-Forwarded-For` from
/// those proxies count.
pub async fn serve(router: Router, default_bind: &str) -> std::io::Result<()> {
    let router = match std::env::var("TRUSTED_PROXIES") {
        Ok(list) => {
            let proxies: rl_core::http::TrustedProxies = list.parse().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("TRUSTED_PROXIES: {e}"),
                )
            })?;
            tracing::info!(?proxies, "X-Forwarded-For trusted from these proxies");
            router.layer(axum::Extension(proxies))
        }
        Err(_) => router,
    };
    let bind = std::env::var("BIND").unwrap_or_else(|_| default_bind.to_owned());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await
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
    algorithm: rl_core::Algorithm,
) -> Result<Vec<rl_core::Limit>, String> {
    let limits = rates
        .into_iter()
        .map(str::trim)
        .map(|rate| {
            rate.parse::<rl_core::Limit>()
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

/// Checks `Authorization: Bearer <token>` in constant time.
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
}

/// Applies the limits file at `path` ([`rl_core::LimitsFile`]: per limit
/// name its rates, algorithm, burst, `on_error` and `shadow`) to `limiter`
/// now, and again on every SIGHUP (Unix). A file that cannot be read or is
/// invalid on reload is logged and the limits in force are kept; names
/// removed from the file go back to their compiled-in settings. Fails when
/// the file is bad at startup. Call it inside a Tokio runtime.
pub fn watch_limits_file<L>(
    limiter: L,
    path: impl Into<std::path::PathBuf>,
) -> Result<(), Box<dyn std::error::Error>>
where
    L: std::ops::Deref<Target = rl_core::Limiter> + Send + Sync + 'static,
{
    let path = path.into();
    let in_file = |error: rl_core::ConfigError| match error {
        rl_core::ConfigError::Read { .. } => BadLimitsFile(error.to_string()),
        _ => BadLimitsFile(format!("limits file {}: {error}", path.display())),
    };
    let file = rl_core::LimitsFile::load(&path).map_err(in_file)?;
    file.apply(&limiter).map_err(in_file)?;
    tracing::info!(path = %path.display(), names = ?file.names().collect::<Vec<_>>(), "limits file applied");
    #[cfg(unix)]
    {
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            let mut current = file;
            while hangups.recv().await.is_some() {
                let reloaded = rl_core::LimitsFile::load(&path)
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

/// A limits file refused at startup. Its `Debug` is its message, so a `main`
/// returning it prints the message as written, not as an escaped string.
struct BadLimitsFile(String);

impl std::fmt::Debug for BadLimitsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for BadLimitsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadLimitsFile {}

#[cfg(test)]
mod tests {
    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let (sentinels, master) =
            super::sentinel_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster").unwrap();
        assert_eq!(
            sentinels,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]
        );
        assert_eq!(master, "mymaster");
        assert!(super::sentinel_url("redis://127.0.0.1:6379").is_none());
        assert!(super::sentinel_url("redis+sentinel://10.0.0.1:26379/").is_none());
    }
}
