//! Blocks (`Limit::with_block`, a penalty box) on the memory store: a
//! refused identity stays refused by that limit for the block, to the
//! microsecond, whatever its state says; nothing else is touched.

use std::time::{Duration, Instant};

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Key, Limit, Limiter,
    backend::{Backend, MemoryBackend, Request},
    clock::{Clock, ManualClock},
};

const START: u64 = 1_700_000_000_000_000;

fn blocking(algorithm: Algorithm, block_us: u64) -> Limit {
    Limit::per_second(2)
        .and_then(|l| l.with_algorithm(algorithm))
        .and_then(|l| l.with_block(Duration::from_micros(block_us)))
        .unwrap()
}

#[test]
fn a_refused_identity_stays_refused_for_the_block_to_the_microsecond() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let memory = MemoryBackend::with_clock(clock.clone());
        // 2 a second, blocked for 10 s once refused.
        let limit = blocking(algorithm, 10_000_000);
        let key = Key::new("rl", "login", "alice");
        let call = [Request::new(&key, &limit, 1)];
        assert!(memory.acquire_sync(&call).allowed(), "{algorithm}");
        assert!(memory.acquire_sync(&call).allowed(), "{algorithm}");
        let refused = memory.acquire_sync(&call);
        assert!(!refused.allowed(), "{algorithm}");
        assert_eq!(refused[0].remaining(), 0, "{algorithm}");
        assert_eq!(
            refused[0].retry_after(),
            Duration::from_secs(10),
            "{algorithm}"
        );
        // The state would admit long before: the block refuses until its end,
        // saying so; refusals meanwhile do not extend it.
        for at in [1_000_000, 5_000_000, 9_999_999] {
            clock.set_micros(START + at);
            let during = memory.acquire_sync(&call);
            assert!(!during.allowed(), "{algorithm} at {at}");
            assert_eq!(
                during[0].retry_after(),
                Duration::from_micros(10_000_000 - at),
                "{algorithm} at {at}"
            );
            assert_eq!(during[0].remaining(), 0);
        }
        clock.set_micros(START + 10_000_000);
        assert!(
            memory.acquire_sync(&call).allowed(),
            "{algorithm}: at the end"
        );
    }
}

#[test]
fn the_retry_is_the_later_of_the_block_and_the_state() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    // One an hour, blocked for 1 ms: the state's own wait is the longer.
    let limit = Limit::per_hour(1)
        .and_then(|l| l.with_block(Duration::from_millis(1)))
        .unwrap();
    let key = Key::new("rl", "sms", "+33600000000");
    let call = [Request::new(&key, &limit, 1)];
    assert!(memory.acquire_sync(&call).allowed());
    let refused = memory.acquire_sync(&call);
    assert_eq!(refused[0].retry_after(), Duration::from_secs(3_600));
    assert_eq!(refused[0].reset_after(), Duration::from_secs(3_600));
    // After the block, a refusal by the state blocks again.
    clock.advance_micros(2_000);
    assert!(!memory.acquire_sync(&call).allowed());
    let blocks = memory.blocks_sync(&key);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].left, Duration::from_millis(1));
}

#[test]
fn only_the_limit_that_refused_is_blocked_and_other_identities_are_untouched() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    let minute = Limit::per_minute(1)
        .and_then(|l| l.with_block(Duration::from_secs(600)))
        .unwrap();
    let day = Limit::per_day(100)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_block(Duration::from_secs(86_400)))
        .unwrap();
    let (alice, bob) = (Key::new("rl", "otp", "alice"), Key::new("rl", "otp", "bob"));
    let call = |key| [Request::new(key, &minute, 1), Request::new(key, &day, 1)];
    assert!(memory.acquire_sync(&call(&alice)).allowed());
    let refused = memory.acquire_sync(&call(&alice));
    assert!(!refused[0].allowed() && refused[1].allowed());
    let blocks = memory.blocks_sync(&alice);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].suffix, minute.storage_suffix());
    // The day limit gave nothing and took nothing: 99 left.
    assert_eq!(memory.peek_sync(&call(&alice))[1].remaining(), 99);
    assert!(memory.acquire_sync(&call(&bob)).allowed());
    assert!(memory.blocks_sync(&bob).is_empty());
}

#[test]
fn a_peek_reports_a_block_and_writes_none() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    let limit = blocking(Algorithm::Gcra, 60_000_000);
    let key = Key::new("rl", "api", "k");
    let two = [Request::new(&key, &limit, 2)];
    assert!(memory.acquire_sync(&two).allowed());
    // A peek of a call the state refuses answers what the call would get...
    let peek = memory.peek_sync(&two);
    assert!(!peek.allowed());
    assert_eq!(peek[0].retry_after(), Duration::from_secs(60));
    // ...and blocks nobody.
    assert!(memory.blocks_sync(&key).is_empty());
    clock.advance_micros(1_000_000);
    assert!(memory.acquire_sync(&two).allowed());
    assert!(!memory.acquire_sync(&two).allowed());
    clock.advance_micros(30_000_000);
    let peek = memory.peek_sync(&[Request::new(&key, &limit, 1)]);
    assert_eq!(peek[0].retry_after(), Duration::from_secs(30));
}

#[tokio::test]
async fn a_reset_lifts_a_block_and_a_refund_does_not() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    let limit = blocking(Algorithm::SlidingWindow, 5_000_000);
    let key = Key::new("rl", "reset", "u");
    let call = [Request::new(&key, &limit, 2)];
    let admitted = memory.acquire(&call).await.unwrap();
    assert!(!memory.acquire(&call).await.unwrap().allowed());
    memory.refund(&call, admitted[0].at_micros()).await.unwrap();
    assert!(
        !memory.acquire(&call).await.unwrap().allowed(),
        "still blocked"
    );
    memory.reset(&call).await.unwrap();
    assert!(memory.blocks(&key).await.unwrap().is_empty());
    assert!(memory.acquire(&call).await.unwrap().allowed());
}

