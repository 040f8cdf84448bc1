//! What `#[rate_limit]` does at run time: which calls run their body, which
//! are refused, and what the refusal carries.
//!
//! Most tests pass their own limiter (`limiter = ...`) over a [`ManualClock`],
//! so they are deterministic and independent of each other. The global
//! limiter is process-wide: the one test that uses it installs it through
//! [`global_limiter`]; the "no limiter installed" case lives in its own
//! binary (`macro_not_installed.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use ratewall::{
    Algorithm, Limit, Limiter, Rejection,
    backend::{Backend, BoxFuture, Decisions, Request},
    clock::ManualClock,
    error::BackendError,
    rate_limit,
};

/// A limiter over a manual clock standing at an arbitrary instant.
fn manual_limiter() -> (Limiter, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .expect("valid limiter");
    (limiter, clock)
}

/// The process-global limiter, installed once for this test binary.
fn global_limiter() -> &'static Limiter {
    static INSTALLED: OnceLock<&'static Limiter> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        Limiter::builder()
            .memory()
            .prefix("behaviour")
            .install()
            .expect("installed once")
    })
}

#[rate_limit(period = 60, threshold = 2, limiter = limiter)]
async fn counted(limiter: &Limiter, runs: &AtomicUsize) -> Result<(), Rejection> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn the_body_does_not_run_when_the_call_is_rejected() {
    let (limiter, _clock) = manual_limiter();
    let runs = AtomicUsize::new(0);
    assert!(counted(&limiter, &runs).await.is_ok());
    assert!(counted(&limiter, &runs).await.is_ok());
    let rejection = counted(&limiter, &runs)
        .await
        .expect_err("third call within the period");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the refused call must not run the body"
    );
    assert!(!rejection.is_unavailable());
    assert_eq!(rejection.retry_after(), Some(Duration::from_secs(30)));
}

