use ratewall::{Rejection, rate_limit};

#[rate_limit(limits = ["1/1m", "5 every hour"], key = phone)]
async fn send(phone: &str) -> Result<usize, Rejection> {
    Ok(phone.len())
}

fn main() {}
