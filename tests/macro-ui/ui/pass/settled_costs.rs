use ratewall::{Limiter, Rejection, rate_limit};

struct Usage {
    total_tokens: u32,
}

struct Completion {
    usage: Usage,
}

struct Request {
    max_tokens: usize,
}

// Requests per minute beside tokens per minute, estimated from the request
// and settled from the answer.
#[rate_limit(
    limits = ["500/1m"],
    key = model,
    also(
        name = "tpm",
        key = model,
        limits = ["60000/1m"],
        cost = request.max_tokens,
        settle = |out: &Result<Completion, Rejection>| out.as_ref().map_or(0, |c| c.usage.total_tokens),
    ),
)]
async fn complete(model: &str, request: &Request) -> Result<Completion, Rejection> {
    Ok(Completion {
        usage: Usage { total_tokens: (request.max_tokens / 2) as u32 + model.len() as u32 },
    })
}

// A fixed estimate, settled with a function path, on a window algorithm.
fn rows(out: &Result<u64, Rejection>) -> u64 {
    *out.as_ref().unwrap_or(&0)
}

#[rate_limit(limits = ["1000/1h"], algorithm = fixed_window, cost = 100, settle = rows, limiter = limiter)]
async fn export(limiter: &Limiter, rows_wanted: u64) -> Result<u64, Rejection> {
    Ok(rows_wanted)
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let request = Request { max_tokens: 100 };
        let future = complete("m", &request);
        assert_send(&future);
        let _ = future.await;
        assert_eq!(export(&limiter, 40).await.unwrap(), 40);
    });
}
