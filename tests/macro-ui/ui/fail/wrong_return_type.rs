use ratewall::rate_limit;

#[rate_limit(period = 60, threshold = 5, key = user_id)]
async fn handler(user_id: u64) -> Option<u64> {
    Some(user_id)
}

fn main() {}