#[rate_limit(period = "1m", threshold = 1, key = user_id, limiter = limiter)]
async fn per_user(limiter: &Limiter, user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

#[tokio::test]
async fn keys_from_arguments_give_each_user_their_own_quota() {
    let (limiter, _clock) = manual_limiter();
    assert_eq!(per_user(&limiter, 1).await.unwrap(), 1);
    assert!(
        per_user(&limiter, 1).await.is_err(),
        "user 1 used their quota"
    );
    assert_eq!(
        per_user(&limiter, 2).await.unwrap(),
        2,
        "user 2 is not limited by user 1"
    );
}

#[derive(Debug)]
struct User {
    name: String,
}

#[rate_limit(period = 60, threshold = 1, key = user.name, limiter = limiter)]
async fn greet(limiter: &Limiter, user: User) -> Result<String, Rejection> {
    // The key borrowed `user.name`: the argument is still whole here.
    Ok(format!("hi {}", user.name))
}

#[tokio::test]
async fn the_key_is_evaluated_by_reference_and_does_not_move_the_argument() {
    let (limiter, _clock) = manual_limiter();
    let greeting = greet(
        &limiter,
        User {
            name: "ada".to_owned(),
        },
    )
    .await
    .unwrap();
    assert_eq!(greeting, "hi ada");
    assert!(
        greet(
            &limiter,
            User {
                name: "ada".to_owned()
            }
        )
        .await
        .is_err()
    );
    assert!(
        greet(
            &limiter,
            User {
                name: "bob".to_owned()
            }
        )
        .await
        .is_ok()
    );
}

#[rate_limit(period = 60, threshold = 1)]
async fn no_key_shares_one_limit() -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn without_a_key_every_call_shares_one_limit_of_the_global_limiter() {
    let limiter = global_limiter();
    assert_eq!(limiter.prefix(), "behaviour");
    assert!(no_key_shares_one_limit().await.is_ok());
    let rejection = no_key_shares_one_limit()
        .await
        .expect_err("one call per minute for everyone");
    assert_eq!(rejection.name(), "macro_behaviour::no_key_shares_one_limit");
}

struct Tenant {
    limiter: Arc<Limiter>,
    tenant: String,
    sent: usize,
}

impl Tenant {
    #[rate_limit(period = 60, threshold = 2, key = self.tenant, limiter = self.limiter, name = "tenant_send")]
    async fn send(&mut self) -> Result<usize, Rejection> {
        self.sent += 1;
        Ok(self.sent)
    }

    #[rate_limit(period = 60, threshold = 2, key = self.tenant, limiter = self.limiter, name = "tenant_send")]
    async fn peek_sent(&self) -> Result<usize, Rejection> {
        Ok(self.sent)
    }

    #[rate_limit(period = 60, threshold = 1, key = self.tenant, limiter = &*self.limiter)]
    async fn into_sent(self) -> Result<usize, Rejection> {
        Ok(self.sent)
    }
}

#[tokio::test]
async fn methods_with_self_ref_and_mut_self_use_self_fields_as_key_and_limiter() {
    let limiter = Arc::new(manual_limiter().0);
    let mut acme = Tenant {
        limiter: limiter.clone(),
        tenant: "acme".to_owned(),
        sent: 0,
    };
    let mut globex = Tenant {
        limiter: limiter.clone(),
        tenant: "globex".to_owned(),
        sent: 0,
    };
    assert_eq!(acme.send().await.unwrap(), 1);
    assert_eq!(
        acme.peek_sent().await.unwrap(),
        1,
        "same name and key: the second unit of acme's quota"
    );
    assert!(acme.send().await.is_err(), "acme's two units are used");
    assert_eq!(acme.sent, 1, "the refused call did not run the body");
    assert_eq!(globex.send().await.unwrap(), 1, "globex has its own quota");
    assert_eq!(
        globex.into_sent().await.unwrap(),
        1,
        "by-value self works too"
    );
}

#[rate_limit(period = 60, threshold = 1, key = user, limiter = limiter)]
async fn first(limiter: &Limiter, user: &str) -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, key = user, limiter = limiter)]
async fn second(limiter: &Limiter, user: &str) -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, key = user, limiter = limiter, name = "shared")]
async fn shared_a(limiter: &Limiter, user: &str) -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, key = user, limiter = limiter, name = "shared")]
async fn shared_b(limiter: &Limiter, user: &str) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn two_functions_with_the_same_key_have_separate_counters() {
    let (limiter, _clock) = manual_limiter();
    assert!(first(&limiter, "ada").await.is_ok());
    assert!(
        second(&limiter, "ada").await.is_ok(),
        "`second` does not count `first`'s calls"
    );
    assert!(first(&limiter, "ada").await.is_err());
    assert!(second(&limiter, "ada").await.is_err());
}

#[tokio::test]
async fn two_functions_with_the_same_name_share_one_counter() {
    let (limiter, _clock) = manual_limiter();
    assert!(shared_a(&limiter, "ada").await.is_ok());
    let rejection = shared_b(&limiter, "ada")
        .await
        .expect_err("`shared_a` used the shared quota");
    assert_eq!(rejection.name(), "shared");
    assert!(shared_b(&limiter, "bob").await.is_ok());
}

#[rate_limit(period = 10, threshold = 2, key = user, algorithm = sliding_log, limiter = limiter)]
async fn logged(limiter: &Limiter, user: u32) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_rejected_call_is_allowed_again_exactly_at_retry_after() {
    let (limiter, clock) = manual_limiter();
    logged(&limiter, 1).await.unwrap();
    clock.advance(Duration::from_secs(3));
    logged(&limiter, 1).await.unwrap();
    let rejection = logged(&limiter, 1)
        .await
        .expect_err("two calls in the last ten seconds");
    let retry_after = rejection
        .retry_after()
        .expect("a limited rejection has a retry_after");
    assert_eq!(
        retry_after,
        Duration::from_secs(7),
        "the first call leaves the window 10 s after it was made"
    );

    clock.advance(retry_after - Duration::from_micros(1));
    assert!(
        logged(&limiter, 1).await.is_err(),
        "one microsecond early is still refused"
    );
    clock.advance_micros(1);
    assert!(
        logged(&limiter, 1).await.is_ok(),
        "allowed exactly at retry_after"
    );
}

