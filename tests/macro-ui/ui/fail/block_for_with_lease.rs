use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1000, key = tenant, lease = 10, block_for = "1m")]
async fn hot(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
