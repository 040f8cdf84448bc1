use std::fmt::Display;

use ratewall::{Rejection, rate_limit};

#[rate_limit(max_in_flight = 4)]
async fn export() -> Result<impl Display, Rejection> {
    Ok(5)
}

fn main() {}
