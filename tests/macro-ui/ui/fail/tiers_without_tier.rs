use ratewall::{Rejection, rate_limit};

#[rate_limit(key = user, tiers(free = ["1/1m"], pro = ["10/1m"]))]
async fn api(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

#[rate_limit(period = 60, threshold = 5, also(name = "team", key = user, tiers(free = ["1/1m"])))]
async fn in_also(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

fn main() {}
