use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, key = phone, also(key = ip, limits = ["20/1h"]))]
async fn send(ip: &str, phone: &str) -> Result<usize, Rejection> {
    Ok(ip.len() + phone.len())
}

fn main() {}
