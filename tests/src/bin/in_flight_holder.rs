//! Test helper for the in-flight tests: takes in-flight slots on a Redis
//! server through `Limiter::call` and holds them until it is killed.
//!
//! `in_flight_holder <redis url> <group name> <identity> <max_in_flight>
//! <lease ms> <slots to take>`: prints `ready <lease ids>` once every slot
//! is held, then keeps them (renewing their leases) until killed.

use std::time::Duration;

use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
use ratewall_redis::RedisBackend;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, identity, max, lease_ms, take] = args.as_slice() else {
        return Err(
            "usage: in_flight_holder <url> <name> <identity> <max> <lease ms> <take>".into(),
        );
    };
    let limit = Limit::in_flight_with_ttl(max.parse()?, Duration::from_millis(lease_ms.parse()?))?;
    let backend = RedisBackend::connect(url.as_str()).await?;
    let limiter: &'static Limiter = Box::leak(Box::new(
        Limiter::builder().backend(backend).prefix("held").build()?,
    ));
    let spec: &'static CallSpec = Box::leak(Box::new(CallSpec::owned(
        "hold",
        vec![GroupSpec::owned(name.as_str(), vec![limit])],
    )));
    let mut permits = Vec::new();
    for _ in 0..take.parse::<usize>()? {
        let permit = limiter
            .call(spec, &[&identity.as_str()])
            .await
            .map_err(|r| format!("slot refused: {r}"))?;
        permits.push(permit);
    }
    let leases: Vec<String> = permits
        .iter()
        .filter_map(|p| p.in_flight().map(|f| format!("{:016x}", f.holder())))
        .collect();
    println!("ready {}", leases.join(" "));
    std::future::pending::<()>().await;
    drop(permits);
    Ok(())
}
