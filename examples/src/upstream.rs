//! The fourth showcase: budgets for calls *out* to an upstream that limits
//! us (a language model's API: requests and tokens per window), shared by
//! every worker process through Redis.
//!
//! - [`MockUpstream`]: a strict upstream. Requests and tokens over a sliding
//!   window (10 s in 100 ms buckets by default: the current bucket and the
//!   ones before it). A request asks for up to `max_tokens`; it is refused
//!   with `429`, `Retry-After` (whole seconds, rounded up: when enough of
//!   the oldest buckets have left for it) and remaining-count headers when
//!   its `max_tokens` does not fit what is left, else served, using a
//!   random number of tokens (a quarter to all of `max_tokens`) that only
//!   its response tells. Every answer says what is left; it says its limits
//!   unless told not to.
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

/// One bucket's requests and tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// The bucket's index: milliseconds since the epoch over the bucket's
    /// length.
    index: u64,
    requests: u64,
    tokens: u64,
}

/// What the upstream did in one second (its history, for the plot and the
/// showcase's measures).
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
    /// Its token limit per window then.
    pub tpm: u64,
    /// Its request limit per window then.
    #[serde(default)]
    pub rpm: u64,
    /// The longest `Retry-After` it said then (seconds; 0: none).
    #[serde(default)]
    pub retry_after: u64,
}

/// The shape of the upstream's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Its length.
    pub window: Duration,
    /// How many buckets it counts in.
    pub buckets: u64,
}

impl Default for Shape {
    /// 10 s in 100 buckets of 100 ms.
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            buckets: 100,
        }
    }
}

impl Shape {
    fn bucket_ms(&self) -> u64 {
        (self.window.as_millis() as u64 / self.buckets.max(1)).max(1)
    }
}

#[derive(Debug)]
struct Window {
    shape: Shape,
    buckets: Vec<Bucket>,
    served: Served,
    seed: u64,
    history: std::collections::BTreeMap<u64, Second>,
}

impl Window {
    /// Requests and tokens in the sliding window ending in bucket `index`.
    fn sums(&self, index: u64) -> (u64, u64) {
        let n = self.shape.buckets;
        self.buckets
            .iter()
            .filter(|b| b.index + n > index && b.index <= index)
            .fold((0, 0), |(r, t), b| (r + b.requests, t + b.tokens))
    }

    /// Whole seconds from `now_ms` until one more request of `tokens`
    /// fits (at least 1): when enough of the oldest buckets have left.
    fn retry_after(&self, now_ms: u64, limits: (u64, u64), tokens: u64) -> u64 {
        let size = self.shape.bucket_ms();
        let index = now_ms / size;
        let free_at = (1..=self.shape.buckets)
            .find(|ahead| {
                let (r, t) = self.sums(index + ahead);
                r < limits.0 && t + tokens <= limits.1
            })
            .unwrap_or(self.shape.buckets);
        let wait_ms = (index + free_at) * size - now_ms;
        wait_ms.div_ceil(1_000).max(1)
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}

/// The strict upstream (see the module docs). Its limits may be changed
/// while it runs ([`MockUpstream::set_limits`]), without telling anyone.
#[derive(Debug, Clone)]
pub struct MockUpstream {
    requests: Arc<AtomicU64>,
    tokens: Arc<AtomicU64>,
    says_limits: Arc<AtomicBool>,
    says_left: Arc<AtomicBool>,
    window: Arc<std::sync::Mutex<Window>>,
}

impl MockUpstream {
    /// An upstream admitting `requests` requests and `tokens` tokens per
    /// sliding window of the default [`Shape`] (10 s in 100 ms buckets).
    pub fn new(requests: u64, tokens: u64) -> Self {
        Self::shaped(requests, tokens, Shape::default())
    }

    /// An upstream admitting `requests` requests and `tokens` tokens per
    /// sliding window of `shape`.
    pub fn shaped(requests: u64, tokens: u64, shape: Shape) -> Self {
        Self {
            requests: Arc::new(AtomicU64::new(requests)),
            tokens: Arc::new(AtomicU64::new(tokens)),
            says_limits: Arc::new(AtomicBool::new(true)),
            says_left: Arc::new(AtomicBool::new(true)),
            window: Arc::new(std::sync::Mutex::new(Window {
                shape,
                buckets: vec![Bucket::default(); shape.buckets.max(1) as usize],
                served: Served::default(),
                seed: 0x9E37_79B9_7F4A_7C15,
                history: std::collections::BTreeMap::new(),
            })),
        }
    }

    /// Whether each answer says the limits
    /// (`x-ratelimit-limit-requests` / `-tokens`, as OpenAI's API does; on
    /// by default). Off, a budget has only `429`s and remaining counts to
    /// learn them from.
    pub fn saying_limits(self, says: bool) -> Self {
        self.says_limits.store(says, Ordering::SeqCst);
        self
    }

    /// Whether a served answer says what is left
    /// (`x-ratelimit-remaining-requests` / `-tokens`; on by default). A
    /// refusal always does. Off, a budget that finds the limit hears it
    /// only from refusals.
    pub fn saying_left(self, says: bool) -> Self {
        self.says_left.store(says, Ordering::SeqCst);
        self
    }

    /// Changes the limits from now on.
    pub fn set_limits(&self, requests: u64, tokens: u64) {
        self.requests.store(requests, Ordering::SeqCst);
        self.tokens.store(tokens, Ordering::SeqCst);
    }

