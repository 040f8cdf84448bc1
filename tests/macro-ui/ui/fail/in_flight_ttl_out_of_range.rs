use ratewall::{Rejection, rate_limit};

#[rate_limit(key = tenant, max_in_flight = 4, in_flight_ttl = "500ms")]
async fn short(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(key = tenant, max_in_flight = 4, in_flight_ttl = "2h")]
async fn long(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(key = tenant, max_in_flight = 4, in_flight_ttl = 0)]
async fn zero(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
