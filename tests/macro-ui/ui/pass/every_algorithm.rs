//! Every algorithm, as an identifier and as a string, with the arguments
//! each one takes.

use ratewall::{Algorithm, Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 2, algorithm = fixed_window)]
async fn fixed_window() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 2, algorithm = sliding_log)]
async fn sliding_log() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 2, algorithm = sliding_window, slots = 6)]
async fn sliding_window() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 2, algorithm = token_bucket, burst = 4, cost = 2)]
async fn token_bucket() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 2, algorithm = "leaky_bucket", burst = 2)]
async fn leaky_bucket() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 2, algorithm = gcra, burst = 1)]
async fn gcra() -> Result<(), Rejection> {
    Ok(())
}

async fn refusing_algorithm<F: Future<Output = Result<(), Rejection>>>(
    mut call: impl FnMut() -> F,
) -> Algorithm {
    for _ in 0..10 {
        if let Err(rejection) = call().await {
            return rejection.limit().unwrap().algorithm();
        }
    }
    panic!("never refused");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert_eq!(
        refusing_algorithm(fixed_window).await,
        Algorithm::FixedWindow
    );
    assert_eq!(refusing_algorithm(sliding_log).await, Algorithm::SlidingLog);
    assert_eq!(
        refusing_algorithm(sliding_window).await,
        Algorithm::SlidingWindow
    );
    assert_eq!(
        refusing_algorithm(token_bucket).await,
        Algorithm::TokenBucket
    );
    assert_eq!(
        refusing_algorithm(leaky_bucket).await,
        Algorithm::LeakyBucket
    );
    assert_eq!(refusing_algorithm(gcra).await, Algorithm::Gcra);
}
