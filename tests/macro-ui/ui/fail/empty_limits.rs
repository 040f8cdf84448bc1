use ratewall::{Rejection, rate_limit};

#[rate_limit(limits = [], key = phone)]
async fn send(phone: &str) -> Result<usize, Rejection> {
    Ok(phone.len())
}

fn main() {}
