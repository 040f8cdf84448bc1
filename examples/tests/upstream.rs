//! The upstream showcase's must-holds: four worker processes sharing one
//! budget in Redis call a strict upstream (600 requests and 60 000 tokens a
//! sliding minute) at a demand far above its limits.
//!
//! - With the upstream's limits known: it refuses (`429`) at most 0.5 % of
//!   their requests, and serves at least 90 % of its tokens a minute.
//! - With a budget that finds the limit (`AUTO=1`), stated 4 times too
//!   high, and an upstream that does not say its limits: at most 5 % refused
//!   over a minute, at least 80 % of its tokens served.
//! - With the upstream halving its limits mid-run without saying so (no
//!   limit headers): its `429`s stop within twice the `Retry-After` it gave,
//!   and from 30 s after the halving the tokens it serves are above 80 % of
//!   the new limit.
//!
//! A budget that finds the limit spreads each minute over four 15 s
//! windows, so its tokens go out in bursts every 15 s: rates are read over
//! whole multiples of 15 s.
//! The three runs go at once (each has its own Redis and upstream).

use std::process::{Command, Stdio};

use ratewall_examples::upstream::{MockUpstream, Second, WorkerReport};
use ratewall_tests::RedisServer;

const WORKER: &str = env!("CARGO_BIN_EXE_upstream-worker");

const RPM: u64 = 600;
const TPM: u64 = 60_000;

/// What a run did: the workers' reports and the upstream's history.
struct Run {
    reports: Vec<WorkerReport>,
    history: Vec<Second>,
    upstream: MockUpstream,
}

