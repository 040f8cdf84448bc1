use ratewall::{Rejection, rate_limit};

#[rate_limit(
    name = "api",
    key = user,
    tier = plan,
    tiers(free = ["1/1s"], pro = ["10/1s"]),
    wait = "2s"
)]
async fn api(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

fn main() {}
