//! The lists layer: a call naming an identity on the deny list of one of
//! its limit names (or of every name) is refused at once, without asking
//! the backend, with its own reason ([`crate::RejectionReason::Denied`]);
//! a call whose every group is allow-listed is admitted without a decision
//! ([`crate::call::Admission::AllowListed`]). The groups of an allow-listed
//! identity are left out of a call when it is built (see
//! [`crate::settings::Settings::allow`]), so the others are still decided.

use std::sync::Arc;

use super::{Answer, Call, Layer, Plan};
use crate::model::lists::ListKind;
use crate::model::settings::Registry;
use crate::store::target::Op;

/// Refuses deny-listed identities, admits allow-listed calls.
#[derive(Debug)]
pub(crate) struct DenyList {
    registry: Arc<Registry>,
}

impl DenyList {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }
}

impl Layer for DenyList {
    fn acts_after(&self) -> bool {
        false
    }

    fn applies(&self, _plan: &Plan<'_>) -> bool {
        self.registry.any_listed(ListKind::Deny) || self.registry.any_listed(ListKind::Allow)
    }

    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        if call.allow_listed {
            return Some(Answer::AllowListed);
        }
        if !call.op.admits() && !matches!(call.op, Op::Peek(_))
            || !self.registry.any_listed(ListKind::Deny)
        {
            return None;
        }
        call.targets.iter().enumerate().find_map(|(index, target)| {
            target
                .key
                .identity
                .with_text(|identity| self.registry.listed(ListKind::Deny, target.name, identity))
                .map(|listed| Answer::Denied {
                    index,
                    until: listed.expires_at,
                })
        })
    }
}

/// Keeps a limiter's lists in step with the lists a remote backend shares
/// (every instance of one key prefix): at most once per refresh period,
/// after a call the backend has just answered (never during an outage), it
/// reads them again if their version changed. A change made on one instance
/// is therefore applied by another within the refresh period, plus the time
/// to its next call (one the backend answered, or one the lists answered:
/// this layer sits above the deny list, so an instance that only sees
/// deny-listed identities reads the lists too).
#[derive(Debug)]
pub(crate) struct ListSync {
    inner: Arc<SyncInner>,
}

#[derive(Debug)]
struct SyncInner {
    backend: Arc<dyn crate::store::backend::Backend>,
    prefix: Box<str>,
    registry: Arc<Registry>,
    refresh: u64,
    epoch: std::time::Instant,
    /// When the next read is due (ns after `epoch`).
    due: std::sync::atomic::AtomicU64,
    /// The version of the lists last read.
    version: std::sync::atomic::AtomicU64,
}

impl ListSync {
    pub(crate) fn new(
        backend: Arc<dyn crate::store::backend::Backend>,
        prefix: &str,
        registry: Arc<Registry>,
        refresh: std::time::Duration,
    ) -> Self {
        Self {
            inner: Arc::new(SyncInner {
                backend,
                prefix: prefix.into(),
                registry,
                refresh: u64::try_from(refresh.as_nanos()).unwrap_or(u64::MAX),
                epoch: std::time::Instant::now(),
                due: std::sync::atomic::AtomicU64::new(0),
                version: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }
}

impl SyncInner {
    async fn read(&self) {
        use std::sync::atomic::Ordering;
        let known = self.version.load(Ordering::Acquire);
        match self.backend.load_lists(&self.prefix, known).await {
            Ok(Some((version, entries))) => {
                self.registry.update_lists(|lists| {
                    let before = lists.entries();
                    lists.replace(entries);
                    before != lists.entries()
                });
                self.version.store(version, Ordering::Release);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "could not read the shared allow and deny lists");
            }
        }
    }
}

impl Layer for ListSync {
    fn acts_before(&self) -> bool {
        false
    }

    fn after(&self, call: &mut Call<'_>, answer: &mut Answer) {
        use std::sync::atomic::Ordering;
        // A call the backend answered, or one the lists answered without
        // asking it (an instance fed only deny-listed identities must see
        // an unlist too); not while the backend fails.
        let answered = matches!(
            answer,
            Answer::Decided {
                source: super::Source::Backend,
                ..
            } | Answer::Applied {
                source: super::Source::Backend
            } | Answer::Denied { .. }
                | Answer::AllowListed
        );
        if !answered {
            return;
        }
        let inner = &self.inner;
        let now = u64::try_from(inner.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let due = inner.due.load(Ordering::Acquire);
        // One caller per period reads; the others go on.
        if now < due
            || inner
                .due
                .compare_exchange(
                    due,
                    now.saturating_add(inner.refresh),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            return;
        }
        let inner = self.inner.clone();
        call.then(Box::pin(async move { inner.read().await }));
    }
}
