use super::*;
use crate::model::decision::Figures;
use crate::model::key::Key;

const MS: u64 = 1_000_000;

fn refused(retry_ms: u64) -> Decision {
    Decision::new(Figures {
        allowed: false,
        limit: 5,
        remaining: 0,
        retry_after_us: retry_ms * 1_000,
        reset_after_us: retry_ms * 2_000,
        at_micros: 1_000,
    })
}

fn allowed() -> Decision {
    Decision::new(Figures {
        allowed: true,
        limit: 5,
        remaining: 3,
        retry_after_us: 0,
        reset_after_us: 100,
        at_micros: 1_000,
    })
}

fn cache() -> DenyCache {
    DenyCache::new(DEFAULT_CAPACITY, DEFAULT_MAX_HOLD)
}

fn target<'a>(key: &'a Key, limit: &'a Limit, cost: u64) -> Target<'a> {
    Target {
        name: "group",
        key: KeyRef::of(key),
        limit,
        cost,
        slot: None,
        lease: 0,
    }
}

fn hit(lookup: Lookup) -> Option<Hit> {
    match lookup {
        Lookup::Hit(hit) => Some(hit),
        _ => None,
    }
}

#[test]
fn a_refusal_is_remembered_until_its_retry_after_from_the_call_start() {
    let cache = DenyCache::new(DEFAULT_CAPACITY, Duration::from_secs(60));
    let limit = Limit::per_minute(5).unwrap();
    let key = Key::new("rl", "sms", "alice");
    let call = [target(&key, &limit, 1)];
    cache.learn("sms", &call, &Decisions::one(refused(100)), 10 * MS);
    let first = hit(cache.lookup(&call, 10 * MS)).expect("remembered");
    assert_eq!(first.index, 0);
    assert_eq!(first.decision.retry_after(), Duration::from_millis(100));
    let later = hit(cache.lookup(&call, 40 * MS)).expect("still remembered");
    assert_eq!(later.decision.retry_after(), Duration::from_millis(70));
    assert_eq!(later.decision.remaining(), 0);
    assert_eq!(later.decision.reset_after(), Duration::from_millis(170));
    assert_eq!(later.decision.at_micros(), 1_000 + 30_000);
    assert!(hit(cache.lookup(&call, 110 * MS - 1)).is_some());
    assert_eq!(
        cache.lookup(&call, 110 * MS),
        Lookup::Miss,
        "ends at retry_after"
    );
}

#[test]
fn a_partial_microsecond_left_rounds_up_so_waiting_it_out_suffices() {
    let cache = cache();
    let limit = Limit::per_minute(5).unwrap();
    let key = Key::new("rl", "sms", "alice");
    let call = [target(&key, &limit, 1)];
    cache.learn("sms", &call, &Decisions::one(refused(1)), 0);
    let hit = hit(cache.lookup(&call, 999_500)).expect("remembered");
    assert_eq!(hit.decision.retry_after(), Duration::from_micros(1));
}

#[test]
fn only_the_same_key_limit_and_at_least_the_same_cost_are_covered() {
    let cache = cache();
    let limit = Limit::per_minute(5).unwrap();
    let key = Key::new("rl", "sms", "alice");
    cache.learn(
        "sms",
        &[target(&key, &limit, 2)],
        &Decisions::one(refused(100)),
        0,
    );
    assert!(hit(cache.lookup(&[target(&key, &limit, 2)], 1)).is_some());
    assert!(hit(cache.lookup(&[target(&key, &limit, 3)], 1)).is_some());
    assert_eq!(
        cache.lookup(&[target(&key, &limit, 1)], 1),
        Lookup::Miss,
        "a cheaper call may fit"
    );
    let other_key = Key::new("rl", "sms", "bob");
    assert_eq!(
        cache.lookup(&[target(&other_key, &limit, 2)], 1),
        Lookup::Miss
    );
    let looser = limit.with_threshold(50).unwrap();
    assert_eq!(cache.lookup(&[target(&key, &looser, 2)], 1), Lookup::Miss);
}

