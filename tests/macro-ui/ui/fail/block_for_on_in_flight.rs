use ratewall::{Rejection, rate_limit};

#[rate_limit(key = tenant, max_in_flight = 4, block_for = "1m")]
async fn export(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
