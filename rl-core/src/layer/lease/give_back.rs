//! Giving leased units back: refunds and resets through a lease, the
//! collection of leases that ended, and shutting down.

use super::*;

impl Leases {
    /// A refund on the way down: back into the leases it was taken from
    /// when every target's lease is still the one (and still usable).
    pub(super) fn refund(&self, call: &Call<'_>, at: u64) -> Option<Answer> {
        if !self.leasing(call) {
            return None;
        }
        let now = self.now();
        let found: SmallVec<[Found; 2]> = call.targets.iter().map(|t| self.locate(t)).collect();
        let mut guards = self.lock(&found);
        let all = call.targets.iter().zip(&found).all(|(target, f)| {
            guards.shard(f.shard).get(f.hash, target).is_some_and(|e| {
                e.lease
                    .as_ref()
                    .is_some_and(|h| h.at == at && h.usable(now) > 0)
            })
        });
        if !all {
            return None;
        }
        for (target, f) in call.targets.iter().zip(&found) {
            if let Some(held) = guards
                .shard(f.shard)
                .get(f.hash, target)
                .and_then(|e| e.lease.as_mut())
            {
                held.units = held.units.saturating_add(target.cost);
            }
        }
        Some(Answer::Applied {
            source: Source::Lease,
        })
    }

    /// A reset on the way down: the store forgets the state, so the leases
    /// taken from it are dropped (not given back).
    pub(super) fn reset(&self, call: &Call<'_>) {
        for target in call.targets {
            let f = self.locate(target);
            let mut shard = self.shards.at(f.shard).lock();
            if let Some(entry) = shard
                .table
                .find_mut(f.hash, |e| e.is(&target.key, target.limit))
            {
                entry.wait_until = 0;
                entry.at_limit = false;
                entry.lease = None;
                entry.next = None;
            }
        }
    }

    /// Moves the leases that are due back (TTL over, identity idle, `all`,
    /// or of `name`) to the pending returns; refreshes the gauge.
    pub(super) fn collect(&self, now: u64, all: bool, name: Option<&str>) {
        let mut due = Retired::new();
        let mut outstanding: Vec<(Box<str>, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            if !shard.leases && name.is_none() {
                continue;
            }
            let mut holding = false;
            for entry in shard.table.iter_mut() {
                let named = name.is_some_and(|n| *n == *entry.name);
                if named {
                    entry.wait_until = 0;
                    entry.at_limit = false;
                }
                let idle = now.saturating_sub(entry.last_call) >= self.timing.idle;
                for slot in [&mut entry.lease, &mut entry.next] {
                    let Some(held) = *slot else {
                        continue;
                    };
                    let valid = held.valid(now);
                    if all || named || idle || now >= held.ends || valid == 0 {
                        *slot = None;
                        if valid > 0 {
                            due.push(Pending {
                                key: entry.key.clone(),
                                name: entry.name.clone(),
                                held: Lease {
                                    units: valid,
                                    ..held
                                },
                            });
                        }
                    }
                }
                if entry.lease.is_some() || entry.next.is_some() {
                    holding = true;
                    let units = entry.outstanding(now);
                    match outstanding.iter_mut().find(|(n, _)| *n == entry.name) {
                        Some((_, total)) => *total += units,
                        None => outstanding.push((entry.name.clone(), units)),
                    }
                }
            }
            shard.leases = holding;
        }
        if !due.is_empty() {
            self.pending.lock().extend(due);
        }
        let mut gauged = self.gauged.lock();
        for (name, units) in &outstanding {
            metrics::gauge!("ratewall_leased_units", "limit" => name.to_string())
                .set(*units as f64);
            if !gauged.contains(name) {
                gauged.push(name.clone());
            }
        }
        for name in gauged.iter() {
            if !outstanding.iter().any(|(n, _)| n == name) {
                metrics::gauge!("ratewall_leased_units", "limit" => name.to_string()).set(0.0);
            }
        }
    }

    /// Gives back every pending lease (each one call on its own key).
    pub(super) async fn flush(&self) {
        let pending = std::mem::take(&mut *self.pending.lock());
        for Pending { key, name, held } in pending {
            let request = Request::new(&key, &held.limit, held.units);
            let back = [LeaseReturn {
                request,
                at_micros: held.at,
                stamp: held.stamp,
                granted: held.granted,
            }];
            let result = match self.backend.return_lease(&back).await {
                Ok(()) => "returned",
                Err(error) => {
                    tracing::warn!(limit = &*name, %error, units = held.units, "could not give back leased units; they count as used");
                    "failed"
                }
            };
            let name = name.to_string();
            metrics::counter!("ratewall_lease_returns_total", "limit" => name.clone(), "result" => result)
                .increment(1);
            if result == "returned" {
                metrics::counter!("ratewall_lease_units_total", "limit" => name, "event" => "returned")
                    .increment(held.units);
            }
        }
    }

    /// Gives back every lease and stops leasing (see
    /// [`crate::Limiter::shutdown`]).
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.collect(self.now(), true, None);
        self.flush().await;
    }

    /// Units held in leases now (usable ones), across identities.
    pub(crate) fn outstanding(&self) -> u64 {
        let now = self.now();
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .table
                    .iter()
                    .map(|e| e.outstanding(now))
                    .sum::<u64>()
            })
            .sum()
    }
}
