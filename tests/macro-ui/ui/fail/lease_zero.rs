use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1000, key = tenant, lease = 0)]
async fn handler(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
