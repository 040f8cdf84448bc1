//! Each string of `limits` gets the checks `period` and `threshold` get,
//! reported at the string.

use ratewall::{Rejection, rate_limit};

#[rate_limit(limits = ["1/1m", "0/1h"])]
async fn zero_threshold() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["5/0s"])]
async fn zero_period() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["5/1h", "10/60m"])]
async fn same_period() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["1/1m", "104250/1d"])]
async fn too_large() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["20000/1h"], algorithm = sliding_log)]
async fn sliding_log_too_large() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["7/1001us"], algorithm = sliding_window)]
async fn uneven_slots() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["5/1m", "2/1h"], cost = 3, algorithm = fixed_window)]
async fn cost_exceeds_threshold() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
