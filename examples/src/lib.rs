//! Shared start-up code of the examples and showcase services.

use rl_core::LimiterBuilder;

/// Logs to stderr; `RUST_LOG` filters (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Uses Redis when `REDIS_URL` is set (a comma-separated list of node URLs
/// selects Redis Cluster), and the in-memory backend otherwise; says which.
pub async fn builder_from_env(builder: LimiterBuilder) -> Result<LimiterBuilder, Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let urls: Vec<&str> = url.split(',').map(str::trim).collect();
            let backend = if urls.len() > 1 {
                tracing::info!(nodes = urls.len(), "rate limiter backend: Redis Cluster");
                rl_redis::RedisBackend::connect_cluster(urls).await?
            } else {
                tracing::info!(url = %url, "rate limiter backend: Redis");
                rl_redis::RedisBackend::connect(&url).await?
            };
            Ok(builder.backend(backend))
        }
        _ => {
            tracing::info!("rate limiter backend: in-memory (set REDIS_URL to use Redis)");
            Ok(builder.memory())
        }
    }
}