#[rate_limit(period = "1h", threshold = 5, burst = 3, algorithm = token_bucket, cost = 2, limiter = limiter, name = "spec")]
async fn specified(limiter: &Limiter) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn the_rejection_reports_the_configured_limit() {
    let (limiter, _clock) = manual_limiter();
    specified(&limiter).await.unwrap();
    let rejection = specified(&limiter)
        .await
        .expect_err("cost 2 of a burst of 3: one call");
    let limit = rejection.limit().expect("over the limit");
    assert_eq!(limit.threshold(), 5);
    assert_eq!(limit.period(), Duration::from_secs(3_600));
    assert_eq!(limit.algorithm(), Algorithm::TokenBucket);
    assert_eq!(limit.burst(), 3);
    assert_eq!(rejection.name(), "spec");
}

#[rate_limit(period = 60, threshold = 3, limiter = limiter)]
async fn default_name(limiter: &Limiter) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn the_default_name_is_the_module_path_and_the_function_name() {
    let (limiter, _clock) = manual_limiter();
    for _ in 0..3 {
        default_name(&limiter).await.unwrap();
    }
    let rejection = default_name(&limiter).await.unwrap_err();
    assert_eq!(rejection.name(), concat!(module_path!(), "::default_name"));
    assert_eq!(
        rejection.limit().unwrap().algorithm(),
        Algorithm::Gcra,
        "gcra by default"
    );
}

#[derive(Debug)]
enum ApiError {
    TooManyRequests(Rejection),
    NotFound(String),
    BadInput(std::num::ParseIntError),
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        ApiError::TooManyRequests(rejection)
    }
}

impl From<std::num::ParseIntError> for ApiError {
    fn from(error: std::num::ParseIntError) -> Self {
        ApiError::BadInput(error)
    }
}

#[rate_limit(period = 60, threshold = 3, key = id, limiter = limiter)]
async fn handler(limiter: &Limiter, id: &str) -> Result<u32, ApiError> {
    if id.is_empty() {
        return Err(ApiError::NotFound("empty id".to_owned()));
    }
    let parsed: u32 = id.parse()?;
    Ok(parsed)
}

#[tokio::test]
async fn a_handler_error_type_with_from_rejection_receives_the_rejection() {
    let (limiter, _clock) = manual_limiter();
    assert_eq!(handler(&limiter, "42").await.unwrap(), 42);
    assert!(matches!(handler(&limiter, "42").await, Ok(42)));
    assert!(matches!(handler(&limiter, "42").await, Ok(42)));
    match handler(&limiter, "42").await {
        Err(ApiError::TooManyRequests(rejection)) => assert!(rejection.retry_after().is_some()),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn return_and_question_mark_in_the_body_work_as_written() {
    let (limiter, _clock) = manual_limiter();
    match handler(&limiter, "").await {
        Err(ApiError::NotFound(message)) => assert_eq!(message, "empty id"),
        other => panic!("expected the early return, got {other:?}"),
    }
    match handler(&limiter, "x").await {
        Err(ApiError::BadInput(error)) => assert_eq!(error, "x".parse::<u32>().unwrap_err()),
        other => panic!("expected `?` to convert the parse error, got {other:?}"),
    }
}

/// A backend that is always down.
#[derive(Debug)]
struct Down;

impl Backend for Down {
    fn acquire<'a>(
        &'a self,
        _: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(async { Err(BackendError::unavailable("down")) })
    }

    fn peek<'a>(&'a self, _: &'a [Request<'a>]) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        Box::pin(async { Err(BackendError::unavailable("down")) })
    }

    fn refund<'a>(
        &'a self,
        _: &'a [Request<'a>],
        _: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { Err(BackendError::unavailable("down")) })
    }

    fn reset<'a>(&'a self, _: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { Err(BackendError::unavailable("down")) })
    }
}

