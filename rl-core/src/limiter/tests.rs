//! The direct lane: a call of one rate limit on the memory store, with
//! nothing around it but observation, is decided by the store straight
//! away. It must answer exactly as the full pipeline does.

use std::collections::HashMap;
use std::time::Duration;

use super::Limiter;
use super::resolve;
use crate::model::key::{Key, Part};
use crate::testing::{Counters, NowOrNever, logged};
use crate::{Algorithm, CallSpec, GroupSpec, Limit, clock::ManualClock};

/// `sms`: one group `sms_phone` of 3 per minute under `algorithm`.
fn sms(algorithm: Algorithm) -> CallSpec {
    let limit = Limit::per_minute(3)
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap();
    CallSpec::owned("sms", vec![GroupSpec::owned("sms_phone", vec![limit])])
}

fn limiter(clock: &ManualClock) -> Limiter {
    Limiter::builder()
        .memory()
        .prefix("t")
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Whether calls of `spec` on `limiter` take the direct lane now.
fn direct(limiter: &Limiter, spec: &CallSpec) -> bool {
    resolve::with(limiter, spec, |resolved| resolved.direct)
}

/// One call of `spec` for `who`, told as text: the admission's binding
/// decision or the rejection's name and reason.
fn outcome(limiter: &Limiter, spec: &CallSpec, who: &str) -> String {
    match limiter
        .call(spec, &[&who])
        .now()
        .expect("memory answers now")
    {
        Ok(permit) => format!("admitted {:?}", permit.binding()),
        Err(rejection) => format!("refused {} {:?}", rejection.name(), rejection.reason()),
    }
}

/// One call of `spec` for `who` as `#[rate_limit]` makes it when it keeps
/// no permit (`__private::admit`, whose lane builds no admission's
/// figures), told as text: admitted, or the rejection's name and reason.
fn admitted(limiter: &Limiter, spec: &CallSpec, who: &str) -> String {
    let decided = match crate::__private::admit(spec, Ok(limiter), &[Part::Text(who)]) {
        Ok(decided) => decided,
        Err(later) => later.now_or_never().expect("memory answers now"),
    };
    match decided {
        Ok(()) => "admitted".into(),
        Err(rejection) => format!("refused {} {:?}", rejection.name(), rejection.reason()),
    }
}

/// Two limiters on `clock`: one whose calls may take a lane, and one whose
/// calls pass the lists layer (an unrelated identity is deny-listed), so
/// take the full road.
fn lane_and_full_road(clock: &ManualClock) -> (Limiter, Limiter) {
    let (lane, full) = (limiter(clock), limiter(clock));
    full.settings()
        .deny(Some("other"), &"mallory", None)
        .now_or_never()
        .unwrap()
        .unwrap();
    (lane, full)
}

/// 30 calls on `lane` and on `full` (from [`lane_and_full_road`]), 5 s
/// apart, each told as text by `say(limiter, step)`: the same answers, in
/// the same order, the same log lines, and the same `ratewall_decisions_total`
/// counts, admissions and refusals of `name` among them.
fn assert_answered_alike(
    algorithm: Algorithm,
    clock: &ManualClock,
    (lane, full): (&Limiter, &Limiter),
    name: &str,
    say: impl Fn(&Limiter, usize) -> String,
) {
    let (lane_counts, full_counts) = (Counters::default(), Counters::default());
    let mut refusals_logged = 0;
    for step in 0..30 {
        let (lane_said, lane_log) =
            logged(|| metrics::with_local_recorder(&lane_counts, || say(lane, step)));
        let (full_said, full_log) =
            logged(|| metrics::with_local_recorder(&full_counts, || say(full, step)));
        assert_eq!(lane_said, full_said, "{algorithm:?}, step {step}");
        assert_eq!(lane_log, full_log, "{algorithm:?}, step {step}");
        refusals_logged += lane_log.matches("rate limited").count();
        clock.advance(Duration::from_secs(5));
    }
    assert!(refusals_logged > 0, "{algorithm:?}: no refusal was logged");
    let by = |counts: &Counters| -> HashMap<String, u64> {
        counts.by("ratewall_decisions_total", &["limit", "outcome", "source"])
    };
    let counted = by(&lane_counts);
    assert_eq!(counted, by(&full_counts), "{algorithm:?}");
    assert!(
        counted.get(&format!("{name} rejected backend")) > Some(&0),
        "{algorithm:?}: {counted:?}"
    );
    assert!(
        counted.get(&format!("{name} allowed backend")) > Some(&0),
        "{algorithm:?}: {counted:?}"
    );
}

/// For every algorithm, the same calls told by `say` on a limiter that
/// takes the direct lane and on one whose calls take the full road (see
/// [`assert_answered_alike`]).
fn assert_the_lane_answers_as_the_full_road(say: fn(&Limiter, &CallSpec, &str) -> String) {
    for algorithm in Algorithm::ALL {
        let spec = sms(algorithm);
        let clock = ManualClock::new(1_700_000_000_000_000);
        let (lane, full) = lane_and_full_road(&clock);
        assert!(direct(&lane, &spec), "{algorithm:?}");
        assert!(!direct(&full, &spec), "{algorithm:?}");
        assert_answered_alike(algorithm, &clock, (&lane, &full), "sms", |limiter, step| {
            say(limiter, &spec, ["alice", "bob"][step % 2])
        });
    }
}

/// The same calls on a limiter that takes the direct lane and on one whose
/// calls take the full road: the same answers and counts.
#[test]
fn the_direct_lane_answers_and_counts_as_the_full_pipeline() {
    assert_the_lane_answers_as_the_full_road(outcome);
}

/// The macro's admission-only call (no figures of an admission built on
/// the lane) answers, logs and counts as the full road does.
#[test]
fn the_macros_admissions_on_the_direct_lane_answer_and_count_as_the_full_pipeline() {
    assert_the_lane_answers_as_the_full_road(admitted);
}

#[test]
fn a_call_leaves_the_direct_lane_while_something_else_must_see_it() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = limiter(&clock);
    let spec = sms(Algorithm::Gcra);
    assert!(direct(&limiter, &spec));

    // Shadow mode turns refusals into admissions: a layer with work to do.
    limiter.settings().set_shadow("sms", true);
    assert!(!direct(&limiter, &spec));
    let admitted = (0..5)
        .filter(|_| limiter.call(&spec, &[&"carol"]).now().unwrap().is_ok())
        .count();
    assert_eq!(admitted, 5, "shadowed refusals are admitted");
    limiter.settings().set_shadow("sms", false);
    assert!(direct(&limiter, &spec));
    assert!(limiter.call(&spec, &[&"carol"]).now().unwrap().is_err());

    // An allow list bypasses the limit.
    limiter
        .settings()
        .allow(Some("sms_phone"), &"carol", None)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert!(!direct(&limiter, &spec));
    assert!(limiter.call(&spec, &[&"carol"]).now().unwrap().is_ok());
    assert!(
        limiter
            .settings()
            .unlist(Some("sms_phone"), &"carol")
            .now_or_never()
            .unwrap()
            .unwrap()
    );
    assert!(direct(&limiter, &spec));
    assert!(limiter.call(&spec, &[&"carol"]).now().unwrap().is_err());

    // Several limits, a cost settled after the call, an in-flight limit:
    // the full pipeline.
    let two = CallSpec::owned(
        "two",
        vec![GroupSpec::owned(
            "two",
            vec![Limit::per_minute(3).unwrap(), Limit::per_hour(10).unwrap()],
        )],
    );
    assert!(!direct(&limiter, &two));
    let settled = sms(Algorithm::Gcra).with_counting(crate::limiter::spec::Counting::Settled);
    assert!(!direct(&limiter, &settled));
    let in_flight = CallSpec::owned(
        "jobs",
        vec![GroupSpec::owned("jobs", vec![Limit::in_flight(2).unwrap()])],
    );
    assert!(!direct(&limiter, &in_flight));
}

