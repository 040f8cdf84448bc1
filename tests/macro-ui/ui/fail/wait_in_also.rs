use ratewall::{Rejection, rate_limit};

#[rate_limit(
    name = "sms_phone",
    key = phone,
    limits = ["1/1m"],
    also(name = "sms_ip", key = ip, limits = ["20/1h"], wait = "1s")
)]
async fn send(phone: String, ip: String) -> Result<(), Rejection> {
    let _ = (phone, ip);
    Ok(())
}

fn main() {}
