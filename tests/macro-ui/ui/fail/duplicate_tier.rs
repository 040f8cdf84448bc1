use ratewall::{Rejection, rate_limit};

#[rate_limit(key = user, tier = plan, tiers(free = ["1/1m"], pro = ["10/1m"], "free" = ["2/1m"]))]
async fn api(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

fn main() {}
