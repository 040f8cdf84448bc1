use ratewall::{Rejection, rate_limit};

#[rate_limit(period = "5 fortnights", threshold = 5)]
async fn handler(user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

fn main() {}
