//! The publishing layer: tells a remote backend, once an hour per name, the
//! limits each name currently decides with (for operators' tools such as
//! ratewall-redis' `ratewall` CLI), only after the backend has answered a
//! decision, so an outage never costs a call a second timeout.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::{Answer, Call, Layer, Source};
use crate::model::limit::Limit;
use crate::store::backend::Backend;

/// How often a remote backend is told again about a name's limits.
const REPUBLISH: Duration = Duration::from_secs(3_600);

/// A name and its limits in one call.
type NamedLimits = (Box<str>, SmallVec<[Limit; 4]>);

/// Publishes each name's limits to the backend.
#[derive(Debug)]
pub(crate) struct Publish {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn Backend>,
    prefix: Box<str>,
    /// When each name was last published.
    published: Mutex<HashMap<Box<str>, Instant>>,
}

impl Publish {
    pub(crate) fn new(backend: Arc<dyn Backend>, prefix: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                prefix: prefix.into(),
                published: Mutex::default(),
            }),
        }
    }
}

impl Inner {
    /// The groups of a call not published within [`REPUBLISH`] (marked as
    /// published). Synchronous and cheap: the common call publishes nothing.
    fn stale(&self, call: &Call<'_>) -> Vec<NamedLimits> {
        let mut published = self.published.lock();
        let mut stale: Vec<NamedLimits> = Vec::new();
        for target in call.targets {
            if let Some((_, limits)) = stale.iter_mut().find(|(n, _)| **n == *target.name) {
                limits.push(*target.limit);
            } else if published
                .get(target.name)
                .is_none_or(|at| at.elapsed() > REPUBLISH)
            {
                published.insert(target.name.into(), Instant::now());
                stale.push((target.name.into(), smallvec::smallvec![*target.limit]));
            }
        }
        stale
    }
}

impl Layer for Publish {
    fn acts_before(&self) -> bool {
        false
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        let decided = matches!(
            answer,
            Answer::Decided {
                source: Source::Backend,
                ..
            }
        );
        if !decided || !call.op.admits() {
            return;
        }
        let stale = self.inner.stale(call);
        if stale.is_empty() {
            return;
        }
        let inner = self.inner.clone();
        call.then(Box::pin(async move {
            for (name, limits) in stale {
                if let Err(error) = inner
                    .backend
                    .publish_limits(&inner.prefix, &name, &limits)
                    .await
                {
                    inner.published.lock().remove(&name);
                    tracing::debug!(limit = &*name, %error, "could not publish limits");
                }
            }
        }));
    }

    fn changed(&self, name: &str) {
        self.inner.published.lock().remove(name);
    }
}
