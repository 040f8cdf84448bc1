//! A `#[rate_limit]` function called before any global limiter is installed.
//!
//! Its own test binary: the global limiter is process-wide, and every other
//! binary may install it.

use ratewall::{Error, Rejection, RejectionReason, rate_limit};

#[rate_limit(period = 60, threshold = 5, key = user_id)]
async fn needs_the_global_limiter(user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

#[tokio::test]
async fn without_an_installed_limiter_calls_are_refused_as_unavailable_not_panicking() {
    let rejection = needs_the_global_limiter(7)
        .await
        .expect_err("no limiter to decide");
    assert!(rejection.is_unavailable());
    assert_eq!(rejection.retry_after(), None);
    assert!(matches!(
        rejection.reason(),
        RejectionReason::Unavailable(Error::NotInstalled)
    ));
    assert_eq!(
        rejection.name(),
        "macro_not_installed::needs_the_global_limiter"
    );
    // Still refused on the next call: nothing was installed behind our back.
    assert!(
        needs_the_global_limiter(7)
            .await
            .unwrap_err()
            .is_unavailable()
    );
}