#[rate_limit(period = 60, threshold = 1, limiter = limiter, on_error = fail_closed)]
async fn closed_on_error(limiter: &Limiter, runs: &AtomicUsize) -> Result<(), Rejection> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[rate_limit(period = 60, threshold = 4, limiter = limiter, on_error = local(2))]
async fn local_on_error(limiter: &Limiter, runs: &AtomicUsize) -> Result<(), Rejection> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn on_error_local_decides_in_process_with_the_threshold_shared_by_instances() {
    let limiter = Limiter::builder().backend(Down).build().unwrap();
    let runs = AtomicUsize::new(0);
    local_on_error(&limiter, &runs).await.expect("local 1 of 2");
    local_on_error(&limiter, &runs).await.expect("local 2 of 2");
    let rejection = local_on_error(&limiter, &runs)
        .await
        .expect_err("4 / 2 instances = 2");
    assert!(
        !rejection.is_unavailable(),
        "refused by the local limiter, not for the outage"
    );
    assert_eq!(rejection.limit().unwrap().threshold(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[rate_limit(period = 60, threshold = 1, limiter = limiter)]
async fn limiter_policy_on_error(limiter: &Limiter, runs: &AtomicUsize) -> Result<(), Rejection> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn on_error_fail_closed_refuses_calls_when_the_backend_is_down() {
    let limiter = Limiter::builder().backend(Down).build().unwrap();
    let runs = AtomicUsize::new(0);
    let rejection = closed_on_error(&limiter, &runs)
        .await
        .expect_err("fail closed");
    assert!(rejection.is_unavailable());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn without_on_error_the_limiter_policy_applies_and_fails_open_by_default() {
    let limiter = Limiter::builder().backend(Down).build().unwrap();
    let runs = AtomicUsize::new(0);
    limiter_policy_on_error(&limiter, &runs)
        .await
        .expect("fail open");
    limiter_policy_on_error(&limiter, &runs)
        .await
        .expect("fail open, even over the threshold");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_futures_are_send_and_can_be_spawned() {
    static LIMITER: OnceLock<Limiter> = OnceLock::new();
    let limiter = LIMITER.get_or_init(|| manual_limiter().0);
    let first = tokio::spawn(per_user(limiter, 9));
    assert_eq!(first.await.unwrap().unwrap(), 9);
    let second = tokio::spawn(per_user(limiter, 9));
    assert!(
        second.await.unwrap().is_err(),
        "the spawned calls share the limiter's state"
    );
}

// ---------------------------------------------------------------------------
// Several limits, several keys, counting failures, `on_reject`, `headers`.
// ---------------------------------------------------------------------------

/// `limit` with the algorithm the functions below use.
fn fixed(limit: &str) -> Limit {
    limit
        .parse::<Limit>()
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap()
}

/// What `identity` has left of `limit` under `name`, without consuming.
async fn remaining(limiter: &Limiter, name: &str, identity: &str, limit: &str) -> u64 {
    limiter
        .requests()
        .peek_identity(name, &identity, &[fixed(limit)])
        .await
        .unwrap()
        .binding()
        .remaining()
}

#[rate_limit(
    name = "sms_phone",
    key = phone,
    limits = ["3/1m", "2/1d"],
    algorithm = fixed_window,
    also(name = "sms_ip", key = ip, limits = ["100/1h"], algorithm = fixed_window),
    limiter = limiter,
)]
async fn send_sms(
    limiter: &Limiter,
    ip: &str,
    phone: &str,
    runs: &AtomicUsize,
) -> Result<(), Rejection> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_call_refused_by_one_limit_consumes_nothing_from_the_others_or_the_other_groups() {
    let (limiter, _clock) = manual_limiter();
    let runs = AtomicUsize::new(0);
    send_sms(&limiter, "10.0.0.1", "+1", &runs).await.unwrap();
    send_sms(&limiter, "10.0.0.1", "+1", &runs).await.unwrap();
    let rejection = send_sms(&limiter, "10.0.0.1", "+1", &runs)
        .await
        .expect_err("the daily limit of 2 is used up");
    assert_eq!(rejection.name(), "sms_phone");
    assert_eq!(rejection.limit(), Some(&fixed("2/1d")));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the refused body did not run"
    );
    assert_eq!(
        remaining(&limiter, "sms_phone", "+1", "3/1m").await,
        1,
        "the refused call took nothing from the minute limit"
    );
    assert_eq!(
        remaining(&limiter, "sms_ip", "10.0.0.1", "100/1h").await,
        98,
        "nor from the IP group"
    );
}

#[rate_limit(
    name = "sms_phone_b",
    key = phone,
    limits = ["5/1m"],
    algorithm = fixed_window,
    also(name = "sms_ip_b", key = ip, limits = ["2/1h"], algorithm = fixed_window),
    limiter = limiter,
)]
async fn send_sms_b(limiter: &Limiter, ip: &str, phone: &str) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_call_refused_by_an_also_group_consumes_nothing_from_the_main_group() {
    let (limiter, _clock) = manual_limiter();
    send_sms_b(&limiter, "10.0.0.1", "+1").await.unwrap();
    send_sms_b(&limiter, "10.0.0.1", "+2").await.unwrap();
    let rejection = send_sms_b(&limiter, "10.0.0.1", "+3")
        .await
        .expect_err("two SMS per hour from this IP");
    assert_eq!(
        rejection.name(),
        "sms_ip_b",
        "named after the refusing group"
    );
    assert_eq!(remaining(&limiter, "sms_phone_b", "+3", "5/1m").await, 5);
    assert!(
        send_sms_b(&limiter, "10.0.0.2", "+3").await.is_ok(),
        "another IP"
    );
}

