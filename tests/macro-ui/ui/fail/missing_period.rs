use ratewall::{Rejection, rate_limit};

#[rate_limit(threshold = 5, key = user_id)]
async fn handler(user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

fn main() {}
