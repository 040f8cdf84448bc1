use ratewall::{Rejection, rate_limit};

struct Answer {
    tokens: u64,
}

// `settle` replaces an estimate by the real cost: without `cost` there is
// no estimate to replace.
#[rate_limit(limits = ["10000/1m"], key = team, settle = |out| out.as_ref().map_or(0, |a| a.tokens))]
async fn complete(team: &str) -> Result<Answer, Rejection> {
    Ok(Answer { tokens: team.len() as u64 })
}

fn main() {}
