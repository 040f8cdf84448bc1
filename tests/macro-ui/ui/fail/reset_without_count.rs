use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, key = user, reset_on_success,
             also(name = "ip", key = ip, period = 60, threshold = 10, reset_on_success))]
async fn login(ip: &str, user: &str) -> Result<usize, Rejection> {
    Ok(ip.len() + user.len())
}

fn main() {}
