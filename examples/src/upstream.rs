//! The fourth showcase: budgets for calls *out* to an upstream that limits
//! us (a language model's API: requests and tokens per minute), shared by
//! every worker process through Redis.
//!
//! - [`MockUpstream`]: a strict upstream. Requests per minute and tokens per
//!   minute over a sliding minute (60 one-second buckets: the current one
//!   and the 59 before). A request asks for up to `max_tokens`; it is
//!   refused with `429`, `Retry-After` and remaining-count headers when its
//!   `max_tokens` does not fit what is left, else served, using a random
//!   number of tokens (a quarter to all of `max_tokens`) that only its
//!   response tells.
//! - [`worker`]: callers that draw on one budget in Redis before each
//!   request (requests at 1, tokens at `max_tokens` as the estimate), wait
//!   for room instead of failing, settle the real tokens from each
//!   response, and share any `429`'s `Retry-After` with every other worker:
//!   reqwest with ratewall's middleware ([`UpstreamMiddleware`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ratewall::reqwest::{Cost, UpstreamMiddleware, refusal};
use ratewall::{
    Algorithm, CallSpec, FailurePolicy, GroupSpec, Limit, Limiter,
    upstream::{Auto, Counts, Draw},
};
use serde::{Deserialize, Serialize};

/// Buckets of the sliding minute.
const BUCKETS: usize = 60;

/// A request to the upstream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Completion {
    /// The most tokens the answer may use.
    pub max_tokens: u64,
}

/// The upstream's answer: what the request used.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens used, known only now.
    pub total_tokens: u64,
}

/// What the upstream served and refused so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// Requests served.
    pub requests: u64,
    /// Tokens served.
    pub tokens: u64,
    /// Requests refused with `429`.
    pub refused: u64,
}

/// One second's requests and tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    second: u64,
    requests: u64,
    tokens: u64,
}

/// What the upstream did in one second (its history, for the plot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the epoch.
    pub second: u64,
    /// Requests served.
    pub requests: u64,
    /// Tokens served.
    pub tokens: u64,
    /// Requests refused with `429`.
    pub refused: u64,
    /// Its token limit then.
    pub tpm: u64,
    /// The longest `Retry-After` it said then (seconds; 0: none).
    #[serde(default)]
    pub retry_after: u64,
}

#[derive(Debug)]
struct Window {
    buckets: [Bucket; BUCKETS],
    served: Served,
    seed: u64,
    history: std::collections::BTreeMap<u64, Second>,
}

impl Window {
    /// Requests and tokens in the sliding minute ending in `second`.
    fn sums(&self, second: u64) -> (u64, u64) {
        self.buckets
            .iter()
            .filter(|b| b.second + (BUCKETS as u64) > second && b.second <= second)
            .fold((0, 0), |(r, t), b| (r + b.requests, t + b.tokens))
    }

