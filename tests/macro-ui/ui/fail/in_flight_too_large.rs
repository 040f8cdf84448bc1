use ratewall::{Rejection, rate_limit};

#[rate_limit(key = tenant, max_in_flight = 200000)]
async fn export(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(key = tenant, period = 60, threshold = 5,
             also(name = "export_all", max_in_flight = 100001))]
async fn export_also(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
