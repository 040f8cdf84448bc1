use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1000, key = tenant, algorithm = sliding_log, lease = 10)]
async fn handler(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(
    name = "phone",
    key = phone,
    limits = ["5/1m"],
    also(name = "ip", key = ip, limits = ["100/1h"], algorithm = sliding_log, lease = 10)
)]
async fn also_group(phone: u64, ip: u64) -> Result<u64, Rejection> {
    Ok(phone + ip)
}

fn main() {}
