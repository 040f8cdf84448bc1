use ratewall::{Rejection, rate_limit};

#[rate_limit(name = "sms", period = 60, threshold = 3, also(name = "sms", key = ip, limits = ["20/1h"]))]
async fn same_as_main(ip: &str) -> Result<usize, Rejection> {
    Ok(ip.len())
}

#[rate_limit(period = 60, threshold = 3, also(name = "ip", key = ip, limits = ["20/1h"]),
             also(name = "ip", limits = ["1000/1h"]))]
async fn same_as_other(ip: &str) -> Result<usize, Rejection> {
    Ok(ip.len())
}

fn main() {}
