use ratewall::{Rejection, rate_limit};

#[rate_limit(key = user, tier = plan, limits = ["1/1m"])]
async fn api(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

fn main() {}
