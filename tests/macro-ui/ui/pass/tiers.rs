//! `tier` + `tiers(...)`: per-identity limits, on the function's own group
//! and in an `also(...)`, with tiers given as identifiers or strings and a
//! tier expression of any `Display` type.

use std::fmt;

use ratewall::{Limiter, Rejection, rate_limit};

#[derive(Clone, Copy)]
enum Plan {
    Free,
    Pro,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Plan::Free => "free",
            Plan::Pro => "pro",
        })
    }
}

struct User {
    id: u64,
    plan: Plan,
    team: String,
}

impl User {
    fn plan(&self) -> Plan {
        self.plan
    }
}

#[rate_limit(
    name = "api",
    key = user.id,
    tier = user.plan(),
    tiers(free = ["1/1m"], pro = ["3/1m", "20/1s"], "team-2.eu" = ["5/1m"]),
    also(name = "api_team", key = user.team, tier = "shared", tiers(shared = ["100/1h"], default = ["1/1h"]), cost = 1),
    algorithm = sliding_log,
)]
async fn search(user: &User) -> Result<u64, Rejection> {
    Ok(user.id)
}

#[rate_limit(key = id, tier = plan, tiers(r#type = ["1/1m"], default = ["2/1m"]))]
async fn by_str(id: u32, plan: &str) -> Result<u32, Rejection> {
    Ok(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let mut user = User { id: 7, plan: Plan::Free, team: "a".to_owned() };
    assert_eq!(search(&user).await.unwrap(), 7);
    assert_eq!(search(&user).await.unwrap_err().name(), "api@free");
    user.plan = Plan::Pro; // takes effect on the next call
    for _ in 0..3 {
        assert!(search(&user).await.is_ok());
    }
    assert_eq!(search(&user).await.unwrap_err().name(), "api@pro");
    assert!(by_str(1, "type").await.is_ok());
    assert!(by_str(1, "type").await.is_err());
    assert!(by_str(1, "unknown").await.is_ok()); // the default tier
}
