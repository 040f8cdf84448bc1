//! `ratewall_decisions_total{limit, outcome, source}` and
//! `ratewall_backend_seconds{limit}`, recorded without rebuilding the metric key
//! on every decision.
//!
//! `metrics::counter!` with runtime labels allocates the label vector and
//! hashes the key on each call (about a third of an in-memory decision).
//! The key depends only on the call's name, the outcome and the source, so
//! each thread keeps the keys it built in a small direct-mapped table.
//!
//! Asking a registry-backed recorder (the Prometheus exporter) for a
//! counter hashes the key and searches its registry, which costs more than
//! an in-memory decision. So the counters of a call's commonest outcomes
//! ([`Prebuilt`], built when its spec is resolved), a raw request's key's
//! admissions ([`allowed`], kept in what the key remembers) and those of
//! the per-thread table ([`decision`]: the raw requests, the policy's
//! outcomes) keep their handles, but only those the
//! *global* recorder gave: it is installed once and never freed, so no
//! other recorder can ever be found at its address, while a local recorder
//! (`metrics::with_local_recorder`) can be dropped and another allocated
//! where it was. Local recorders are asked on every call, as before. (An
//! exporter that removes idle metrics keeps counting into a kept handle
//! after it removed it: the call's next resolution, e.g. after a settings
//! change, or its per-thread slot's next rebuild asks for a new one. That
//! is the `metrics` crate's own contract for handles held by their users.)

use std::cell::RefCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metrics::{Key, Label, Level, Metadata, Recorder};

use crate::model::memo::Counted;

/// Slots per thread (a power of two); a collision only rebuilds a key.
const SLOTS: usize = 32;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

struct CachedKey {
    outcome: &'static str,
    source: &'static str,
    /// The name, compared by content: a name's string may be freed and
    /// another allocated at its address.
    name: Box<str>,
    /// The key, and the global recorder's handle for it once asked.
    counted: Counted,
}

