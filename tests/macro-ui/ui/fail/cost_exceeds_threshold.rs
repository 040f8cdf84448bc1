use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 5, algorithm = fixed_window, cost = 6)]
async fn handler(user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

fn main() {}