/// The guide's architecture diagram names the builder's layers, in the
/// builder's order (a remote store: every layer is there).
#[test]
fn the_guide_diagram_lists_the_builders_layers_in_order() {
    let limiter = Limiter::builder()
        .backend(crate::backend::MemoryBackend::new())
        .build()
        .expect("limiter");
    let built: Vec<&str> = limiter
        .pipeline
        .layer_names()
        .iter()
        .map(|name| match name.as_str() {
            "Observe" => "observe",
            "ListSync" => "lists sync",
            "DenyList" => "lists",
            "Validate" => "validate",
            "Failure" => "failure",
            "DenyLayer" => "deny_cache",
            "Shadow" => "shadow",
            "Leases" => "lease",
            "Abandoned" => "abandon",
            "Breaker" => "breaker",
            "Publish" => "publish",
            other => panic!("a layer the guide does not know: {other}"),
        })
        .collect();
    let page = include_str!("../../docs/guide/architecture.md");
    let diagram = page
        .split("```text")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .expect("the guide's architecture diagram");
    // The layer lines: three spaces, a name, two or more spaces.
    let listed: Vec<&str> = diagram
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("   ")?;
            let name = rest.split("  ").next()?.trim();
            (!name.is_empty() && !rest.starts_with(' ') && name != "store" && name != "algorithms")
                .then_some(name)
        })
        .collect();
    assert_eq!(listed, built, "the guide's layers against the builder's");
}

