use ratewall::{Rejection, rate_limit};

// A per-call cost is an unsigned integer: a float (or a signed integer)
// is a type error at the expression.
#[rate_limit(limits = ["100/1m"], cost = weight)]
async fn upload(weight: f64) -> Result<(), Rejection> {
    let _ = weight;
    Ok(())
}

fn main() {}
