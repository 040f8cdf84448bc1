use ratewall::{Rejection, rate_limit};

#[rate_limit(key = tenant, period = 60, threshold = 5, in_flight_ttl = "30s")]
async fn export(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
