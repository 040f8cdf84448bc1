use ratewall::{Rejection, rate_limit};

#[rate_limit(key = user, tier = plan, tiers("pro plan" = ["1/1m"], "a@b" = ["1/1m"], "" = ["1/1m"]))]
async fn api(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

#[rate_limit(name = "api@v2", key = user, tier = plan, tiers(free = ["1/1m"]))]
async fn at_in_name(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user + plan.len() as u64)
}

fn main() {}