thread_local! {
    static KEYS: RefCell<[Option<CachedKey>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// Adds one to `ratewall_decisions_total{limit = name, outcome, source}`: as
/// [`count`] does, with the key (and the global recorder's handle) kept per
/// thread, so that a registry-backed recorder is not searched per call.
pub(crate) fn decision(name: &str, outcome: &'static str, source: &'static str) {
    let index = ((name.as_ptr() as usize >> 3)
        ^ (outcome.as_ptr() as usize >> 3)
        ^ (source.as_ptr() as usize >> 2)
        ^ name.len())
        & (SLOTS - 1);
    let counted = KEYS.try_with(|keys| {
        let Ok(mut keys) = keys.try_borrow_mut() else {
            return false;
        };
        let slot = &mut keys[index];
        let hit = slot.as_ref().is_some_and(|s| {
            std::ptr::eq(s.outcome, outcome) && std::ptr::eq(s.source, source) && *s.name == *name
        });
        if !hit {
            find_the_global_recorder();
            *slot = Some(CachedKey {
                outcome,
                source,
                name: name.into(),
                counted: Counted::new(key(name, outcome, source)),
            });
        }
        count(&slot.as_ref().expect("filled above").counted);
        true
    });
    if counted != Ok(true) {
        // Thread-local storage is being torn down (or in use): the slow way.
        metrics::with_recorder(|recorder| {
            recorder.register_counter(&key(name, outcome, source), &METADATA)
        })
        .increment(1);
    }
}

/// Records `seconds` in `ratewall_backend_seconds{limit = name}`, with the key
/// kept per thread ([`named`]): a remote call otherwise allocates the name,
/// the label vector and the key's hash on every decision.
pub(crate) fn backend_seconds(name: &str, seconds: f64) {
    histogram_record("ratewall_backend_seconds", name, seconds);
}

/// Slots per thread for the keys of [`named`] metrics (one per metric
/// and name).
const NAMED_SLOTS: usize = 16;

/// A metric's name, a limit name, and its key `metric{limit = name}`.
type Named = (&'static str, Box<str>, Key);

thread_local! {
    static NAMED: RefCell<[Option<Named>; NAMED_SLOTS]> =
        const { RefCell::new([const { None }; NAMED_SLOTS]) };
}

/// Runs `record` with the key `metric{limit = name}`, kept per thread as
/// [`decision`]'s: a metric recorded on every call (the in-flight gauge,
/// its releases, the wait histogram) allocates no label per call.
pub(crate) fn named(metric: &'static str, name: &str, record: impl FnOnce(&Key)) {
    let index = ((metric.as_ptr() as usize >> 3) ^ (name.as_ptr() as usize >> 3) ^ name.len())
        & (NAMED_SLOTS - 1);
    let mut record = Some(record);
    let done = NAMED.try_with(|keys| {
        let Ok(mut keys) = keys.try_borrow_mut() else {
            return false;
        };
        let slot = &mut keys[index];
        if slot
            .as_ref()
            .is_none_or(|(m, held, _)| !std::ptr::eq(*m, metric) || **held != *name)
        {
            *slot = Some((metric, name.into(), named_key(metric, name)));
        }
        let (_, _, key) = slot.as_ref().expect("filled above");
        if let Some(record) = record.take() {
            record(key);
        }
        true
    });
    if done != Ok(true)
        && let Some(record) = record.take()
    {
        record(&named_key(metric, name));
    }
}

/// Adds `delta` to the gauge `metric{limit = name}`.
pub(crate) fn gauge_add(metric: &'static str, name: &str, delta: f64) {
    named(metric, name, |key| {
        metrics::with_recorder(|recorder| recorder.register_gauge(key, &METADATA)).increment(delta);
    });
}

/// Adds one to the counter `metric{limit = name}`.
pub(crate) fn counter_add(metric: &'static str, name: &str) {
    named(metric, name, |key| {
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
    });
}

/// Records `value` in the histogram `metric{limit = name}`.
pub(crate) fn histogram_record(metric: &'static str, name: &str, value: f64) {
    named(metric, name, |key| {
        metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
            .record(value);
    });
}

fn named_key(metric: &'static str, name: &str) -> Key {
    kept(Key::from_parts(
        metric,
        vec![Label::new("limit", name.to_owned())],
    ))
}

/// A key built once and kept: made cheap to retain up front, so a
/// recorder that retains the keys it is given (the Prometheus exporter, on
/// every registration) clones reference counts instead of allocating.
fn kept(key: Key) -> Key {
    key.to_retained()
}

/// The keys of a call's commonest outcomes, built once when the call's spec
/// is resolved: what the hot path counts without any lookup.
#[derive(Debug)]
pub(crate) struct Prebuilt {
    /// `outcome="allowed", source="backend"`.
    pub(crate) allowed: Counted,
    /// `outcome="rejected", source="backend"`.
    pub(crate) rejected: Counted,
    /// `outcome="allowed", source="lease"`.
    pub(crate) leased: Counted,
}

impl Prebuilt {
    /// `allowed` and `rejected` look for the global recorder first.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            allowed: allowed(name),
            rejected: rejected(name),
            leased: Counted::new(key(name, "allowed", "lease")),
        }
    }
}

/// The counter of `name`'s admissions decided by the store
/// (`outcome="allowed", source="backend"`): [`Prebuilt::allowed`], and
/// what a raw request's key keeps.
pub(crate) fn allowed(name: &str) -> Counted {
    find_the_global_recorder();
    Counted::new(key(name, "allowed", "backend"))
}

/// The counter of `name`'s refusals by the store (`outcome="rejected",
/// source="backend"`): [`Prebuilt::rejected`], and what a raw request's
/// key keeps.
pub(crate) fn rejected(name: &str) -> Counted {
    find_the_global_recorder();
    Counted::new(key(name, "rejected", "backend"))
}

/// The counter `metric{prefix = prefix}`, to count with [`count`]: a
/// limiter's own counters (the refund notices it hears).
pub(crate) fn prefixed(metric: &'static str, prefix: &str) -> Counted {
    find_the_global_recorder();
    Counted::new(kept(Key::from_parts(
        metric,
        vec![Label::new("prefix", prefix.to_owned())],
    )))
}

/// Adds one to a prebuilt counter: through its kept handle when the
/// recorder in place is the global one, else by asking the recorder.
#[inline]
pub(crate) fn count(counted: &Counted) {
    let global = GLOBAL.load(Ordering::Relaxed);
    if global == 0 {
        // No global recorder (yet): the recorder in place is asked.
        metrics::with_recorder(|recorder| recorder.register_counter(&counted.key, &METADATA))
            .increment(1);
    } else {
        count_beside(counted, global);
    }
}

/// [`count`] once a global recorder (at `global`) is installed: through the
/// kept handle when it is the recorder in place. (Out of line, so that the
/// path without a recorder stays as short as it was: marked cold so that
/// the compiler keeps inlining that path into the decision.)
#[cold]
#[inline(never)]
fn count_beside(counted: &Counted, global: usize) {
    metrics::with_recorder(|recorder| {
        // Only a sized recorder's address is ever stored, so no zero-sized
        // one (whose address says nothing) is taken for it.
        if std::ptr::from_ref(recorder).cast::<()>() as usize == global {
            counted
                .global
                .get_or_init(|| recorder.register_counter(&counted.key, &METADATA))
                .increment(1);
        } else {
            recorder
                .register_counter(&counted.key, &METADATA)
                .increment(1);
        }
    });
}

/// The global recorder's address once one is installed (0 until then).
static GLOBAL: AtomicUsize = AtomicUsize::new(0);

/// When the global recorder was last looked for in vain.
static LOOKED: Mutex<Option<Instant>> = Mutex::new(None);

/// A recorder's address, 0 for a zero-sized one (the no-op recorder, or
/// any other whose address says nothing).
#[inline]
fn address(recorder: &dyn Recorder) -> usize {
    if std::mem::size_of_val(recorder) == 0 {
        0
    } else {
        std::ptr::from_ref(recorder).cast::<()>() as usize
    }
}

/// Learns the global recorder's address, if one is installed: asked from a
/// thread of its own, which has no local recorder. Once found it is kept
/// (a global recorder is set once and lives as long as the process); until
/// then it is looked for at most once a second, when a call is resolved.
fn find_the_global_recorder() {
    if GLOBAL.load(Ordering::Relaxed) != 0 {
        return;
    }
    let Ok(mut looked) = LOOKED.lock() else {
        return;
    };
    if looked.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
        return;
    }
    *looked = Some(Instant::now());
    let found = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("ratewall-metrics".into())
            .spawn_scoped(scope, || metrics::with_recorder(address))
            .ok()
            .and_then(|thread| thread.join().ok())
            .unwrap_or(0)
    });
    GLOBAL.store(found, Ordering::Relaxed);
}