/// One raw `requests().acquire` of `cost` for `key` under `limit`, told
/// as text: the decision, or the error.
fn raw(limiter: &Limiter, limit: &Limit, key: &Key, cost: u64) -> String {
    match limiter
        .requests()
        .acquire(key, limit, cost)
        .now_or_never()
        .expect("memory answers now")
    {
        Ok(decision) => format!("{decision:?}"),
        Err(error) => format!("error {error}"),
    }
}

/// Raw requests take a lane of their own while no layer has work to do
/// with them: the same decisions, errors and counts as on the full road
/// (a limiter whose lists hold an unrelated entry), refusals and a cost
/// above the capacity included. With keys built afresh for each call, and
/// with keys built once and reused (as `acquire` is meant to be called: a
/// key remembers where the store keeps its state and the counter of its
/// admissions after its first decision on the lane).
#[test]
fn raw_acquires_on_the_lane_answer_and_count_as_the_full_pipeline() {
    for reused in [false, true] {
        for algorithm in Algorithm::ALL {
            let limit = Limit::per_minute(3)
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap();
            let clock = ManualClock::new(1_700_000_000_000_000);
            let (lane, full) = lane_and_full_road(&clock);
            let keys_of =
                |limiter: &Limiter| ["alice", "bob"].map(|who| limiter.key("sms_raw", &who));
            let (lane_keys, full_keys) = (keys_of(&lane), keys_of(&full));
            assert_answered_alike(
                algorithm,
                &clock,
                (&lane, &full),
                "sms_raw",
                |limiter, step| {
                    let cost = if step == 7 { 4 } else { 1 };
                    let kept = if std::ptr::eq(limiter, &lane) {
                        &lane_keys
                    } else {
                        &full_keys
                    };
                    if reused {
                        raw(limiter, &limit, &kept[step % 2], cost)
                    } else {
                        let who = ["alice", "bob"][step % 2];
                        raw(limiter, &limit, &limiter.key("sms_raw", &who), cost)
                    }
                },
            );
            let remembered = (lane.remembered.len(), full.remembered.len());
            // The full road remembers nothing.
            assert_eq!(remembered, (1, 0), "{algorithm:?}, reused: {reused}");
        }
    }
}

