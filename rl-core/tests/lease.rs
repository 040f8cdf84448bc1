//! Quota leasing through the pipeline, over the in-memory store used as a
//! remote backend (the same store, counted): which calls are decided from
//! leases, all-or-nothing over a call's groups, refunds back into the
//! lease, shadow mode, shutdown, and the `source="lease"` count. The Redis
//! side is tested in `tests/tests/redis_lease.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewall::{
    Algorithm, CallSpec, GroupSpec, Limit, Limiter,
    backend::{Backend, BoxFuture, Decisions, LeaseReturn, Leased, MemoryBackend, Request},
    call::Counting,
    clock::ManualClock,
    error::BackendError,
};

#[path = "support/ledger.rs"]
mod ledger;
use ledger::Ledger;

/// The memory store, counting the calls that reach it.
#[derive(Debug, Clone, Default)]
struct Counted {
    store: Arc<MemoryBackend>,
    calls: Arc<AtomicU64>,
}

impl Counted {
    /// A store whose time stands still mid-minute: its fixed windows are
    /// aligned to the minute, and a run crossing one on the system clock
    /// would rightly count a second window apart from the first.
    fn standing_still() -> Self {
        Self {
            store: Arc::new(MemoryBackend::with_clock(ManualClock::new(
                1_800_000_030_000_000,
            ))),
            ..Self::default()
        }
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl Backend for Counted {
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.count();
        self.store.acquire(requests)
    }

    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        self.store.peek(requests)
    }

    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.count();
        self.store.refund(requests, at_micros)
    }

    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>> {
        self.count();
        self.store.reset(requests)
    }

    fn acquire_lease<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        extra: &'a [u64],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Leased, BackendError>> {
        self.count();
        self.store.acquire_lease(requests, extra, ttl)
    }

    fn return_lease<'a>(
        &'a self,
        returns: &'a [LeaseReturn<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.count();
        self.store.return_lease(returns)
    }
}

fn limiter(backend: &Counted) -> Limiter {
    Limiter::builder()
        .shared_backend(Arc::new(backend.clone()))
        .prefix("lease")
        .build()
        .expect("limiter")
}

fn window(threshold: u64, lease: u64) -> Limit {
    Limit::per_minute(threshold)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .and_then(|l| l.with_lease(lease))
        .expect("limit")
}

/// Calls `spec` for `identities` until the limiter holds a lease; how many
/// calls were admitted.
async fn until_leased(limiter: &Limiter, spec: &CallSpec, identities: &[&str]) -> u64 {
    let identities: Vec<&(dyn std::fmt::Display + Sync)> = identities
        .iter()
        .map(|i| i as &(dyn std::fmt::Display + Sync))
        .collect();
    let mut admitted = 0;
    for _ in 0..100_000 {
        if limiter.leased_units() > 0 {
            return admitted;
        }
        if limiter.call(spec, &identities).await.is_ok() {
            admitted += 1;
        }
    }
    panic!("no lease was taken");
}

/// What the store counts for `identity` under `name` and `limit`.
async fn taken(backend: &Counted, name: &str, identity: &str, limit: &Limit) -> u64 {
    let key = ratewall::Key::new("lease", name, identity);
    let decision = backend
        .store
        .peek(&[Request::new(&key, limit, 1)])
        .await
        .unwrap()[0];
    limit.threshold() - decision.remaining()
}

