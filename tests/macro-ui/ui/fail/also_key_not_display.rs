use ratewall::{Rejection, rate_limit};

struct Ip([u8; 4]);

#[rate_limit(period = 60, threshold = 3, also(name = "ip", key = ip, limits = ["20/1h"]))]
async fn send(ip: Ip) -> Result<(), Rejection> {
    let _ = ip.0;
    Ok(())
}

fn main() {}
