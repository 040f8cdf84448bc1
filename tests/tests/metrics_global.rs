//! Decisions counted through the *global* metrics recorder (how a service
//! runs with the Prometheus exporter installed): the recorder is asked for
//! each counter once, and every decision is counted; a local recorder put
//! in place on a thread gets that thread's counts instead. Its own test
//! binary: a global recorder is installed once per process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};
use ratewall::{CallSpec, GroupSpec, Limit, Limiter};

/// Counts, and how often each counter was asked for.
#[derive(Default)]
struct Registry {
    counts: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    asked: Mutex<HashMap<Key, u64>>,
}

impl Registry {
    fn count(&self, key: &Key) -> u64 {
        self.counts
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |count| count.load(Ordering::Relaxed))
    }

    fn asked(&self, key: &Key) -> u64 {
        self.asked.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

impl Recorder for Registry {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        *self.asked.lock().unwrap().entry(key.clone()).or_default() += 1;
        let count = self
            .counts
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        Counter::from_arc(count)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// The process's global recorder, installed by the first test that needs it.
fn global() -> &'static Registry {
    static GLOBAL: OnceLock<&'static Registry> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let registry: &'static Registry = Box::leak(Box::default());
        metrics::set_global_recorder(registry).expect("the only global recorder");
        registry
    })
}

/// `ratewall_decisions_total` of `name`'s decisions with `outcome`, decided by
/// the backend.
fn decided(name: &str, outcome: &'static str) -> Key {
    Key::from_parts(
        "ratewall_decisions_total",
        vec![
            Label::new("limit", name.to_owned()),
            Label::new("outcome", outcome),
            Label::new("source", "backend"),
        ],
    )
}

fn allowed(name: &str) -> Key {
    decided(name, "allowed")
}

fn spec(name: &'static str) -> CallSpec {
    let limit = Limit::new(1_000_000, Duration::from_secs(60)).expect("limit");
    CallSpec::owned(name, vec![GroupSpec::owned(name, vec![limit])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_recorder_is_asked_once_per_counter_and_counts_every_decision() {
    let registry = global();
    let limiter = Arc::new(Limiter::builder().build().expect("limiter"));
    let spec = Arc::new(spec("global_counted"));
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..4 {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        callers.spawn(async move {
            for n in 0..2_500u64 {
                let permit = limiter.call(&spec, &[&(caller * 10_000 + n % 50)]).await;
                drop(permit.expect("admitted"));
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.expect("caller");
    }
    let key = allowed("global_counted");
    assert_eq!(registry.count(&key), 10_000, "every decision is counted");
    // Each thread resolves a call's spec once (and keeps its counters).
    let asked = registry.asked(&key);
    assert!(
        (1..=2).contains(&asked),
        "the recorder was asked for the counter {asked} times: once per worker thread, not per decision"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_local_recorder_in_place_counts_its_threads_decisions_instead_of_the_global_one() {
    let registry = global();
    let limiter = Limiter::builder().build().expect("limiter");
    let spec = spec("locally_counted");
    let key = allowed("locally_counted");
    // Counted globally first, so a handle of the global recorder is kept.
    drop(limiter.call(&spec, &[&"a"]).await.expect("admitted"));
    assert_eq!(registry.count(&key), 1);
    for round in 1..=3u64 {
        // A new local recorder each round, possibly where the last one was.
        let local = Registry::default();
        {
            let _in_place = metrics::set_default_local_recorder(&local);
            for _ in 0..round {
                drop(limiter.call(&spec, &[&"a"]).await.expect("admitted"));
            }
        }
        assert_eq!(
            local.count(&key),
            round,
            "round {round}: the local recorder counts"
        );
        assert_eq!(
            registry.count(&key),
            1,
            "round {round}: the global one does not"
        );
    }
    drop(limiter.call(&spec, &[&"a"]).await.expect("admitted"));
    assert_eq!(registry.count(&key), 2, "the global recorder counts again");
}

#[tokio::test(flavor = "current_thread")]
async fn raw_requests_and_their_refusals_ask_the_global_recorder_once_per_counter() {
    let registry = global();
    let limiter = Limiter::builder().build().expect("limiter");
    let limit = Limit::new(100, Duration::from_secs(60)).expect("limit");
    let key = limiter.key("raw_counted", &"k");
    for _ in 0..150 {
        limiter
            .requests()
            .acquire(&key, &limit, 1)
            .await
            .expect("in memory");
    }
    let (allowed, rejected) = (allowed("raw_counted"), decided("raw_counted", "rejected"));
    assert_eq!(
        (registry.count(&allowed), registry.count(&rejected)),
        (100, 50),
        "every decision is counted"
    );
    assert_eq!(
        (registry.asked(&allowed), registry.asked(&rejected)),
        (1, 1),
        "the recorder is asked for each counter once on this thread, not per decision"
    );
}
