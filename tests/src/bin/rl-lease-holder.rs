//! A process holding a lease, for the test that kills it
//! (`tests/redis_lease.rs`): leases a limit (default: GCRA, 100 000 per
//! 10 s) with `lease = 5 000` for one identity on the given Redis, calls
//! for 300 ms and on until a lease taken ahead lands (what it holds is then
//! at a peak), prints `ready <units leased>` and waits to be killed without
//! another call.
//!
//! ```text
//! rl-lease-holder <redis url> <key prefix> <identity> <lease ttl ms> [<rate> [<algorithm>]]
//! ```

use std::io::Write;
use std::time::Duration;

use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
use ratewall_redis::RedisBackend;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, prefix, identity, ttl_ms, rest) = match args.as_slice() {
        [url, prefix, identity, ttl_ms, rest @ ..] if rest.len() <= 2 => {
            (url, prefix, identity, ttl_ms, rest)
        }
        _ => {
            eprintln!(
                "usage: rl-lease-holder <redis url> <key prefix> <identity> <lease ttl ms> [<rate> [<algorithm>]]"
            );
            std::process::exit(2);
        }
    };
    let rate = rest.first().map_or("100000/10s", String::as_str);
    let algorithm = rest.get(1).map_or("gcra", String::as_str);
    let ttl = Duration::from_millis(ttl_ms.parse().expect("a TTL in ms"));
    let backend = RedisBackend::connect(url.as_str())
        .await
        .expect("connect to Redis");
    let limiter = Limiter::builder()
        .backend(backend)
        .prefix(prefix.as_str())
        .lease_ttl(ttl)
        .lists_refresh(Duration::from_secs(3_600))
        .build()
        .expect("limiter");
    let limit = rate
        .parse::<Limit>()
        .and_then(|l| l.with_algorithm(algorithm.parse()?))
        .and_then(|l| l.with_lease(5_000))
        .expect("a rate such as 100000/10s and an algorithm name");
    let spec = CallSpec::owned("held", vec![GroupSpec::owned("held", vec![limit])]);
    // Calls until it holds a lease and has taken at least one more ahead,
    // then stops right after a take landed (its holding at a peak).
    let started = std::time::Instant::now();
    let mut last = 0;
    let held = loop {
        drop(
            limiter
                .call(&spec, &[identity])
                .await
                .expect("admitted while far below the limit"),
        );
        let held = limiter.leased_units();
        if held > last && held >= 1_000 && started.elapsed() > Duration::from_millis(300) {
            break held;
        }
        last = held;
    };
    println!("ready {held}");
    std::io::stdout().flush().expect("flush");
    tokio::time::sleep(Duration::from_secs(3_600)).await;
}