fn key(name: &str, outcome: &'static str, source: &'static str) -> Key {
    kept(Key::from_parts(
        "ratewall_decisions_total",
        vec![
            Label::new("limit", name.to_owned()),
            Label::new("outcome", outcome),
            Label::new("source", source),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use metrics::{KeyName, SharedString, Unit};

    use super::*;
    use crate::testing::Counters;

    /// Every histogram's values so far, by key.
    #[derive(Debug, Default)]
    struct Histograms(Arc<Mutex<HashMap<Key, Vec<f64>>>>);

    impl Histograms {
        fn get(&self, key: &Key) -> Vec<f64> {
            self.0.lock().unwrap().get(key).cloned().unwrap_or_default()
        }
    }

    struct Values(Key, Arc<Mutex<HashMap<Key, Vec<f64>>>>);

    impl metrics::HistogramFn for Values {
        fn record(&self, value: f64) {
            self.1
                .lock()
                .unwrap()
                .entry(self.0.clone())
                .or_default()
                .push(value);
        }
    }

    impl metrics::Recorder for Histograms {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> metrics::Counter {
            metrics::Counter::noop()
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::from_arc(Arc::new(Values(key.clone(), self.0.clone())))
        }
    }

    #[test]
    fn named_counts_land_under_the_macros_key_whichever_name_string_carries_them() {
        let counters = Counters::default();
        metrics::with_local_recorder(&counters, || {
            counter_add("ratewall_in_flight_releases_total", "jobs");
            counter_add("ratewall_in_flight_releases_total", &String::from("jobs"));
            counter_add("ratewall_in_flight_expired_total", "jobs");
            let name = "jobs";
            metrics::counter!("ratewall_in_flight_releases_total", "limit" => name).increment(1);
        });
        let other = Counters::default();
        metrics::with_local_recorder(&other, || {
            counter_add("ratewall_in_flight_releases_total", "jobs")
        });
        let releases = named_key("ratewall_in_flight_releases_total", "jobs");
        assert_eq!(counters.get(&releases), Some(3));
        assert_eq!(
            counters.get(&named_key("ratewall_in_flight_expired_total", "jobs")),
            Some(1)
        );
        assert_eq!(
            other.get(&releases),
            Some(1),
            "the recorder in place counts"
        );
    }

    #[test]
    fn counts_land_under_the_same_key_as_the_counter_macro_and_follow_the_recorder() {
        let first = Counters::default();
        metrics::with_local_recorder(&first, || {
            decision("sms", "allowed", "backend");
            decision(&String::from("sms"), "allowed", "backend");
            decision("login", "rejected", "cache");
            let name = "sms";
            metrics::counter!("ratewall_decisions_total", "limit" => name, "outcome" => "allowed", "source" => "backend")
                .increment(1);
        });
        let second = Counters::default();
        metrics::with_local_recorder(&second, || decision("sms", "allowed", "backend"));
        assert_eq!(first.get(&key("sms", "allowed", "backend")), Some(3));
        assert_eq!(first.get(&key("login", "rejected", "cache")), Some(1));
        assert_eq!(second.get(&key("sms", "allowed", "backend")), Some(1));
    }

    #[test]
    fn backend_timings_land_under_the_same_key_as_the_histogram_macro() {
        let recorder = Histograms::default();
        metrics::with_local_recorder(&recorder, || {
            backend_seconds("sms", 0.5);
            backend_seconds(&String::from("sms"), 0.25);
            backend_seconds("login", 1.0);
            let name = "sms";
            metrics::histogram!("ratewall_backend_seconds", "limit" => name).record(2.0);
        });
        assert_eq!(
            recorder.get(&named_key("ratewall_backend_seconds", "sms")),
            vec![0.5, 0.25, 2.0]
        );
        assert_eq!(
            recorder.get(&named_key("ratewall_backend_seconds", "login")),
            vec![1.0]
        );
    }
}