/// The raw lane reasons about the memory pipeline's layers by name (see
/// `Requests::lane`): a layer added to it must be weighed there first.
#[test]
fn the_raw_lane_knows_every_layer_of_a_memory_pipeline() {
    for deny_cache in [false, true] {
        let limiter = Limiter::builder()
            .memory()
            .deny_cache(deny_cache)
            .build()
            .unwrap();
        let mut known = vec!["Observe", "DenyList", "Validate", "Failure"];
        if deny_cache {
            known.push("DenyLayer");
        }
        known.push("Shadow");
        assert_eq!(limiter.pipeline.layer_names(), known);
    }
}

#[test]
fn raw_acquires_meet_the_lists_and_shadow_mode_as_on_the_full_road() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = limiter(&clock);
    let limit = Limit::per_minute(1).unwrap();
    let allowed = |who: &str| {
        let key = limiter.key("sms_raw", &who);
        limiter
            .requests()
            .acquire(&key, &limit, 1)
            .now_or_never()
            .unwrap()
            .unwrap()
            .allowed()
    };
    assert!(allowed("dave"));
    assert!(!allowed("dave"));
    // A raw decision is the store's: shadow mode does not turn it into an
    // admission, but the full road still sees (and counts) it as shadowed.
    limiter.settings().set_shadow("sms_raw", true);
    let counts = Counters::default();
    let shadowed = metrics::with_local_recorder(&counts, || allowed("dave"));
    assert!(!shadowed);
    let counted = counts.by("ratewall_decisions_total", &["limit", "outcome", "source"]);
    assert_eq!(
        counted.get("sms_raw shadow_rejected backend"),
        Some(&1),
        "{counted:?}"
    );
    limiter.settings().set_shadow("sms_raw", false);

    // A deny-listed identity is denied.
    let settings = limiter.settings();
    settings
        .deny(Some("sms_raw"), &"erin", None)
        .now_or_never()
        .unwrap()
        .unwrap();
    let key = limiter.key("sms_raw", &"erin");
    let denied = limiter
        .requests()
        .acquire(&key, &limit, 1)
        .now_or_never()
        .unwrap();
    assert!(matches!(denied, Err(crate::Error::Denied(_))), "{denied:?}");
}

/// What the keys remember is kept once per key head and limit state, not
/// per key: any number of keys of one scope and limit cost one memory.
#[test]
fn keys_of_one_scope_and_limit_share_one_memory() {
    let limiter = limiter(&ManualClock::new(1_700_000_000_000_000));
    let (minute, hour) = (Limit::per_minute(5).unwrap(), Limit::per_hour(5).unwrap());
    let keys: Vec<_> = (0..1_000u32).map(|i| limiter.key("sms_raw", &i)).collect();
    let acquire = |key: &Key, limit: &Limit| {
        let decided = limiter.requests().acquire(key, limit, 1).now_or_never();
        assert!(decided.unwrap().unwrap().allowed());
    };
    for key in &keys {
        acquire(key, &minute);
        acquire(key, &minute);
    }
    assert_eq!(limiter.remembered.len(), 1);
    // Another state (period) of the same scope, and another scope.
    acquire(&limiter.key("sms_raw", &"zoe"), &hour);
    acquire(&limiter.key("login_raw", &"zoe"), &minute);
    assert_eq!(limiter.remembered.len(), 3);
    // Equality and hashing do not see what a key remembers.
    let fresh = limiter.key("sms_raw", &7u32);
    assert_eq!(keys[7], fresh);
    let hasher = std::hash::RandomState::new();
    assert_eq!(
        std::hash::BuildHasher::hash_one(&hasher, &keys[7]),
        std::hash::BuildHasher::hash_one(&hasher, &fresh)
    );
}

