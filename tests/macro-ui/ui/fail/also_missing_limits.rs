use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, also(name = "ip", key = ip))]
async fn send(ip: &str) -> Result<usize, Rejection> {
    Ok(ip.len())
}

fn main() {}