#[derive(Debug)]
enum LoginError {
    WrongPassword,
    Limited(Rejection),
}

impl From<Rejection> for LoginError {
    fn from(rejection: Rejection) -> Self {
        LoginError::Limited(rejection)
    }
}

#[rate_limit(
    name = "login_user",
    key = user,
    period = "1m",
    threshold = 3,
    algorithm = fixed_window,
    count = failures,
    reset_on_success,
    also(name = "login_ip", key = ip, period = "1h", threshold = 4, algorithm = fixed_window),
    limiter = limiter,
)]
async fn login(
    limiter: &Limiter,
    ip: &str,
    user: &str,
    password: &str,
    runs: &AtomicUsize,
) -> Result<String, LoginError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if password != "hunter2" {
        return Err(LoginError::WrongPassword);
    }
    Ok(format!("welcome {user}"))
}

#[tokio::test]
async fn with_count_failures_three_failures_then_even_the_right_password_is_refused() {
    let (limiter, _clock) = manual_limiter();
    let runs = AtomicUsize::new(0);
    for _ in 0..3 {
        assert!(matches!(
            login(&limiter, "10.0.0.1", "ada", "guess", &runs).await,
            Err(LoginError::WrongPassword)
        ));
    }
    match login(&limiter, "10.0.0.1", "ada", "hunter2", &runs).await {
        Err(LoginError::Limited(rejection)) => assert_eq!(rejection.name(), "login_user"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "the refused body did not run"
    );
    assert!(
        login(&limiter, "10.0.0.1", "bob", "hunter2", &runs)
            .await
            .is_ok(),
        "another user from the same IP"
    );
}

#[tokio::test]
async fn a_success_resets_the_group_with_reset_on_success_and_refunds_the_others() {
    let (limiter, _clock) = manual_limiter();
    let runs = AtomicUsize::new(0);
    let attempt = |password: &'static str| login(&limiter, "10.0.0.1", "ada", password, &runs);
    attempt("guess").await.unwrap_err();
    attempt("guess").await.unwrap_err();
    assert_eq!(attempt("hunter2").await.unwrap(), "welcome ada");
    assert_eq!(
        remaining(&limiter, "login_user", "ada", "3/1m").await,
        3,
        "the success forgot ada's failures"
    );
    assert_eq!(
        remaining(&limiter, "login_ip", "10.0.0.1", "4/1h").await,
        2,
        "the IP keeps its two failures; the success itself was refunded"
    );
    // Two more failures: ada is at 2 of 3 (reset), the IP at 4 of 4.
    attempt("guess").await.unwrap_err();
    attempt("guess").await.unwrap_err();
    match attempt("hunter2").await {
        Err(LoginError::Limited(rejection)) => assert_eq!(rejection.name(), "login_ip"),
        other => panic!("expected the IP group to refuse, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[rate_limit(period = 60, threshold = 3, count = failures, limiter = limiter)]
async fn parse_counted(limiter: &Limiter, id: &str) -> Result<u32, ApiError> {
    if id.is_empty() {
        return Err(ApiError::NotFound("empty id".to_owned()));
    }
    let parsed: u32 = id.parse()?;
    if parsed == 0 {
        return Ok(0);
    }
    Ok(parsed)
}

#[tokio::test]
async fn return_and_question_mark_in_a_counted_body_work_and_count_only_errors() {
    let (limiter, _clock) = manual_limiter();
    match parse_counted(&limiter, "").await {
        Err(ApiError::NotFound(message)) => assert_eq!(message, "empty id"),
        other => panic!("expected the early return, got {other:?}"),
    }
    match parse_counted(&limiter, "x").await {
        Err(ApiError::BadInput(error)) => assert_eq!(error, "x".parse::<u32>().unwrap_err()),
        other => panic!("expected `?` to convert the parse error, got {other:?}"),
    }
    for _ in 0..5 {
        assert_eq!(
            parse_counted(&limiter, "0").await.unwrap(),
            0,
            "an early `return Ok` does not count"
        );
    }
    assert_eq!(parse_counted(&limiter, "7").await.unwrap(), 7);
    assert!(matches!(
        parse_counted(&limiter, "").await,
        Err(ApiError::NotFound(_))
    ));
    assert!(
        matches!(
            parse_counted(&limiter, "7").await,
            Err(ApiError::TooManyRequests(_))
        ),
        "the three failures (`return Err`, `?`, `return Err`) were counted"
    );
}

#[rate_limit(period = 60, threshold = 3, algorithm = sliding_log, count = failures, limiter = limiter)]
async fn slow_failure(limiter: &Limiter, runs: &AtomicUsize) -> Result<(), ApiError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Err(ApiError::NotFound("always".to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_failures_never_exceed_the_threshold() {
    static LIMITER: OnceLock<Limiter> = OnceLock::new();
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let limiter = LIMITER.get_or_init(|| manual_limiter().0);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..50 {
        calls.spawn(slow_failure(limiter, &RUNS));
    }
    let (mut failed, mut refused) = (0, 0);
    while let Some(result) = calls.join_next().await {
        match result.unwrap() {
            Err(ApiError::NotFound(_)) => failed += 1,
            Err(ApiError::TooManyRequests(_)) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 3, "exactly three bodies ran");
    assert_eq!((failed, refused), (3, 47));
}

#[derive(Debug, PartialEq)]
enum Reply {
    Sent(usize),
    TryLater { retry_after_secs: u64 },
}

#[rate_limit(period = 60, threshold = 1, key = to, limiter = limiter,
             on_reject = |rejection| Reply::TryLater {
                 retry_after_secs: rejection.decision().map_or(0, |d| d.retry_after_secs()),
             })]
async fn reply(limiter: &Limiter, to: &str, runs: &AtomicUsize) -> Reply {
    Reply::Sent(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[rate_limit(period = 60, threshold = 1, limiter = limiter, count_if = |_| true, on_reject = drop)]
async fn ping(limiter: &Limiter, runs: &AtomicUsize) {
    runs.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test]
async fn on_reject_returns_its_value_without_running_the_body() {
    let (limiter, _clock) = manual_limiter();
    let runs = AtomicUsize::new(0);
    assert_eq!(reply(&limiter, "ada", &runs).await, Reply::Sent(1));
    assert_eq!(
        reply(&limiter, "ada", &runs).await,
        Reply::TryLater {
            retry_after_secs: 60
        }
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the refused body did not run"
    );
    assert_eq!(reply(&limiter, "bob", &runs).await, Reply::Sent(2));

    let pings = AtomicUsize::new(0);
    ping(&limiter, &pings).await;
    ping(&limiter, &pings).await;
    assert_eq!(
        pings.load(Ordering::SeqCst),
        1,
        "a unit function refused quietly"
    );
}

#[rate_limit(period = 60, threshold = 2, name = "status", limiter = limiter, headers,
             on_reject = IntoResponse::into_response)]
async fn status(limiter: &Limiter) -> Response {
    (StatusCode::OK, "up").into_response()
}

#[rate_limit(period = "1m", threshold = 5, name = "status_result", limiter = limiter, headers,
             also(name = "status_hourly", limits = ["100/1h"]))]
async fn status_result(limiter: &Limiter, fail: bool) -> Result<Response, Rejection> {
    if fail {
        return Err(Rejection::unavailable(
            "status_result",
            ratewall::Error::NotInstalled,
        ));
    }
    Ok("up".into_response())
}

#[tokio::test]
async fn headers_describe_the_binding_limit_on_a_successful_response() {
    let (limiter, _clock) = manual_limiter();
    let first = status(&limiter).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit-policy"], "\"status\";q=2;w=60");
    assert_eq!(first.headers()["ratelimit"], "\"status\";r=1;t=30");
    let second = status(&limiter).await;
    assert_eq!(second.headers()["ratelimit"], "\"status\";r=0;t=60");
    let refused = status(&limiter).await;
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "on_reject built the 429"
    );
    assert!(refused.headers().contains_key("retry-after"));

    let ok = status_result(&limiter, false).await.unwrap();
    assert_eq!(
        ok.headers()["ratelimit-policy"],
        "\"status_result\";q=5;w=60",
        "the minute limit, with fewer units left, binds"
    );
    assert!(status_result(&limiter, true).await.is_err());
}

#[rate_limit(period = 60, threshold = 2, limiter = limiter,
             count_if = |response: &Response| response.status() == StatusCode::UNAUTHORIZED,
             on_reject = IntoResponse::into_response)]