    /// Seconds until `requests` more requests and `tokens` more tokens fit
    /// (at least 1): when enough of the oldest buckets have left.
    fn retry_after(&self, second: u64, rpm: u64, tpm: u64, tokens: u64) -> u64 {
        (1..=BUCKETS as u64)
            .find(|ahead| {
                let (r, t) = self.sums(second + ahead);
                r < rpm && t + tokens <= tpm
            })
            .unwrap_or(BUCKETS as u64)
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The strict upstream (see the module docs). Its limits may be changed
/// while it runs ([`MockUpstream::set_limits`]), without telling anyone.
#[derive(Debug, Clone)]
pub struct MockUpstream {
    rpm: Arc<AtomicU64>,
    tpm: Arc<AtomicU64>,
    says_limits: Arc<AtomicBool>,
    window: Arc<std::sync::Mutex<Window>>,
}

impl MockUpstream {
    /// An upstream admitting `rpm` requests and `tpm` tokens per sliding
    /// minute.
    pub fn new(rpm: u64, tpm: u64) -> Self {
        Self {
            rpm: Arc::new(AtomicU64::new(rpm)),
            tpm: Arc::new(AtomicU64::new(tpm)),
            says_limits: Arc::new(AtomicBool::new(true)),
            window: Arc::new(std::sync::Mutex::new(Window {
                buckets: [Bucket::default(); BUCKETS],
                served: Served::default(),
                seed: 0x9E37_79B9_7F4A_7C15,
                history: std::collections::BTreeMap::new(),
            })),
        }
    }

    /// Whether each answer says the limits
    /// (`x-ratelimit-limit-requests` / `-tokens`, as OpenAI's API does; on
    /// by default). Off, a budget has only `429`s to learn them from.
    pub fn saying_limits(self, says: bool) -> Self {
        self.says_limits.store(says, Ordering::SeqCst);
        self
    }

    /// Changes the limits from now on.
    pub fn set_limits(&self, rpm: u64, tpm: u64) {
        self.rpm.store(rpm, Ordering::SeqCst);
        self.tpm.store(tpm, Ordering::SeqCst);
    }

    /// What it served and refused so far.
    pub fn served(&self) -> Served {
        self.window.lock().expect("upstream window").served
    }

    /// What it did, second by second.
    pub fn history(&self) -> Vec<Second> {
        let window = self.window.lock().expect("upstream window");
        window.history.values().copied().collect()
    }

    /// Requests and tokens served in the sliding minute ending now (what
    /// its limits bound).
    pub fn last_minute(&self) -> (u64, u64) {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        self.window.lock().expect("upstream window").sums(second)
    }

    /// Answers one request: served with its usage, or `429`.
    pub fn complete(&self, request: Completion) -> (StatusCode, HeaderMap, Option<Usage>) {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        let (rpm, tpm) = (
            self.rpm.load(Ordering::SeqCst),
            self.tpm.load(Ordering::SeqCst),
        );
        let mut window = self.window.lock().expect("upstream window");
        let (requests, tokens) = window.sums(second);
        let mut headers = HeaderMap::new();
        let mut header = |name: &'static str, value: u64| {
            headers.insert(name, HeaderValue::from(value));
        };
        if self.says_limits.load(Ordering::SeqCst) {
            header("x-ratelimit-limit-requests", rpm);
            header("x-ratelimit-limit-tokens", tpm);
        }
        let this_second = window.history.entry(second).or_insert(Second {
            second,
            tpm,
            ..Second::default()
        });
        if requests >= rpm || tokens + request.max_tokens > tpm {
            this_second.refused += 1;
            window.served.refused += 1;
            let wait = window.retry_after(second, rpm, tpm, request.max_tokens);
            if let Some(this_second) = window.history.get_mut(&second) {
                this_second.retry_after = this_second.retry_after.max(wait);
            }
            header("retry-after", wait);
            header(
                "x-ratelimit-remaining-requests",
                rpm.saturating_sub(requests),
            );
            header("x-ratelimit-remaining-tokens", tpm.saturating_sub(tokens));
            return (StatusCode::TOO_MANY_REQUESTS, headers, None);
        }
        let quarter = (request.max_tokens / 4).max(1);
        let used = quarter + window.random() % (request.max_tokens - quarter + 1);
        let bucket = &mut window.buckets[(second % BUCKETS as u64) as usize];
        if bucket.second != second {
            *bucket = Bucket {
                second,
                ..Bucket::default()
            };
        }
        bucket.requests += 1;
        bucket.tokens += used;
        if let Some(this_second) = window.history.get_mut(&second) {
            this_second.requests += 1;
            this_second.tokens += used;
        }
        window.served.requests += 1;
        window.served.tokens += used;
        header("x-ratelimit-remaining-requests", rpm - requests - 1);
        header(
            "x-ratelimit-remaining-tokens",
            tpm.saturating_sub(tokens + used),
        );
        (StatusCode::OK, headers, Some(Usage { total_tokens: used }))
    }

    /// The upstream as an HTTP service: `POST /v1/complete` with a
    /// [`Completion`], `GET /served`, `GET /history` (what it did, second
    /// by second).
    pub fn router(&self) -> axum::Router {
        async fn complete(
            State(upstream): State<MockUpstream>,
            Json(request): Json<Completion>,
        ) -> Response {
            match upstream.complete(request) {
                (status, headers, Some(usage)) => (status, headers, Json(usage)).into_response(),
                (status, headers, None) => (status, headers).into_response(),
            }
        }
        async fn served(State(upstream): State<MockUpstream>) -> Json<Served> {
            Json(upstream.served())
        }
        async fn history(State(upstream): State<MockUpstream>) -> Json<Vec<Second>> {
            Json(upstream.history())
        }
        axum::Router::new()
            .route("/v1/complete", axum::routing::post(complete))
            .route("/served", axum::routing::get(served))
            .route("/history", axum::routing::get(history))
            .with_state(self.clone())
    }

    /// Serves it on `listener` until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }
}

/// What one worker process did.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Requests sent to the upstream.
    pub sent: u64,
    /// Of them, refused by the upstream (`429`).
    pub refused_upstream: u64,
    /// Tokens the served requests used.
    pub tokens: u64,
    /// Calls the budget refused (no room within the wait): never sent.
    pub refused_by_budget: u64,
    /// Round trips to the limiter's store (decisions, a waiting call's
    /// retries included, settlements, holds; not learning's) per request
    /// sent; 0 on the in-memory store.
    pub store_calls_per_request: f64,
    /// The tokens-per-minute limit the budget ended with (learned, with
    /// [`Auto`]; else as stated).
    pub final_tpm: u64,
}

