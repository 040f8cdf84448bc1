use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, headers = true)]
async fn status() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
