use ratewall::{Rejection, rate_limit};

#[rate_limit(limits = ["5/1m", "100/1d"], period = 60, threshold = 5)]
async fn send() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