    /// Its limits now: requests and tokens per window.
    pub fn limits(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::SeqCst),
            self.tokens.load(Ordering::SeqCst),
        )
    }

    /// The shape of its window.
    pub fn shape(&self) -> Shape {
        self.window.lock().expect("upstream window").shape
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

    /// Requests and tokens served in the sliding window ending now (what
    /// its limits bound).
    pub fn last_window(&self) -> (u64, u64) {
        let window = self.window.lock().expect("upstream window");
        window.sums(now_ms() / window.shape.bucket_ms())
    }

    /// Answers one request: served with its usage, or `429`.
    pub fn complete(&self, request: Completion) -> (StatusCode, HeaderMap, Option<Usage>) {
        let now = now_ms();
        let second = now / 1_000;
        let limits = self.limits();
        let mut window = self.window.lock().expect("upstream window");
        let index = now / window.shape.bucket_ms();
        let (requests, tokens) = window.sums(index);
        let mut headers = HeaderMap::new();
        let mut header = |name: &'static str, value: u64| {
            headers.insert(name, HeaderValue::from(value));
        };
        if self.says_limits.load(Ordering::SeqCst) {
            header("x-ratelimit-limit-requests", limits.0);
            header("x-ratelimit-limit-tokens", limits.1);
        }
        // The limits of a second are those of its last request.
        let record = window.history.entry(second).or_insert(Second {
            second,
            ..Second::default()
        });
        (record.rpm, record.tpm) = limits;
        if requests >= limits.0 || tokens + request.max_tokens > limits.1 {
            window.served.refused += 1;
            let wait = window.retry_after(now, limits, request.max_tokens);
            if let Some(this_second) = window.history.get_mut(&second) {
                this_second.refused += 1;
                this_second.retry_after = this_second.retry_after.max(wait);
            }
            header("retry-after", wait);
            header(
                "x-ratelimit-remaining-requests",
                limits.0.saturating_sub(requests),
            );
            header(
                "x-ratelimit-remaining-tokens",
                limits.1.saturating_sub(tokens),
            );
            return (StatusCode::TOO_MANY_REQUESTS, headers, None);
        }
        let quarter = (request.max_tokens / 4).max(1);
        let used = quarter + window.random() % (request.max_tokens - quarter + 1);
        let n = window.shape.buckets;
        let bucket = &mut window.buckets[(index % n) as usize];
        if bucket.index != index {
            *bucket = Bucket {
                index,
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
        if self.says_left.load(Ordering::SeqCst) {
            header("x-ratelimit-remaining-requests", limits.0 - requests - 1);
            header(
                "x-ratelimit-remaining-tokens",
                limits.1.saturating_sub(tokens + used),
            );
        }
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

/// The budget every worker shares: `requests` and `tokens` per window of
/// `shape`, each group counted like the upstream counts (a sliding window
/// of its length, one slot per bucket), so that a call the budget admits
/// fits what the upstream has left, whatever the other workers did, and a
/// budget that finds the limit ([`Auto`]) reads in its own window what the
/// upstream counts. Each group is also paced: at most a tenth of it per
/// tenth of the window (a sliding window too: calls that wait retry them
/// together), so a window is not spent in its first moment. Unpaced,
/// callers waiting on a window send its whole budget at once when it
/// frees, then nothing: the upstream's window fills in bursts, a lowered
/// limit draws a burst of refusals, and what the window holds when the
/// upstream frees room says little of its limit.
pub fn budget(
    requests: u64,
    tokens: u64,
    shape: Shape,
) -> Result<CallSpec, ratewall::error::LimitError> {
    let window = |n: u64| -> Result<Vec<Limit>, ratewall::error::LimitError> {
        let tenth = shape.window / 10;
        Ok(vec![
            Limit::new(n, shape.window)?
                .with_algorithm(Algorithm::SlidingWindow)?
                .with_slots(shape.buckets)?,
            Limit::new((n / 10).max(1), tenth)?
                .with_algorithm(Algorithm::SlidingWindow)?
                .with_slots(10)?,
        ])
    };
    // A store that cannot decide refuses: the upstream's limit is not ours
    // to guess.
    Ok(CallSpec::owned(
        "upstream",
        vec![
            GroupSpec::owned("upstream_rpm", window(requests)?),
            GroupSpec::owned("upstream_tpm", window(tokens)?).settled(),
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
    // the tokens its answer used (read as the caller reads the body), shares
    // a 429's `Retry-After` with every worker, and with `auto` finds the
    // limit from what it hears, remaining counts included (a budget told
    // the limits needs nothing of the upstream but its refusals).
    let counts = match auto {
        Some(_) => [Counts::Requests, Counts::Tokens],
        None => [Counts::Nothing, Counts::Nothing],
    };
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

/// The window's shape from the environment: `WINDOW_MS` (default 10 000)
/// in `BUCKETS` buckets (default 100), for the showcase's binaries.
pub fn shape_from_env() -> Result<Shape, crate::StartupError> {
    let window = env_number("WINDOW_MS", 10_000)?;
    let buckets = env_number("BUCKETS", 100)?;
    if window == 0 || buckets == 0 || window % buckets != 0 {
        return Err(crate::StartupError::new(format!(
            "WINDOW_MS ({window}) must be a positive multiple of BUCKETS ({buckets})"
        )));
    }
    Ok(Shape {
        window: Duration::from_millis(window),
        buckets,
    })
}

/// The address the mock upstream binary listens on (`BIND`, default
/// `127.0.0.1:3004`).
pub fn bind_address() -> SocketAddr {
    std::env::var("BIND")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 3004)))
}