async fn guarded(limiter: &Limiter, password: &str) -> Response {
    if password != "hunter2" {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    StatusCode::OK.into_response()
}

#[tokio::test]
async fn count_if_counts_only_the_calls_it_accepts() {
    let (limiter, _clock) = manual_limiter();
    for _ in 0..5 {
        assert_eq!(
            guarded(&limiter, "hunter2").await.status(),
            StatusCode::OK,
            "successes are refunded"
        );
    }
    assert_eq!(
        guarded(&limiter, "x").await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        guarded(&limiter, "y").await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        guarded(&limiter, "hunter2").await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "two 401s used the quota"
    );
}

/// What a language model's answer says it used.
struct Completion {
    total_tokens: u32,
}

/// Requests per minute (one each) and tokens per minute (the request's
/// `max_tokens` as the estimate, settled from the answer), all-or-nothing.
#[rate_limit(
    limits = ["3/1m"],
    key = team,
    limiter = limiter,
    also(name = "tpm", key = team, limits = ["1000/1m"], cost = max_tokens, settle = |out| match out {
        Ok(completion) => completion.total_tokens,
        Err(_) => 0,
    }),
)]
async fn complete(
    limiter: &Limiter,
    team: &str,
    max_tokens: u32,
    used: u32,
) -> Result<Completion, Rejection> {
    Ok(Completion { total_tokens: used })
}

#[tokio::test]
async fn cost_and_settle_take_the_estimate_then_the_real_cost() {
    let (limiter, clock) = manual_limiter();
    // 600 estimated, 200 used: 800 of 1000 left.
    complete(&limiter, "t", 600, 200).await.expect("fits");
    // 800 estimated fits the 800 left; 950 used: 150 past the budget.
    complete(&limiter, "t", 800, 950).await.expect("fits");
    let refused = complete(&limiter, "t", 1, 1).await.err().expect("in debt");
    assert_eq!(refused.name(), "tpm");
    // 1150 in use: one more token fits once 151 have drained at 60 ms each.
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(151 * 60)));
    clock.advance(Duration::from_millis(151 * 60));
    complete(&limiter, "t", 1, 1)
        .await
        .expect("the debt is paid");
    // Requests per minute: one per call, whatever its tokens.
    for _ in 0..3 {
        complete(&limiter, "u", 1, 1).await.expect("3 a minute");
    }
    let refused = complete(&limiter, "u", 1, 1).await.err().expect("a 4th");
    assert_eq!(refused.name(), concat!(module_path!(), "::complete"));
}
