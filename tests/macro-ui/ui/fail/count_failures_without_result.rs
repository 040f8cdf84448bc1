use ratewall::rate_limit;

#[derive(Debug)]
#[allow(dead_code)]
enum Reply {
    Welcome,
    Denied,
    Later,
}

#[rate_limit(period = 60, threshold = 3, count = failures, on_reject = |_| Reply::Later)]
async fn login(password: &str) -> Reply {
    if password == "hunter2" { Reply::Welcome } else { Reply::Denied }
}

fn main() {}
