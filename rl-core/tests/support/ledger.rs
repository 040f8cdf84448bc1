//! A metrics recorder for tests: every counter, gauge and histogram the
//! code under test touches, by metric name and labels, read back by name and
//! any subset of the labels.
//!
//! (`metrics-util`'s `DebuggingRecorder` reads counters and gauges by
//! swapping them to zero, so a gauge read twice loses its level.)

// Each test file reads what it needs of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// A metric's name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

#[derive(Default)]
struct Book {
    counters: BTreeMap<Series, u64>,
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

/// Install with `metrics::set_default_local_recorder(&ledger)` or
/// `metrics::with_local_recorder(&ledger, ..)`; clones share the book.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Book>>);

/// Whether `series` is metric `name` with every one of `labels`.
fn matches(series: &Series, name: &str, labels: &[(&str, &str)]) -> bool {
    series.0 == name
        && labels
            .iter()
            .all(|(k, v)| series.1.iter().any(|(sk, sv)| sk == k && sv == v))
}

impl Ledger {
    /// The sum of counter `name` over its series with these labels.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let book = self.0.lock().unwrap();
        book.counters
            .iter()
            .filter(|(series, _)| matches(series, name, labels))
            .map(|(_, n)| n)
            .sum()
    }

    /// Every series of counter `name` touched, as `k=v,...` and its sum.
    pub fn counters(&self, name: &str) -> Vec<(String, u64)> {
        let book = self.0.lock().unwrap();
        book.counters
            .iter()
            .filter(|(series, _)| series.0 == name)
            .map(|((_, labels), n)| {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                (labels.join(","), *n)
            })
            .collect()
    }

    /// The level of gauge `name` with these labels, if it was touched (the
    /// sum over its series when the labels match several).
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let book = self.0.lock().unwrap();
        let mut levels = book
            .gauges
            .iter()
            .filter(|(series, _)| matches(series, name, labels))
            .map(|(_, level)| *level)
            .peekable();
        levels.peek()?;
        Some(levels.sum())
    }

    /// The values histogram `name` recorded with these labels, in order
    /// within each series.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let book = self.0.lock().unwrap();
        book.histograms
            .iter()
            .filter(|(series, _)| matches(series, name, labels))
            .flat_map(|(_, values)| values.iter().copied())
            .collect()
    }

    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        Arc::new(Handle {
            series: (key.name().to_owned(), labels),
            book: self.0.clone(),
        })
    }
}

/// One series' handle, writing into the shared book.
struct Handle {
    series: Series,
    book: Arc<Mutex<Book>>,
}

impl Handle {
    fn gauge(&self, change: impl FnOnce(&mut f64)) {
        let mut book = self.book.lock().unwrap();
        change(book.gauges.entry(self.series.clone()).or_default());
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        let mut book = self.book.lock().unwrap();
        *book.counters.entry(self.series.clone()).or_default() += value;
    }

    fn absolute(&self, value: u64) {
        let mut book = self.book.lock().unwrap();
        book.counters.insert(self.series.clone(), value);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.gauge(|level| *level += value);
    }

    fn decrement(&self, value: f64) {
        self.gauge(|level| *level -= value);
    }

    fn set(&self, value: f64) {
        self.gauge(|level| *level = value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        let mut book = self.book.lock().unwrap();
        book.histograms
            .entry(self.series.clone())
            .or_default()
            .push(value);
    }
}

impl Recorder for Ledger {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}