#[test]
fn allowed_calls_and_zero_waits_are_not_remembered() {
    let cache = cache();
    let limit = Limit::per_minute(5).unwrap();
    let key = Key::new("rl", "sms", "alice");
    let call = [target(&key, &limit, 1)];
    cache.learn("sms", &call, &Decisions::one(allowed()), 0);
    cache.learn("sms", &call, &Decisions::one(refused(0)), 0);
    assert_eq!(cache.lookup(&call, 0), Lookup::Miss);
    assert_eq!(cache.len(), 0);
}

#[test]
fn a_multi_limit_call_remembers_the_binding_refusal_and_any_cached_target_refuses() {
    let cache = cache();
    let minute = Limit::per_minute(5).unwrap();
    let hour = Limit::per_hour(50).unwrap();
    let phone = Key::new("rl", "sms", "+1");
    let ip = Key::new("rl", "ip", "10.0.0.1");
    let call = [
        target(&phone, &minute, 1),
        target(&phone, &hour, 1),
        target(&ip, &minute, 1),
    ];
    let decisions = Decisions::new([refused(10), allowed(), refused(500)]);
    cache.learn("send", &call, &decisions, 0);
    let found = hit(cache.lookup(&call, MS)).expect("the binding refusal");
    assert_eq!(found.index, 2);
    assert_eq!(found.decision.retry_after(), Duration::from_millis(499));
    // Another phone from the same IP is refused by the IP's entry.
    let other = Key::new("rl", "sms", "+2");
    let other_call = [target(&other, &minute, 1), target(&ip, &minute, 1)];
    assert_eq!(hit(cache.lookup(&other_call, MS)).map(|h| h.index), Some(1));
    // The phone's own minute refusal was not the binding one.
    assert_eq!(cache.lookup(&call[..2], MS), Lookup::Miss);
}

#[test]
fn forgetting_by_target_and_by_name_drops_the_entries() {
    let cache = cache();
    let limit = Limit::per_minute(5).unwrap();
    let a = Key::new("rl", "sms", "alice");
    let b = Key::new("rl", "login", "bob");
    let ra = [target(&a, &limit, 1)];
    let mut rb = [target(&b, &limit, 1)];
    rb[0].name = "login";
    cache.learn("sms", &ra, &Decisions::one(refused(100)), 0);
    cache.learn("handler", &rb, &Decisions::one(refused(100)), 0);
    cache.forget(&ra);
    assert_eq!(cache.lookup(&ra, 1), Lookup::Miss);
    assert!(hit(cache.lookup(&rb, 1)).is_some());
    cache.forget_name("login");
    assert_eq!(cache.lookup(&rb, 1), Lookup::Miss);
    cache.learn("handler", &rb, &Decisions::one(refused(100)), 0);
    cache.forget_name("handler");
    assert_eq!(
        cache.lookup(&rb, 1),
        Lookup::Miss,
        "the call's name works too"
    );
    assert_eq!(cache.len(), 0);
}

#[test]
fn memory_stays_bounded_and_expired_entries_are_swept() {
    let cache = DenyCache::new(256, DEFAULT_MAX_HOLD);
    let limit = Limit::per_minute(5).unwrap();
    let keys: Vec<Key> = (0..10_000)
        .map(|i| Key::from_display("rl", "flood", &i))
        .collect();
    for (i, key) in keys.iter().enumerate() {
        // Each refusal lasts 1 ms, one new key every 10 µs.
        cache.learn(
            "flood",
            &[target(key, &limit, 1)],
            &Decisions::one(refused(1)),
            i as u64 * 10_000,
        );
        assert!(
            cache.len() <= 256 + cache.shards.len(),
            "{} keys",
            cache.len()
        );
    }
    // The newest refusal is still there; long-expired ones are gone.
    assert!(hit(cache.lookup(&[target(&keys[9_999], &limit, 1)], 9_999 * 10_000)).is_some());
    assert_eq!(
        cache.lookup(&[target(&keys[0], &limit, 1)], 9_999 * 10_000),
        Lookup::Miss
    );
}