impl Run {
    /// Four workers of 8 callers for `secs` against `upstream`, with the
    /// worker environment `env` (`RPM`, `TPM`, `AUTO`, ...).
    async fn of(upstream: MockUpstream, secs: u64, env: &[(&str, String)]) -> Run {
        let redis = RedisServer::start();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        tokio::spawn(upstream.clone().serve(listener));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let mut worker = Command::new(WORKER);
                worker
                    .env("REDIS_URL", redis.url())
                    .env("UPSTREAM", &url)
                    .env("SECS", secs.to_string())
                    .env("CONCURRENCY", "8")
                    .env("MAX_TOKENS", "2000")
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::piped());
                for (name, value) in env {
                    worker.env(name, value);
                }
                worker.spawn().expect("start a worker")
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
        let history = upstream.history();
        let run = Run {
            reports,
            history,
            upstream,
        };
        let served = run.upstream.served();
        assert_eq!(
            run.sent(),
            served.requests + served.refused,
            "{:?}",
            run.reports
        );
        run
    }

    fn sent(&self) -> u64 {
        self.reports.iter().map(|r| r.sent).sum()
    }

    fn start(&self) -> u64 {
        self.history.first().map_or(0, |s| s.second)
    }

    /// Tokens served in seconds `from .. to` of the run.
    fn tokens(&self, from: u64, to: u64) -> u64 {
        let start = self.start();
        self.history
            .iter()
            .filter(|s| s.second >= start + from && s.second < start + to)
            .map(|s| s.tokens)
            .sum()
    }

    /// Requests refused in seconds `from .. to` of the run.
    fn refused(&self, from: u64, to: u64) -> u64 {
        let start = self.start();
        self.history
            .iter()
            .filter(|s| s.second >= start + from && s.second < start + to)
            .map(|s| s.refused)
            .sum()
    }

    /// Seconds of the run with a `429`, and the `Retry-After` said then.
    fn refusals(&self) -> Vec<(u64, u64)> {
        let start = self.start();
        self.history
            .iter()
            .filter(|s| s.refused > 0)
            .map(|s| (s.second - start, s.retry_after))
            .collect()
    }

    /// The tokens-per-minute limit each worker ended with.
    fn learned(&self) -> Vec<u64> {
        self.reports.iter().map(|r| r.final_tpm).collect()
    }

    /// Each worker's store calls per upstream call.
    fn store_calls(&self) -> Vec<f64> {
        self.reports
            .iter()
            .map(|r| r.store_calls_per_request)
            .collect()
    }

    /// Tokens served each 15 s from `from` to `to`, for the failure
    /// messages and the log.
    fn timeline(&self, from: u64, to: u64) -> Vec<u64> {
        (from..to)
            .step_by(15)
            .map(|t| self.tokens(t, t + 15))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_share_one_budget_and_the_upstream_barely_refuses_them() {
    // 2 % under the upstream's limits: headroom for the time between our
    // decision and the upstream's (a request decided in one second may
    // reach it in the next, and leave its minute a second later).
    let env = [
        ("RPM", (RPM * 98 / 100).to_string()),
        ("TPM", (TPM * 98 / 100).to_string()),
    ];
    let run = Run::of(MockUpstream::new(RPM, TPM), 75, &env).await;
    let sent = run.sent();
    // Demand far above the limits: every worker met a full budget.
    assert!(
        run.reports.iter().all(|r| r.refused_by_budget > 0),
        "{:?}",
        run.reports
    );
    let served = run.upstream.served();
    let refused_share = served.refused as f64 / sent as f64;
    assert!(
        refused_share <= 0.005,
        "the upstream refused {} of {sent} ({:.2} %): {:?}",
        served.refused,
        refused_share * 100.0,
        run.reports
    );
    // Steady state: the minute after the first 15 s (whole windows).
    let minute = run.tokens(15, 75);
    let utilisation = minute as f64 / TPM as f64;
    assert!(
        utilisation >= 0.90,
        "the upstream served {minute} of its {TPM} tokens a minute ({:.1} %): per 15 s {:?}",
        utilisation * 100.0,
        run.timeline(0, 75)
    );
    eprintln!(
        "known limits: served {} requests and {} tokens in 75 s, {minute} in the minute from 15 s ({:.1} % of TPM), \
         refused {} ({:.2} %); store calls per request: {:?}",
        served.requests,
        served.tokens,
        utilisation * 100.0,
        served.refused,
        refused_share * 100.0,
        run.store_calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_stated_four_times_too_high_finds_the_limit_within_a_minute() {
    let env = [
        ("RPM", (RPM * 4).to_string()),
        ("TPM", (TPM * 4).to_string()),
        ("AUTO", "1".to_owned()),
    ];
    let upstream = MockUpstream::new(RPM, TPM).saying_limits(false);
    let run = Run::of(upstream, 60, &env).await;
    let sent = run.sent();
    let refused = run.refused(0, 60);
    let share = refused as f64 / sent as f64;
    assert!(
        share <= 0.05,
        "the upstream refused {refused} of {sent} ({:.1} %) at {:?}",
        share * 100.0,
        run.refusals()
    );
    // The first refusal's pause (45 s of the minute: full in 15 s, four
    // times too fast) takes the budget to the real limit in one step.
    let learned = run.learned();
    assert!(
        learned.iter().all(|tpm| *tpm <= TPM * 3 / 2),
        "learned within 1.5x of the real limit: {learned:?}, refusals {:?}",
        run.refusals()
    );
    let minute = run.tokens(0, 60);
    let utilisation = minute as f64 / TPM as f64;
    assert!(
        utilisation >= 0.80,
        "served {minute} of {TPM} tokens in the minute ({:.1} %): per 15 s {:?}",
        utilisation * 100.0,
        run.timeline(0, 60)
    );
    eprintln!(
        "auto from 4x: refused {refused} of {sent} ({:.2} %) at {:?}, {minute} tokens in 60 s ({:.1} % of TPM), \
         learned TPM per worker {:?}, store calls per request {:?}",
        share * 100.0,
        run.refusals(),
        utilisation * 100.0,
        learned,
        run.store_calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_halving_its_limits_unannounced_is_learned_by_every_worker() {
    const HALVED_AT: u64 = 40;
    const SECS: u64 = 130;
    let env = [
        ("RPM", (RPM * 98 / 100).to_string()),
        ("TPM", (TPM * 98 / 100).to_string()),
        ("AUTO", "1".to_owned()),
    ];
    let upstream = MockUpstream::new(RPM, TPM).saying_limits(false);
    let halving = upstream.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(HALVED_AT)).await;
        halving.set_limits(RPM / 2, TPM / 2);
    });
    let run = Run::of(upstream, SECS, &env).await;
    let refusals = run.refusals();
    let after: Vec<_> = refusals
        .iter()
        .filter(|(second, _)| *second >= HALVED_AT)
        .collect();
    let (first, retry_after) = *after.first().copied().expect("the halving met a 429");
    let last = after.last().map_or(first, |(second, _)| *second);
    assert!(
        last <= first + 2 * retry_after,
        "429s went on past twice the first Retry-After ({retry_after} s): {refusals:?}"
    );
    // Back above 80 % of the new limit within 30 s: its rate from 30 s
    // after the halving to the end (four whole 15 s windows). Nothing could
    // be back sooner: the upstream's minute still held the old limit's
    // tokens, and it refuses until they leave (in our runs its minute held
    // about 1.4 times the new limit then, and had room for one request 20 s
    // later).
    let new_rate = (TPM / 2) as f64 / 60.0;
    let back = HALVED_AT + 30;
    let rate = run.tokens(back, SECS) as f64 / (SECS - back) as f64;
    assert!(
        rate >= 0.80 * new_rate,
        "{rate:.0} tokens/s from {back} s against the new limit's {new_rate:.0}: per 15 s {:?}",
        run.timeline(0, SECS)
    );
    let learned = run.learned();
    assert!(
        learned.iter().all(|tpm| *tpm <= TPM * 3 / 5),
        "every worker learned the lower limit: {learned:?}"
    );
    eprintln!(
        "halved at {HALVED_AT} s: 429s at (second, Retry-After) {refusals:?}; tokens per 15 s {:?}; \
         {rate:.0} tokens/s from {back} s ({:.1} % of the new limit), per 15 s from then {:?}; learned TPM {learned:?}; store calls per request {:?}",
        run.timeline(0, SECS),
        100.0 * rate / new_rate,
        run.timeline(back, SECS),
        run.store_calls()
    );
}
