//! `on_reject`: a refused call returns what the callable makes of the
//! rejection, so the function may return any type, and a `Result` whose
//! error has no `From<Rejection>`.

use ratewall::{Limiter, Rejection, rate_limit};

#[derive(Debug, PartialEq)]
enum Reply {
    Sent,
    Later(u64),
}

fn later(rejection: Rejection) -> Reply {
    Reply::Later(rejection.decision().map_or(0, |d| d.retry_after_secs()))
}

#[rate_limit(period = 60, threshold = 1, on_reject = later)]
async fn with_fn() -> Reply {
    Reply::Sent
}

#[rate_limit(period = 60, threshold = 1, on_reject = |_rejection| Reply::Later(0))]
async fn with_closure() -> Reply {
    Reply::Sent
}

#[derive(Debug)]
struct NoFrom;

#[rate_limit(period = 60, threshold = 1, on_reject = |_: Rejection| Err(NoFrom))]
async fn result_without_from() -> Result<u8, NoFrom> {
    Ok(1)
}

#[rate_limit(period = 60, threshold = 1, on_reject = drop)]
async fn unit() {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert_eq!(with_fn().await, Reply::Sent);
    assert_eq!(with_fn().await, Reply::Later(60));
    assert_eq!(with_closure().await, Reply::Sent);
    assert_eq!(with_closure().await, Reply::Later(0));
    assert_eq!(result_without_from().await.unwrap(), 1);
    assert!(result_without_from().await.is_err());
    unit().await;
    unit().await;
}
