use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, wait = "2s", count_if = |r: &Result<(), Rejection>| r.is_err())]
async fn login() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
