use ratewall::{Rejection, rate_limit};

// Without a rate limit, the rate limits' arguments have nothing to apply to.
#[rate_limit(key = tenant, max_in_flight = 4, algorithm = sliding_log)]
async fn algorithm(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(key = tenant, max_in_flight = 4, cost = 2)]
async fn cost(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(key = tenant, period = 60, threshold = 5,
             also(name = "export_all", max_in_flight = 4, burst = 2, slots = 3))]
async fn in_also(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
