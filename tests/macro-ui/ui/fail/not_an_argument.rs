use ratewall::{Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 3, "key")]
async fn first() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 3, also(name = "ip", 5))]
async fn second() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
