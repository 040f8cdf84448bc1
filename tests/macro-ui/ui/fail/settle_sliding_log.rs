use ratewall::{Rejection, rate_limit};

struct Answer {
    tokens: u64,
}

// A sliding log keeps one entry per unit, at most `threshold` at once: it
// cannot carry a real cost above the estimate as debt.
#[rate_limit(
    limits = ["100/1m"],
    key = team,
    algorithm = sliding_log,
    cost = estimate,
    settle = |out| out.as_ref().map_or(0, |a| a.tokens)
)]
async fn complete(team: &str, estimate: u64) -> Result<Answer, Rejection> {
    Ok(Answer { tokens: team.len() as u64 + estimate })
}

#[rate_limit(
    limits = ["5/1s"],
    key = team,
    also(name = "tpm", key = team, limits = ["100/1m"], algorithm = sliding_log, cost = 10, settle = |_| 3u64)
)]
async fn in_also(team: &str) -> Result<(), Rejection> {
    let _ = team;
    Ok(())
}

fn main() {}
