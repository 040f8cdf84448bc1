//! Taking leases: a take sent ahead, what a take installs, and what the
//! store's answer to a call that asked for one leaves.

use super::*;

/// How a take ended, for one target.
struct Take<'d> {
    limit: &'d Limit,
    decision: &'d Decision,
    /// Whether the whole call was allowed (all-or-nothing).
    allowed: bool,
    extra: u64,
    granted: u64,
    /// Units taken besides the granted ones that go into the lease too (a
    /// take sent ahead takes one unit as its own cost).
    own: u64,
    sent: u64,
}

impl Leases {
    /// Sends a take for one target ahead of need, on the runtime.
    pub(super) fn take_ahead(self: &Arc<Self>, take: Ahead, sent: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.took(&take, sent, None);
            return;
        };
        let leases = Arc::downgrade(self);
        let ttl = Duration::from_nanos(self.timing.ttl);
        runtime.spawn(async move {
            let Some(leases) = leases.upgrade() else {
                return;
            };
            let request = [Request::new(&take.key, &take.limit, 1)];
            let result = leases
                .backend
                .acquire_lease(&request, &[take.extra], ttl)
                .await;
            if let Err(error) = &result {
                tracing::debug!(limit = &*take.name, %error, "could not take a lease ahead");
            }
            leases.took(&take, sent, result.ok());
        });
    }

    /// A take sent ahead came back (`None`: it failed).
    pub(super) fn took(&self, take: &Ahead, sent: u64, leased: Option<Leased>) {
        let found = self.locate_key(KeyRef::of(&take.key), &take.limit);
        let mut shard = self.shards.at(found.shard).lock();
        let mut retired = Retired::new();
        let key = KeyRef::of(&take.key);
        let entry = shard
            .table
            .find_mut(found.hash, |e| e.is(&key, &take.limit));
        let granted = match (entry, &leased) {
            (Some(entry), Some(leased)) => {
                entry.taking = 0;
                match (leased.decisions.as_slice().first(), leased.granted.first()) {
                    (Some(decision), Some(&granted)) => {
                        let units = self.install(
                            entry,
                            Take {
                                limit: &take.limit,
                                decision,
                                allowed: decision.allowed(),
                                extra: take.extra,
                                granted,
                                own: 1,
                                sent,
                            },
                            &mut retired,
                        );
                        shard.leases |= units > 0;
                        granted
                    }
                    _ => 0,
                }
            }
            (Some(entry), None) => {
                entry.taking = 0;
                0
            }
            (None, Some(leased)) => {
                // Forgotten meanwhile: give the units straight back.
                if let (Some(d), Some(&granted)) =
                    (leased.decisions.as_slice().first(), leased.granted.first())
                    && d.allowed()
                {
                    retired.push(Pending {
                        key: take.key.clone(),
                        name: take.name.clone(),
                        held: Lease::new(&take.limit, d, granted + 1, granted, sent, &self.timing),
                    });
                }
                0
            }
            (None, None) => 0,
        };
        drop(shard);
        if granted > 0 {
            count_take(&take.name, granted);
        }
        if !retired.is_empty() {
            self.pending.lock().extend(retired);
        }
    }

    /// Installs what one target's take got into its entry (a new lease,
    /// or a wait at the limit); the units now leased.
    fn install(&self, entry: &mut Watched, take: Take<'_>, retired: &mut Retired) -> u64 {
        let units = take.granted + take.own;
        if take.allowed {
            if units > 0 {
                let held = Lease::new(
                    take.limit,
                    take.decision,
                    units,
                    take.granted,
                    take.sent,
                    &self.timing,
                );
                let serving = entry.lease.is_some_and(|h| h.usable(take.sent) > 0);
                let replaced = if serving {
                    entry.next.replace(held)
                } else {
                    entry.lease.replace(held)
                };
                if let Some(old) = replaced {
                    entry.retire(old, take.sent, retired);
                }
            }
            entry.at_limit = take.granted < take.extra;
            if entry.at_limit {
                // The limit is nearly spent: wait for the missing units to
                // come back at its rate (bounded).
                let wait = self.refill_time(take.limit, take.extra - take.granted);
                wait_at_limit(entry, take.sent, wait, take.decision);
            }
            units
        } else {
            if !take.decision.allowed() && take.extra > 0 {
                let retry =
                    u64::try_from(take.decision.retry_after().as_nanos()).unwrap_or(u64::MAX);
                let wait = retry
                    .max(self.refill_time(take.limit, take.extra))
                    .min(self.timing.ttl);
                entry.at_limit = true;
                wait_at_limit(entry, take.sent, wait, take.decision);
            }
            0
        }
    }

    /// A take's answer on the way up: the leases granted, or a wait.
    pub(super) fn taken(&self, call: &Call<'_>, ask: Ask, answer: &Answer) {
        let targets = call.targets;
        let found: SmallVec<[Found; 2]> = targets.iter().map(|t| self.locate(t)).collect();
        let mut guards = self.lock(&found);
        let mut retired = Retired::new();
        let mut takes: SmallVec<[(usize, u64); 2]> = SmallVec::new();
        for (i, (target, at)) in targets.iter().zip(&found).enumerate() {
            let extra = ask.extra.get(i).copied().unwrap_or(0);
            let granted = ask.granted.get(i).copied().unwrap_or(0);
            let Some(entry) = guards.shard(at.shard).get(at.hash, target) else {
                continue;
            };
            if extra > 0 {
                entry.taking = 0;
            }
            let Answer::Decided {
                decisions,
                source: Source::Backend,
            } = answer
            else {
                continue;
            };
            let Some(decision) = decisions.as_slice().get(i) else {
                continue;
            };
            let take = Take {
                limit: target.limit,
                decision,
                allowed: decisions.allowed(),
                extra,
                granted,
                own: 0,
                sent: ask.sent,
            };
            if self.install(entry, take, &mut retired) > 0 {
                guards.shard(at.shard).leases = true;
                takes.push((i, granted));
            }
        }
        drop(guards);
        for (i, granted) in takes {
            count_take(targets[i].name, granted);
        }
        if !retired.is_empty() {
            self.pending.lock().extend(retired);
        }
    }

    /// How long `units` take to come back at `limit`'s rate, at most the
    /// longest wait.
    pub(super) fn refill_time(&self, limit: &Limit, units: u64) -> u64 {
        units
            .saturating_mul(limit.emission_interval_micros())
            .saturating_mul(1_000)
            .min(self.timing.backoff)
    }
}

/// Refuses `entry`'s calls without units until `sent + wait`, with
/// `decision`'s figures.
fn wait_at_limit(entry: &mut Watched, sent: u64, wait: u64, decision: &Decision) {
    entry.wait_until = sent.saturating_add(wait);
    entry.wait_since = sent;
    entry.wait_decision = *decision;
}

/// Counts a lease taken for `name`.
fn count_take(name: &str, granted: u64) {
    let name = name.to_owned();
    metrics::counter!("ratewall_lease_takes_total", "limit" => name.clone()).increment(1);
    metrics::counter!("ratewall_lease_units_total", "limit" => name, "event" => "taken")
        .increment(granted);
}
