use ratewall::{Rejection, rate_limit};

struct UserId(u64);

#[rate_limit(period = 60, threshold = 5, key = user.0 + 1 == 2 || user_id_of(&user).is_some())]
async fn ok_key(user: UserId) -> Result<u64, Rejection> {
    Ok(user.0)
}

fn user_id_of(user: &UserId) -> Option<u64> {
    Some(user.0)
}

#[rate_limit(period = 60, threshold = 5, key = user)]
async fn handler(user: UserId) -> Result<u64, Rejection> {
    Ok(user.0)
}

fn main() {}