/// The budget every worker shares: the upstream's limits, each group
/// counted like the upstream counts (a sliding minute of one-second slots).
///
/// A budget that may be wrong (`spread`: one that finds the limit) also
/// spreads each minute (a quarter of it per sliding 15 s): a minute's
/// budget is then not spent in its first second, so an upstream that
/// lowered its limit refuses the few calls of one moment, not a minute's
/// burst. Both are window algorithms, so a waiting call retries them
/// together. A budget known to match the upstream does not need it: each
/// admission fits what the upstream has left.
pub fn budget(rpm: u64, tpm: u64, spread: bool) -> Result<CallSpec, ratewall::error::LimitError> {
    let minute = |n: u64| -> Result<Vec<Limit>, ratewall::error::LimitError> {
        let mut limits = vec![
            Limit::per_minute(n)?
                .with_algorithm(Algorithm::SlidingWindow)?
                .with_slots(60)?,
        ];
        if spread {
            limits.push(
                Limit::new((n / 4).max(1), Duration::from_secs(15))?
                    .with_algorithm(Algorithm::SlidingWindow)?
                    .with_slots(15)?,
            );
        }
        Ok(limits)
    };
    // A store that cannot decide refuses: the upstream's limit is not ours
    // to guess.
    Ok(CallSpec::owned(
        "upstream",
        vec![
            GroupSpec::owned("upstream_rpm", minute(rpm)?),
            GroupSpec::owned("upstream_tpm", minute(tpm)?).settled(),
        ],
    )
    .with_policy(FailurePolicy::FailClosed))
}