#[tokio::test]
async fn a_hot_identitys_calls_are_decided_from_its_lease_without_the_store() {
    let backend = Counted::standing_still();
    let limiter = limiter(&backend);
    let limit = window(100_000, 500);
    let spec = CallSpec::owned("api", vec![GroupSpec::owned("api", vec![limit])]);
    until_leased(&limiter, &spec, &["tenant"]).await;
    let before = backend.calls();
    let held = limiter.leased_units();
    for _ in 0..held {
        assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
    }
    assert_eq!(
        backend.calls(),
        before,
        "every call was decided from the lease"
    );
    assert_eq!(limiter.leased_units(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_hot_identity_takes_its_next_lease_ahead_and_reaches_the_store_once_per_lease() {
    let backend = Counted::default();
    let limiter = Arc::new(limiter(&backend));
    let limit = window(10_000_000, 1_000);
    let spec = Arc::new(CallSpec::owned(
        "api",
        vec![GroupSpec::owned("api", vec![limit])],
    ));
    until_leased(&limiter, &spec, &["tenant"]).await;
    let calls = backend.calls();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        tasks.spawn(async move {
            for i in 0..25_000 {
                assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("caller");
    }
    // 200 000 decisions from leases of at most 1 000 units: at least 200
    // takes; a caller that found the lease spent before the next one came
    // went to the store itself (the store answering at once, that is
    // mostly the time the runtime takes to run the take sent ahead).
    let reached = backend.calls() - calls;
    assert!(
        reached * 20 < 200_000,
        "{reached} calls reached the store for 200 000 decisions"
    );
}

#[tokio::test]
async fn a_call_is_decided_in_process_only_when_every_group_holds_a_lease_all_or_nothing() {
    let backend = Counted::standing_still();
    let limiter = limiter(&backend);
    let key = window(100_000, 500);
    // 300 a minute: spent quickly, then its lease takes are refused.
    let ip = window(300, 100);
    let spec = CallSpec::owned(
        "api",
        vec![
            GroupSpec::owned("api_key", vec![key]),
            GroupSpec::owned("api_ip", vec![ip]),
        ],
    );
    let mut admitted = until_leased(&limiter, &spec, &["k", "10.0.0.1"]).await;
    // Both leases held: decided here, both groups take a unit.
    let calls = backend.calls();
    let held = limiter.leased_units();
    assert!(limiter.call(&spec, &[&"k", &"10.0.0.1"]).await.is_ok());
    admitted += 1;
    assert_eq!(backend.calls(), calls);
    assert_eq!(limiter.leased_units(), held - 2);
    // Spend the per-IP limit: refused, and a refused call takes nothing
    // from the per-key lease.
    let mut refused = None;
    for _ in 0..1_000 {
        match limiter.call(&spec, &[&"k", &"10.0.0.1"]).await {
            Ok(_) => admitted += 1,
            Err(rejection) => {
                refused = Some(rejection);
                break;
            }
        }
    }
    let refused = refused.expect("the per-IP limit refuses");
    assert_eq!(refused.name(), "api_ip");
    let held = limiter.leased_units();
    for _ in 0..10 {
        assert!(limiter.call(&spec, &[&"k", &"10.0.0.1"]).await.is_err());
    }
    assert_eq!(
        limiter.leased_units(),
        held,
        "nothing taken from a refused call"
    );
    // Every unit given back, the store counts exactly what was admitted:
    // never more than the per-IP limit.
    limiter.shutdown().await;
    assert!(admitted <= 300, "{admitted}");
    assert_eq!(taken(&backend, "api_ip", "10.0.0.1", &ip).await, admitted);
    assert_eq!(taken(&backend, "api_key", "k", &key).await, admitted);
}

#[tokio::test]
async fn a_call_settled_as_not_counted_gives_its_units_back_to_the_lease() {
    let backend = Counted::standing_still();
    let limiter = limiter(&backend);
    let limit = window(100_000, 500);
    let spec = CallSpec::owned("login", vec![GroupSpec::owned("login", vec![limit])])
        .with_counting(Counting::Settled);
    until_leased(&limiter, &spec, &["alice"]).await;
    let calls = backend.calls();
    let held = limiter.leased_units();
    let permit = limiter.call(&spec, &[&"alice"]).await.expect("admitted");
    assert_eq!(limiter.leased_units(), held - 1);
    permit.settle(false).await;
    assert_eq!(limiter.leased_units(), held, "back into the lease");
    assert_eq!(backend.calls(), calls, "without a round trip");
}

#[tokio::test]
async fn shutdown_gives_back_every_unused_unit_so_the_store_counts_what_was_admitted() {
    let backend = Counted::standing_still();
    let limiter = limiter(&backend);
    let limit = window(100_000, 2_000);
    let spec = CallSpec::owned("api", vec![GroupSpec::owned("api", vec![limit])]);
    let mut admitted = 0;
    for i in 0..5_000 {
        if limiter.call(&spec, &[&"tenant"]).await.is_ok() {
            admitted += 1;
        }
        // Leases are taken ahead by tasks on the runtime.
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert!(limiter.leased_units() > 0);
    limiter.shutdown().await;
    assert_eq!(limiter.leased_units(), 0);
    assert_eq!(taken(&backend, "api", "tenant", &limit).await, admitted);
    // After shutdown, every call goes to the store.
    let calls = backend.calls();
    assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
    assert_eq!(backend.calls(), calls + 1);
    assert_eq!(limiter.leased_units(), 0);
}

#[tokio::test]
async fn a_shadowed_name_takes_no_lease() {
    let backend = Counted::default();
    let limiter = limiter(&backend);
    limiter.settings().set_shadow("api", true);
    let spec = CallSpec::owned(
        "api",
        vec![GroupSpec::owned("api", vec![window(100_000, 500)])],
    );
    let calls = backend.calls();
    for _ in 0..2_000 {
        assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
    }
    assert_eq!(limiter.leased_units(), 0);
    assert_eq!(
        backend.calls(),
        calls + 2_000,
        "one round trip per decision"
    );
}

#[tokio::test]
async fn new_limits_for_a_name_give_its_leases_back() {
    let backend = Counted::standing_still();
    let limiter = limiter(&backend);
    let limit = window(100_000, 500);
    let spec = CallSpec::owned("api", vec![GroupSpec::owned("api", vec![limit])]);
    let admitted = until_leased(&limiter, &spec, &["tenant"]).await;
    limiter
        .settings()
        .set_limits("api", vec![limit.without_lease()])
        .unwrap();
    assert_eq!(limiter.leased_units(), 0, "the lease is retired");
    // ...and given back by the background task within a few ticks.
    for _ in 0..100 {
        if taken(&backend, "api", "tenant", &limit).await == admitted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the retired lease was not given back");
}

#[test]
fn decisions_from_leases_are_counted_with_source_lease_and_takes_are_counted() {
    let ledger = Ledger::default();
    let calls = metrics::with_local_recorder(&ledger, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend = Counted::standing_still();
            // A long lease: a busy machine's pauses do not end it mid-test.
            let limiter = Limiter::builder()
                .shared_backend(Arc::new(backend.clone()))
                .prefix("lease")
                .lease_ttl(Duration::from_secs(30))
                .build()
                .expect("limiter");
            let spec = CallSpec::owned(
                "api",
                vec![GroupSpec::owned("api", vec![window(100_000, 500)])],
            );
            let mut calls = until_leased(&limiter, &spec, &["tenant"]).await;
            for _ in 0..100 {
                assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
                calls += 1;
            }
            calls
        })
    });
    let decisions = ledger.counters("ratewall_decisions_total");
    let allowed = |source| {
        ledger.counter(
            "ratewall_decisions_total",
            &[("source", source), ("outcome", "allowed")],
        )
    };
    // Every admitted call counted once, by where it was decided.
    assert_eq!(
        allowed("lease") + allowed("backend"),
        calls,
        "{decisions:?}"
    );
    // The 100 calls after the lease was taken are decided from it.
    assert!(allowed("lease") >= 100, "{decisions:?}");
    assert!(allowed("backend") > 0);
    assert!(ledger.counter("ratewall_lease_takes_total", &[("limit", "api")]) >= 1);
}

#[test]
fn the_leased_units_gauge_shows_what_a_name_holds_and_drops_to_zero_on_shutdown() {
    let ledger = Ledger::default();
    let gauge = |ledger: &Ledger| ledger.gauge("ratewall_leased_units", &[("limit", "api")]);
    metrics::with_local_recorder(&ledger, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend = Counted::default();
            let limiter = limiter(&backend);
            let spec = CallSpec::owned(
                "api",
                vec![GroupSpec::owned("api", vec![window(100_000, 500)])],
            );
            until_leased(&limiter, &spec, &["tenant"]).await;
            // The background task refreshes the gauge every twentieth of
            // the lease TTL; keep the identity busy until it has.
            let mut shown = None;
            for _ in 0..1_000 {
                assert!(limiter.call(&spec, &[&"tenant"]).await.is_ok());
                shown = gauge(&ledger).filter(|&units| units > 0.0);
                if shown.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let shown = shown.expect("the gauge showed the leased units");
            // At most two leases of 500 (the current one and the next).
            assert!(shown <= 1_000.0, "{shown} units shown");
            limiter.shutdown().await;
            assert_eq!(limiter.leased_units(), 0);
        });
    });
    assert_eq!(gauge(&ledger), Some(0.0));
}
