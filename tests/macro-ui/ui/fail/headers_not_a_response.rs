use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, headers)]
async fn status() -> Result<String, Rejection> {
    Ok("ok".to_owned())
}

fn main() {}