/// Runs `concurrency` callers for `run`, each asking for a random
/// `max_tokens` in `1 ..= max_tokens` per request through `limiter`'s
/// budget `spec` (finding the upstream's limit with `auto`, when given),
/// against the upstream at `url`, with reqwest and the budget's
/// middleware ([`UpstreamMiddleware`]).
pub async fn worker(
    limiter: Arc<Limiter>,
    spec: CallSpec,
    auto: Option<Auto>,
    url: String,
    concurrency: usize,
    max_tokens: u64,
    run: Duration,
) -> WorkerReport {
    let store_calls = count_store_calls();
    let tpm_group = spec.groups()[1].clone();
    // The budget: each request draws on it (1 request, its `max_tokens` as
    // the tokens' estimate: `Draw`s below), waits for room, is settled at
    // the tokens its answer used (read as the caller reads the body), and
    // shares a 429's `Retry-After` with every worker, finding the limit
    // from the refusals with `auto`. The budget alone keeps the upstream
    // from refusing: the remaining counts its answers say are not read
    // (`[Counts::Requests, Counts::Tokens]` would bound the budget by them
    // too, a store call per group and answer).
    let counts = [Counts::Nothing, Counts::Nothing];
    let budget = UpstreamMiddleware::new(limiter.clone(), spec, counts, |_: &_| {
        Draw::new(["model"; 2])
    })
    .settle_with(|_: &_| {
        Cost::body(|body| Some(serde_json::from_slice::<Usage>(body).ok()?.total_tokens))
    });
    let budget = auto.into_iter().fold(budget, UpstreamMiddleware::auto);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(budget)
        .build();
    let started = Instant::now();
    let report = Arc::new(std::sync::Mutex::new(WorkerReport::default()));
    let mut callers = Vec::new();
    for caller in 0..concurrency {
        let (http, url, report) = (http.clone(), url.clone(), report.clone());
        callers.push(tokio::spawn(async move {
            let mut seed = 0x2545_F491_4F6C_DD1Du64.wrapping_mul(caller as u64 + 1) | 1;
            while started.elapsed() < run {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let estimate = 1 + seed % max_tokens;
                let left = run.saturating_sub(started.elapsed());
                let answer = http
                    .post(format!("{url}/v1/complete"))
                    .json(&Completion {
                        max_tokens: estimate,
                    })
                    // Its estimate, and no waiting past the run.
                    .with_extension(Draw::new(["model"; 2]).costs([1, estimate]).wait(left))
                    .send()
                    .await;
                let answer = match answer {
                    Ok(answer) => answer,
                    Err(error) => {
                        // No room within the run (or the store failed): come
                        // back when there may be, not before.
                        if let Some(refused) = refusal(&error) {
                            report.lock().expect("report").refused_by_budget += 1;
                            let wait = refused.retry_after().unwrap_or(Duration::from_secs(1));
                            tokio::time::sleep(wait.min(left)).await;
                        }
                        // Not answered: the estimate stays taken.
                        continue;
                    }
                };
                let refused = answer.status() == StatusCode::TOO_MANY_REQUESTS;
                // Read to its end: the request is settled then.
                let usage = answer.json::<Usage>().await.ok();
                let mut report = report.lock().expect("report");
                report.sent += 1;
                if refused {
                    report.refused_upstream += 1;
                }
                report.tokens += usage.map_or(0, |u| u.total_tokens);
            }
        }));
    }
    for caller in callers {
        let _ = caller.await;
    }
    let mut report = *report.lock().expect("report");
    let sent = report.sent.max(1);
    report.store_calls_per_request = store_calls.load(Ordering::Relaxed) as f64 / sent as f64;
    report.final_tpm = limiter
        .settings()
        .limits(tpm_group.name())
        .map_or(tpm_group.limits()[0].threshold(), |limits| {
            limits[0].threshold()
        });
    report
}

/// Counts the limiter's calls to its store: each round trip's
/// `ratewall_backend_seconds` record (decisions, settlements, holds; not
/// what learning a limit asks), through a metrics recorder installed here
/// (none is counted when the process has another one).
fn count_store_calls() -> Arc<AtomicU64> {
    struct Counting(Arc<AtomicU64>);
    impl metrics::HistogramFn for Counting {
        fn record(&self, _: f64) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    impl metrics::Recorder for Counting {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            metrics::Counter::noop()
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            match key.name() {
                "ratewall_backend_seconds" => {
                    metrics::Histogram::from_arc(Arc::new(Counting(self.0.clone())))
                }
                _ => metrics::Histogram::noop(),
            }
        }
    }
    let calls = Arc::new(AtomicU64::new(0));
    if metrics::set_global_recorder(Counting(calls.clone())).is_err() {
        tracing::warn!("a metrics recorder was installed before: store calls are not counted");
    }
    calls
}

/// The whole number in the environment variable `name`, `default` when it
/// is not set (for the showcase's binaries).
pub fn env_number(name: &str, default: u64) -> Result<u64, crate::StartupError> {
    match std::env::var(name) {
        Ok(text) => text.parse().map_err(|_| {
            crate::StartupError::new(format!("{name} must be a whole number, got {text:?}"))
        }),
        Err(_) => Ok(default),
    }
}

/// The address the mock upstream binary listens on (`BIND`, default
/// `127.0.0.1:3004`).
pub fn bind_address() -> SocketAddr {
    std::env::var("BIND")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 3004)))
}
