use ratewall::rate_limit;

#[derive(Debug)]
enum ApiError {
    NotFound,
}

#[rate_limit(period = 60, threshold = 5, key = user_id)]
async fn handler(user_id: u64) -> Result<u64, ApiError> {
    if user_id == 0 {
        return Err(ApiError::NotFound);
    }
    Ok(user_id)
}

fn main() {}
