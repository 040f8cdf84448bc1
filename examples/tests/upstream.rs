//! The upstream showcase's must-hold: four worker processes sharing one
//! budget in Redis, calling a strict upstream (600 requests and 60 000
//! tokens a sliding minute) at a demand far above its limits, are refused
//! by it (`429`) for at most 0.5 % of their requests and get at least 90 %
//! of its tokens. They run 75 s: the first minute opens with a whole
//! minute's budget at once (a sliding minute starts full), so utilisation
//! is read over the last sliding minute, a minute of steady state.

use std::process::{Command, Stdio};

use ratewall_examples::upstream::{MockUpstream, WorkerReport};
use ratewall_tests::RedisServer;

const WORKER: &str = env!("CARGO_BIN_EXE_upstream-worker");

const RPM: u64 = 600;
const TPM: u64 = 60_000;
/// The workers' budget: 2 % under the upstream's limits, headroom for the
/// time between our decision and the upstream's (a request decided in one
/// second may reach it in the next, and leave its minute a second later).
const BUDGET_RPM: u64 = RPM * 98 / 100;
const BUDGET_TPM: u64 = TPM * 98 / 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_share_one_budget_and_the_upstream_barely_refuses_them() {
    let redis = RedisServer::start();
    let upstream = MockUpstream::new(RPM, TPM);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(upstream.clone().serve(listener));

    let workers: Vec<_> = (0..4)
        .map(|_| {
            Command::new(WORKER)
                .env("REDIS_URL", redis.url())
                .env("UPSTREAM", &url)
                .env("RPM", BUDGET_RPM.to_string())
                .env("TPM", BUDGET_TPM.to_string())
                .env("SECS", "75")
                .env("CONCURRENCY", "8")
                .env("MAX_TOKENS", "2000")
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    let reports: Vec<WorkerReport> = tokio::task::spawn_blocking(move || {
        workers
            .into_iter()
            .map(|worker| {
                let output = worker.wait_with_output().expect("a worker ran");
                assert!(output.status.success(), "a worker failed: {output:?}");
                let line = String::from_utf8(output.stdout).expect("utf-8");
                serde_json::from_str(line.trim()).expect("a report line")
            })
            .collect()
    })
    .await
    .expect("workers");
    let (_, last_minute) = upstream.last_minute();
    let served = upstream.served();
    let sent: u64 = reports.iter().map(|r| r.sent).sum();
    assert_eq!(sent, served.requests + served.refused, "{reports:?}");
    // Demand far above the limits: every worker met a full budget.
    assert!(
        reports.iter().all(|r| r.refused_by_budget > 0),
        "{reports:?}"
    );
    let refused_share = served.refused as f64 / sent as f64;
    assert!(
        refused_share <= 0.005,
        "the upstream refused {} of {sent} ({:.2} %): {reports:?}",
        served.refused,
        refused_share * 100.0
    );
    let utilisation = last_minute as f64 / TPM as f64;
    assert!(
        utilisation >= 0.90,
        "the upstream served {last_minute} of its {TPM} tokens in the last minute ({:.1} %): {reports:?}",
        utilisation * 100.0
    );
    eprintln!(
        "served {} requests and {} tokens in 75 s, {last_minute} in the last minute ({:.1} % of TPM), refused {} ({:.2} %); \
         store calls per request: {:?}",
        served.requests,
        served.tokens,
        utilisation * 100.0,
        served.refused,
        refused_share * 100.0,
        reports
            .iter()
            .map(|r| r.store_calls_per_request)
            .collect::<Vec<_>>()
    );
}
