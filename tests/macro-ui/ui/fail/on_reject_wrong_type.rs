use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, on_reject = |rejection: Rejection| rejection.to_string())]
async fn status() -> u16 {
    200
}

fn main() {}
