use ratewall::rate_limit;

#[rate_limit(period = 60, threshold = 5)]
struct Handler;

fn main() {}
