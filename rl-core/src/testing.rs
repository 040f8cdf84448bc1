//! Test support shared by the unit tests: a metrics recorder that counts
//! every counter increment by its key, polling a ready future, and what a
//! closure logs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics::{Key, KeyName, Metadata, SharedString, Unit};

/// Every counter's total so far, by key (labels included); gauges and
/// histograms are ignored. Install it with `metrics::with_local_recorder`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters(Arc<Mutex<HashMap<Key, u64>>>);

impl Counters {
    /// The total of counter `key`.
    pub(crate) fn get(&self, key: &Key) -> Option<u64> {
        self.0.lock().unwrap().get(key).copied()
    }

    /// Totals by the values of `labels`, joined with a space (e.g.
    /// `"sms allowed"` for `["limit", "outcome"]`; an absent label is
    /// empty), over every counter named `name`.
    pub(crate) fn by(&self, name: &str, labels: &[&str]) -> HashMap<String, u64> {
        let mut totals = HashMap::new();
        for (key, count) in self.0.lock().unwrap().iter() {
            if key.name() != name {
                continue;
            }
            let shown: Vec<&str> = labels
                .iter()
                .map(|wanted| {
                    key.labels()
                        .find(|l| l.key() == *wanted)
                        .map_or("", |l| l.value())
                })
                .collect();
            *totals.entry(shown.join(" ")).or_default() += count;
        }
        totals
    }
}

struct Tally(Key, Arc<Mutex<HashMap<Key, u64>>>);

impl metrics::CounterFn for Tally {
    fn increment(&self, value: u64) {
        *self.1.lock().unwrap().entry(self.0.clone()).or_default() += value;
    }

    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(Tally(key.clone(), self.0.clone())))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Polls a future once (the memory store's futures are ready).
pub(crate) trait NowOrNever: std::future::Future + Sized {
    /// The output, if the future completes without suspending.
    fn now_or_never(self) -> Option<Self::Output> {
        let mut future = std::pin::pin!(self);
        match future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }
}

impl<F: std::future::Future> NowOrNever for F {}

/// What `run` logs, one line per event, without times or colours.
pub(crate) fn logged<T>(run: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::TRACE)
        .without_time()
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, run);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (out, text)
}
