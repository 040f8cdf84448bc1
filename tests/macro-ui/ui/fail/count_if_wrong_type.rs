use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, count_if = |status: &u16| *status == 401)]
async fn login() -> Result<String, Rejection> {
    Ok("welcome".to_owned())
}

fn main() {}
