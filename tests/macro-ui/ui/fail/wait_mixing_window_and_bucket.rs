use ratewall::{Rejection, rate_limit};

#[rate_limit(
    name = "sms_phone",
    key = phone,
    limits = ["1/1m"],
    algorithm = leaky_bucket,
    wait = "5s",
    also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = sliding_log)
)]
async fn send(phone: String, ip: String) -> Result<(), Rejection> {
    let _ = (phone, ip);
    Ok(())
}

fn main() {}
