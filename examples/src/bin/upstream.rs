//! The mock upstream of the `upstream` showcase (see
//! `ratewall_examples::upstream`): `REQUESTS` requests and `TOKENS` tokens
//! per sliding window (default 1 000 and 20 000) of `WINDOW_MS` (default
//! 10 000) counted in `BUCKETS` buckets (default 100), on `BIND` (default
//! `127.0.0.1:3004`). `HALVE_AFTER` (seconds) halves both limits once,
//! without telling anyone. Each answer says the limits in
//! `x-ratelimit-limit-*` headers, as OpenAI's API does, unless
//! `SAYS_LIMITS=0`, and what is left unless `SAYS_LEFT=0` (a refusal always
//! does).

use std::time::Duration;

use ratewall_examples::StartupError;
use ratewall_examples::upstream::{MockUpstream, bind_address, env_number, shape_from_env};

async fn run() -> Result<(), StartupError> {
    ratewall_examples::init_tracing();
    let (requests, tokens) = (
        env_number("REQUESTS", 1_000)?,
        env_number("TOKENS", 20_000)?,
    );
    let upstream = MockUpstream::shaped(requests, tokens, shape_from_env()?)
        .saying_limits(env_number("SAYS_LIMITS", 1)? != 0)
        .saying_left(env_number("SAYS_LEFT", 1)? != 0);
    if let Ok(after) = std::env::var("HALVE_AFTER") {
        let after: u64 = after.parse().map_err(|_| {
            StartupError::new(format!("HALVE_AFTER must be seconds, got {after:?}"))
        })?;
        let halved = upstream.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(after)).await;
            halved.set_limits(requests / 2, tokens / 2);
            tracing::info!(
                requests = requests / 2,
                tokens = tokens / 2,
                "limits halved"
            );
        });
    }
    let addr = bind_address();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| StartupError::new(format!("cannot listen on {addr}: {e}")))?;
    tracing::info!(%addr, requests, tokens, "mock upstream listening");
    upstream
        .serve(listener)
        .await
        .map_err(|e| StartupError::new(format!("serving failed: {e}")))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("upstream", run().await)
}
