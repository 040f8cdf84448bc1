use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 1, threshold = 10, wait = "0ms")]
async fn export() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
