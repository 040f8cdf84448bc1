use ratewall::{Rejection, rate_limit};

struct Plan;

#[rate_limit(key = user, tier = plan, tiers(free = ["1/1m"]))]
async fn api(user: u64, plan: Plan) -> Result<u64, Rejection> {
    let _ = plan;
    Ok(user)
}

fn main() {}
