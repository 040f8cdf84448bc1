use ratewall::{Rejection, rate_limit};

// A lease must leave part of the limit to other processes: at most the
// capacity minus one, for every limit of the group.
#[rate_limit(key = tenant, limits = ["1000/1m", "100/1s"], algorithm = fixed_window, lease = 100)]
async fn handler(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(period = 60, threshold = 1000, burst = 50, key = tenant, lease = 50)]
async fn bursty(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

fn main() {}