#[test]
fn ended_blocks_are_swept() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    let limit = Limit::per_hour(1)
        .and_then(|l| l.with_block(Duration::from_secs(1)))
        .unwrap();
    for i in 0..100u64 {
        let key = Key::new("rl", "rotate", &i.to_string());
        let call = [Request::new(&key, &limit, 1)];
        memory.acquire_sync(&call);
        assert!(!memory.acquire_sync(&call).allowed());
    }
    clock.advance_micros(1_000_000);
    // The states (an hour's) stay; the hundred blocks end and go.
    assert_eq!(memory.evict_expired(), 100);
}

#[test]
fn a_block_cannot_be_reserved_or_leased() {
    let limit = blocking(Algorithm::Gcra, 1_000_000);
    let key = Key::new("rl", "jobs", "t");
    let call = [Request::new(&key, &limit, 1)];
    let reserve = Request::check_reservation(&call).unwrap_err().to_string();
    assert!(reserve.contains("a limit that blocks"), "{reserve}");
    assert!(Request::check_lease(&call).is_err());
}

#[tokio::test]
async fn a_waiting_call_on_a_blocked_identity_waits_for_the_block_within_its_deadline() {
    let limiter = Limiter::builder().memory().build().unwrap();
    // One every 50 ms, blocked for 300 ms once refused.
    let limit = Limit::new(1, Duration::from_millis(50))
        .and_then(|l| l.with_block(Duration::from_millis(300)))
        .unwrap();
    let spec =
        |wait| CallSpec::owned("jobs", vec![GroupSpec::owned("jobs", vec![limit])]).with_wait(wait);
    let long = spec(Duration::from_secs(2));
    let _first = limiter.call(&long, &[&"t"]).await.unwrap();
    let started = Instant::now();
    // Refused (the state's 50 ms), so blocked for 300 ms: it waits for the
    // block (retrying, as a window algorithm's call does) and passes.
    let _second = limiter.call(&long, &[&"t"]).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A call that may not wait that long is refused at once, saying when.
    let short = spec(Duration::from_millis(100));
    let refused = limiter.call(&short, &[&"t"]).await.unwrap_err();
    assert!(refused.retry_after().unwrap() > Duration::from_millis(100));
}

#[tokio::test]
async fn settings_read_and_lift_blocks_by_name_and_identity() {
    let clock = ManualClock::new(START);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .unwrap();
    let minute = Limit::per_minute(1)
        .and_then(|l| l.with_block(Duration::from_secs(900)))
        .unwrap();
    let hour = Limit::per_hour(1)
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .and_then(|l| l.with_block(Duration::from_secs(3_600)))
        .unwrap();
    let spec = CallSpec::owned(
        "login",
        vec![GroupSpec::owned("login_user", vec![minute, hour])],
    );
    let _admitted = limiter.call(&spec, &[&"alice"]).await.unwrap();
    let refused = limiter.call(&spec, &[&"alice"]).await.unwrap_err();
    // Both refused, both blocked; the longer says when.
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(3_600)));
    let settings = limiter.settings();
    let blocks = settings.blocked("login_user", &"alice").await.unwrap();
    let mut suffixes: Vec<String> = vec![minute.storage_suffix(), hour.storage_suffix()];
    suffixes.sort();
    assert_eq!(
        blocks.iter().map(|b| b.suffix.clone()).collect::<Vec<_>>(),
        suffixes
    );
    clock.advance_micros(1_000_000);
    let left: Vec<Duration> = settings
        .blocked("login_user", &"alice")
        .await
        .unwrap()
        .iter()
        .map(|b| b.left)
        .collect();
    assert!(left.contains(&Duration::from_secs(899)));
    assert!(
        settings
            .blocked("login_user", &"bob")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(settings.unblock("login_user", &"alice").await.unwrap());
    assert!(!settings.unblock("login_user", &"alice").await.unwrap());
    assert!(
        settings
            .blocked("login_user", &"alice")
            .await
            .unwrap()
            .is_empty()
    );
    // Unblocked, not reset: the hour's state still refuses (and blocks again).
    assert!(limiter.call(&spec, &[&"alice"]).await.is_err());
    clock.advance_micros(3_600_000_000);
    assert!(limiter.call(&spec, &[&"alice"]).await.is_ok());
}

#[test]
fn a_block_of_one_limit_leaves_a_limit_of_another_name_alone() {
    let clock = ManualClock::new(START);
    let memory = MemoryBackend::with_clock(clock.clone());
    let limit = blocking(Algorithm::FixedWindow, 1_000_000);
    let (login, api) = (
        Key::new("rl", "login", "alice"),
        Key::new("rl", "api", "alice"),
    );
    for _ in 0..3 {
        memory.acquire_sync(&[Request::new(&login, &limit, 1)]);
    }
    assert_eq!(memory.blocks_sync(&login).len(), 1);
    assert!(memory.blocks_sync(&api).is_empty());
    assert!(
        memory
            .acquire_sync(&[Request::new(&api, &limit, 1)])
            .allowed()
    );
    assert!(!memory.unblock_sync(&api));
    assert_eq!(memory.blocks_sync(&login).len(), 1);
    assert_eq!(clock.now_micros(), START);
}
