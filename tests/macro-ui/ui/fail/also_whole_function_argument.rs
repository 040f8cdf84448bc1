use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, also(name = "ip", key = ip, limits = ["10/1m"], limiter = limiter))]
async fn send(limiter: &Limiter, ip: &str) -> Result<usize, Rejection> {
    Ok(limiter.prefix().len() + ip.len())
}

fn main() {}
