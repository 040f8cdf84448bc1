use std::fmt::Display;

use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, count = failures)]
async fn counted() -> Result<impl Display, Rejection> {
    Ok(5)
}

#[rate_limit(period = 60, threshold = 3, headers)]
async fn with_headers() -> Result<impl Display, Rejection> {
    Ok(5)
}

fn main() {}