/// `acquire` is a future like any other: it decides when first polled, not
/// when built (one built and dropped takes nothing), it can be sent to
/// another thread, it outlives the `requests()` handle it came from, and it
/// answers the same on the lane and on the full road.
#[test]
fn an_acquire_decides_when_polled_and_can_be_sent() {
    fn sendable<F: std::future::Future + Send>(future: F) -> F {
        future
    }
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (lane, full) = lane_and_full_road(&clock);
    let limit = Limit::per_minute(1).unwrap();
    for limiter in [&lane, &full] {
        let key = limiter.key("sms_raw", &"alice");
        drop(limiter.requests().acquire(&key, &limit, 1));
        let polled = |limiter: &Limiter| {
            let acquired = sendable(limiter.requests().acquire(&key, &limit, 1));
            std::thread::scope(|scope| scope.spawn(|| acquired.now_or_never()).join())
                .unwrap()
                .expect("in memory")
                .unwrap()
                .allowed()
        };
        // One call a minute: the dropped future took nothing.
        assert_eq!([polled(limiter), polled(limiter)], [true, false]);
    }
}

/// Polled again after it answered, `acquire`'s future panics, as an
/// `async fn`'s does, on the lane and on the full road: it never decides,
/// and takes, twice.
#[test]
fn an_acquire_polled_after_it_answered_panics_instead_of_taking_again() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (lane, full) = lane_and_full_road(&clock);
    let limit = Limit::per_minute(2).unwrap();
    for limiter in [&lane, &full] {
        let key = limiter.key("sms_raw", &"bob");
        let mut acquired = std::pin::pin!(limiter.requests().acquire(&key, &limit, 1));
        let mut poll = || {
            acquired
                .as_mut()
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        };
        assert!(matches!(poll(), std::task::Poll::Ready(Ok(d)) if d.allowed()));
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(poll));
        assert!(again.is_err(), "a second poll answered");
        // The second poll took nothing: one of the two calls is left.
        let left = limiter.requests().acquire(&key, &limit, 1).now_or_never();
        assert!(left.unwrap().unwrap().allowed());
    }
}

/// A key that remembers is what a key was before: sent, shared and unwind
/// safe (what it remembers is set once and never changed).
#[test]
fn a_key_that_remembers_keeps_its_auto_traits() {
    fn holds<T: Send + Sync + Unpin + std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    holds::<Key>();
}

/// A key remembers the first store and limit it was decided under; used
/// with another limiter's store, or another limit's state, it decides there
/// as a key that remembers nothing: every state stays its own.
#[test]
fn a_key_used_with_another_store_or_limit_decides_there_as_a_fresh_key() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (a, b) = (limiter(&clock), limiter(&clock));
    let (minute, hour) = (Limit::per_minute(1).unwrap(), Limit::per_hour(1).unwrap());
    let key = a.key("sms_raw", &"frank");
    let allowed = |limiter: &Limiter, key: &Key, limit: &Limit| {
        let decided = limiter.requests().acquire(key, limit, 1).now_or_never();
        decided.unwrap().unwrap().allowed()
    };
    let mut said = Vec::new();
    for _ in 0..2 {
        said.push(allowed(&a, &key, &minute));
        said.push(allowed(&b, &key, &minute));
        said.push(allowed(&a, &key, &hour));
        // A clone remembers what the key remembers.
        said.push(allowed(&a, &key.clone(), &minute));
    }
    assert_eq!(said, [true, true, true, false, false, false, false, false]);
    assert_eq!((a.remembered.len(), b.remembered.len()), (1, 0));
}

/// Keys shared by threads that decide them at once, each key's first
/// decision included (when it learns what it remembers): every limit holds
/// exactly, no admission is lost or doubled.
#[test]
fn keys_shared_by_threads_admit_exactly_their_limits() {
    let limiter = limiter(&ManualClock::new(1_700_000_000_000_000));
    let limit = Limit::per_hour(50).unwrap();
    let keys: Vec<_> = (0..8u32).map(|i| limiter.key("sms_raw", &i)).collect();
    let admitted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..40 {
                    for key in &keys {
                        let decided = limiter.requests().acquire(key, &limit, 1).now_or_never();
                        if decided.unwrap().unwrap().allowed() {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    // 4 threads × 40 tries of each key: 160 each, 50 admitted each.
    assert_eq!(admitted.into_inner(), 8 * 50);
    assert_eq!(limiter.remembered.len(), 1);
}
