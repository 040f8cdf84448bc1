//! The `ratewall` CLI, the real binary, on tiers (`<group>@<tier>` names) after a
//! limiter on a real `redis-server` decided tiered calls: the registry
//! lists each tier, `inspect` and `reset` take a tier's name, and a deny
//! entry for the group reaches every tier.

use std::process::Command;
use std::time::Duration;

use ratewall::{CallSpec, FailurePolicy, GroupSpec, Limiter, call::Tier};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisServer;
use serde_json::Value;

mod common;

/// `ratewall --redis <server> --prefix app <args>`: its JSON output.
fn admin(server: &RedisServer, args: &[&str]) -> Value {
    let url = server.url();
    let output = Command::new(common::ratewall_cli())
        .args(["--redis", &url, "--prefix", "app", "--json"])
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run ratewall");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ratewall {args:?}: {stderr}");
    serde_json::from_slice(&output.stdout).expect("JSON")
}

fn api() -> CallSpec {
    CallSpec::owned(
        "api",
        vec![GroupSpec::owned_tiered(
            "api",
            vec![
                Tier::owned("free", vec!["2/1m".parse().unwrap()]),
                Tier::owned("pro", vec!["5/1m".parse().unwrap()]),
            ],
        )],
    )
    .with_policy(FailurePolicy::FailClosed)
}

#[tokio::test]
async fn the_cli_lists_inspects_resets_and_denies_by_tier() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .backend(RedisBackend::connect(server.url()).await.unwrap())
        .prefix("app")
        .lists_refresh(Duration::from_millis(10))
        .deny_cache(false) // every call asks Redis, so a reset elsewhere shows at once
        .build()
        .unwrap();
    let spec = api();
    let call = |tier: &'static str| {
        limiter.call_with(&spec, ratewall::Keys::new(&[&"alice"]).tiers(&[tier]))
    };
    for _ in 0..2 {
        assert!(call("free").await.is_ok());
    }
    assert!(call("free").await.is_err());
    assert!(call("pro").await.is_ok());

    // The registry names each tier a service decided with.
    let names: Vec<String> = admin(&server, &["limits"])["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["api@free", "api@pro"]);

    // Each tier's own state.
    let free = admin(&server, &["inspect", "api@free", "alice"]);
    assert_eq!(free["limits"][0]["remaining"], 0);
    let pro = admin(&server, &["inspect", "api@pro", "alice"]);
    assert_eq!(pro["limits"][0]["remaining"], 4);

    // Reset one tier: its next call is admitted, the other tier unchanged.
    admin(&server, &["reset", "api@free", "alice"]);
    assert!(call("free").await.is_ok());
    assert_eq!(
        admin(&server, &["inspect", "api@pro", "alice"])["limits"][0]["remaining"],
        4
    );

    // A deny entry for the group reaches every tier (after a refresh).
    admin(&server, &["deny", "alice", "--name", "api"]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        call("pro").await.is_ok(),
        "the call that reads the lists again"
    );
    for tier in ["free", "pro"] {
        let refused = call(tier).await.unwrap_err();
        assert!(refused.is_denied(), "{tier}: {refused}");
    }
}
