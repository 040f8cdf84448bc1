use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, count = failures, count_if = |r| r.is_err())]
async fn login() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
