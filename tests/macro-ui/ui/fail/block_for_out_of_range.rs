use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 5, key = user, block_for = "31d")]
async fn login(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

#[rate_limit(name = "otp", period = 60, threshold = 5, key = user,
             also(name = "otp_ip", key = ip, period = 60, threshold = 50, block_for = 0))]
async fn otp(user: u64, ip: u32) -> Result<u64, Rejection> {
    Ok(user + u64::from(ip))
}

fn main() {}
