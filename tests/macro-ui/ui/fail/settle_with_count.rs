use ratewall::{Rejection, rate_limit};

// `settle` already says what a call keeps: settle at 0 for a call that
// should not count.
#[rate_limit(limits = ["100/1m"], cost = 10, settle = |_| 4u32, count = failures)]
async fn complete() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}
