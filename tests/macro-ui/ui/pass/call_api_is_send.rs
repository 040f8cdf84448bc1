//! The call API as the README writes it compiles inside `tokio::spawn`
//! (and so in an axum handler): `limiter.call(&spec, &[&username, &ip])`
//! takes its identities as `&(dyn Display + Sync)`, so the temporary list
//! that lives until the end of the statement, across the `.await`, keeps
//! the task's future `Send`; the same for `call_with` (tiers, waiting).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ratewall::{CallSpec, GroupSpec, Keys, Limiter, Rejection, call::{Counting, Tier}};

async fn login(
    limiter: Arc<Limiter>,
    login: Arc<CallSpec>,
    username: String,
    ip: IpAddr,
) -> Result<(), Rejection> {
    let permit = limiter.call(&login, &[&username, &ip]).await?; // one round trip, all-or-nothing
    let ok = username == "alice";
    permit.settle(!ok).await; // only failures count
    Ok(())
}

async fn tiered(limiter: Arc<Limiter>, api: Arc<CallSpec>, user: u64, plan: String) -> bool {
    let wait = Duration::from_millis(10);
    limiter
        .call_with(&api, Keys::new(&[&user]).tiers(&[plan.as_str()]).wait(wait))
        .await
        .is_ok()
}

#[tokio::main]
async fn main() {
    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    let login_spec = Arc::new(
        CallSpec::owned(
            "login",
            vec![
                GroupSpec::owned("login_user", vec!["3/1m".parse().unwrap()]).reset_on_success(),
                GroupSpec::owned("login_ip", vec!["100/1d".parse().unwrap()]),
            ],
        )
        .with_counting(Counting::Settled),
    );
    let ip: IpAddr = "192.0.2.7".parse().unwrap();
    let task = tokio::spawn(login(limiter.clone(), login_spec, "alice".to_owned(), ip));
    assert!(task.await.unwrap().is_ok());
    let api = Arc::new(CallSpec::owned(
        "api",
        vec![GroupSpec::owned_tiered(
            "api",
            vec![Tier::owned("free", vec!["10/1m".parse().unwrap()])],
        )],
    ));
    let task = tokio::spawn(tiered(limiter.clone(), api, 7, "free".to_owned()));
    assert!(task.await.unwrap());
}