#[test]
fn a_full_cache_of_live_refusals_evicts_the_one_ending_first() {
    let cache = DenyCache::new(1, DEFAULT_MAX_HOLD);
    let limit = Limit::per_minute(5).unwrap();
    let a = Key::new("rl", "x", "a");
    let b = Key::new("rl", "x", "b");
    cache.learn(
        "x",
        &[target(&a, &limit, 1)],
        &Decisions::one(refused(1_000)),
        0,
    );
    cache.learn(
        "x",
        &[target(&b, &limit, 1)],
        &Decisions::one(refused(1_000)),
        1,
    );
    assert_eq!(cache.len(), 1);
    assert!(hit(cache.lookup(&[target(&b, &limit, 1)], 2)).is_some());
}

#[test]
fn an_expired_hold_is_rechecked_by_one_caller_while_the_others_stay_refused() {
    // Refused for an hour, held for 1 s at a time.
    let cache = cache();
    let limit = Limit::per_hour(1).unwrap();
    let key = Key::new("rl", "sms", "alice");
    let call = [target(&key, &limit, 1)];
    cache.learn("sms", &call, &Decisions::one(refused(3_600_000)), 0);
    assert!(hit(cache.lookup(&call, 999 * MS)).is_some(), "held");
    let at = 1_000 * MS;
    assert_eq!(
        cache.lookup(&call, at),
        Lookup::Probe,
        "the first caller re-checks"
    );
    for _ in 0..1_000 {
        assert!(
            hit(cache.lookup(&call, at + 1)).is_some(),
            "the others are refused"
        );
    }
    // The re-check's refusal starts a new hold...
    cache.learn("sms", &call, &Decisions::one(refused(3_599_000)), at);
    assert!(hit(cache.lookup(&call, at + 999 * MS)).is_some());
    // ...and a re-check that never answered lets one more caller try
    // once its lease (one hold) is over.
    assert_eq!(cache.lookup(&call, at + 1_000 * MS), Lookup::Probe);
    assert!(hit(cache.lookup(&call, at + 1_500 * MS)).is_some());
    assert_eq!(cache.lookup(&call, at + 2_000 * MS), Lookup::Probe);
}

#[test]
fn a_notice_of_room_given_back_under_a_key_forgets_every_limit_of_that_key_only() {
    let cache = cache();
    let (minute, hour) = (Limit::per_minute(5).unwrap(), Limit::per_hour(50).unwrap());
    let alice = Key::new("rl", "sms", "alice");
    let bob = Key::new("rl", "sms", "bob");
    let both = [target(&alice, &minute, 1), target(&alice, &hour, 1)];
    let refusals = Decisions::new([refused(100), refused(900)]);
    cache.learn("sms", &both, &refusals, 0);
    let bobs = [target(&bob, &minute, 1)];
    cache.learn("sms", &bobs, &Decisions::one(refused(100)), 0);
    assert!(hit(cache.lookup(&both, MS)).is_some());
    // The notice names the key as rendered (its identity in its one form).
    let told = Key::new("rl", "sms", "alice");
    cache.forget_key(&KeyRef::parse(told.as_str()).expect("a rendered key"));
    assert_eq!(cache.lookup(&both, MS), Lookup::Miss);
    assert_eq!(cache.outage(&both, MS), None, "not even for an outage");
    assert!(hit(cache.lookup(&bobs, MS)).is_some(), "another key stays");
    // A number identity is kept in its typed form: found all the same.
    let numbered = Key::from_display("rl", "jobs", &42);
    let jobs = [target(&numbered, &minute, 1)];
    cache.learn("jobs", &jobs, &Decisions::one(refused(100)), 0);
    cache.forget_key(&KeyRef::parse("rl:{jobs:42}").expect("a rendered key"));
    assert_eq!(cache.lookup(&jobs, MS), Lookup::Miss);
}
