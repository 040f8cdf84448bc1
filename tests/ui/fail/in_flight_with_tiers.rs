use ratewall::{Rejection, rate_limit};

#[rate_limit(name = "export", key = tenant, tier = plan, tiers(free = ["10/1m"]), max_in_flight = 4)]
async fn export(tenant: u64, plan: &str) -> Result<u64, Rejection> {
    let _ = plan;
    Ok(tenant)
}

fn main() {}
