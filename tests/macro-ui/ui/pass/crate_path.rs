//! `crate = "..."` for crates that re-export `ratewall` under another path.

mod my_framework {
    pub mod limits {
        pub use ratewall::*;
    }
}

use my_framework::limits::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1, crate = "my_framework::limits", on_error = fail_closed)]
async fn relative() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, crate = "crate::my_framework::limits", limiter = limiter)]
async fn absolute(limiter: &Limiter) -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, crate = "my_framework::limits", count = failures,
             also(name = "crate_all", period = 60, threshold = 10), headers,
             on_reject = |rejection| Err(rejection))]
async fn every_feature() -> Result<http::Response<String>, Rejection> {
    Ok(http::Response::new("ok".to_owned()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    relative().await.unwrap();
    assert!(relative().await.is_err());
    let limiter = Limiter::builder().build().unwrap();
    absolute(&limiter).await.unwrap();
    assert!(
        every_feature()
            .await
            .unwrap()
            .headers()
            .contains_key("ratelimit")
    );
    assert!(
        every_feature()
            .await
            .unwrap()
            .headers()
            .contains_key("ratelimit"),
        "refunded"
    );
}
