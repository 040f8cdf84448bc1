use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, count = failures, wait = "2s")]
async fn login() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
