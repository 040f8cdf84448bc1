use ratewall::{Rejection, rate_limit};

#[rate_limit(
    name = "export",
    key = tenant,
    period = 1,
    threshold = 10,
    algorithm = leaky_bucket,
    also(name = "export_running", key = tenant, max_in_flight = 4),
    wait = "2s"
)]
async fn export(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
