//! Quota leasing on Redis: taking and giving back leases
//! ([`ratewall::backend::Backend::acquire_lease`], [`ratewall::backend::Backend::return_lease`])
//! with `lua/lease.lua`, and reading the lease records operators see.
//!
//! Each take that grants units also records the lease in a sorted set next
//! to the state, `<state key>:leases` (same hash tag): member
//! `<at>:<granted>`, score the last time its units can be used (µs: the
//! window's or slot's end, the last unit's theoretical arrival time, and
//! never later than the lease TTL the limiter uses). A return removes it;
//! a take drops the records that have ended; the key expires with the last
//! one. What Redis cannot know is how many of a lease's units its process
//! has used: a record says what was reserved, and until when at most.

use std::time::Duration;

use ratewall::{
    Key, Limit,
    backend::{Decisions, LeaseReturn, Leased, Request},
    error::BackendError,
};

use crate::backend::{RedisBackend, micros};
use crate::script::{LEASES_SUFFIX, Op, Plan, parse_reply};

/// One lease as Redis records it ([`RedisBackend::leases`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRecord {
    /// When it was taken: the decision's time in µs since the Unix epoch.
    pub taken_at_micros: u64,
    /// Units reserved beyond the call's own cost (some may have been used
    /// since: only the process holding the lease knows).
    pub units: u64,
    /// The last time its units can be used, µs since the Unix epoch.
    pub until_micros: u64,
}

impl RedisBackend {
    /// Takes the costs of `requests` all-or-nothing and leases up to
    /// `extra[i]` more units of each (see `lua/lease.lua`).
    pub(crate) async fn lease_batch(
        &self,
        requests: &[Request<'_>],
        extra: &[u64],
        ttl: Duration,
    ) -> Result<Leased, BackendError> {
        if extra.len() != requests.len() {
            return Err(BackendError::protocol(format_args!(
                "a lease call needs one extra count per request: {} for {} request(s)",
                extra.len(),
                requests.len()
            )));
        }
        Request::check_lease(requests).map_err(BackendError::Invalid)?;
        if requests.is_empty() {
            return Ok(Leased::new(Decisions::new([]), Vec::new()));
        }
        if self.groups(requests).is_some() {
            // Several hash tags on a cluster: one call per tag, no lease.
            let decisions = ratewall::backend::Backend::acquire(self, requests).await?;
            return Ok(Leased::new(decisions, vec![0; requests.len()]));
        }
        let numbers: Vec<[u64; 3]> = extra.iter().map(|&n| [n, 0, 0]).collect();
        let ttl_us = micros(ttl);
        let plan = Plan::lease(
            Op::Lease,
            self.time(),
            self.extra_ttl_ms(),
            requests,
            &numbers,
            ttl_us,
        );
        let values = self.send(self.deadline(), &plan).await?;
        let reply = parse_reply(Op::Lease, requests.len(), &values)?;
        if reply.granted.len() != requests.len() {
            return Err(BackendError::protocol(
                "the lease call answered no granted units",
            ));
        }
        Ok(Leased::new(Decisions::new(reply.decisions), reply.granted))
    }

    /// Gives back each lease's unused units, one call per lease (each on
    /// its own key and hash tag).
    pub(crate) async fn release_batch(
        &self,
        returns: &[LeaseReturn<'_>],
    ) -> Result<(), BackendError> {
        for back in returns {
            let requests = [back.request];
            let numbers = [[back.at_micros, back.stamp, back.granted]];
            let plan = Plan::lease(
                Op::Release,
                self.time(),
                self.extra_ttl_ms(),
                &requests,
                &numbers,
                0,
            );
            let values = self.send(self.deadline(), &plan).await?;
            parse_reply(Op::Release, 1, &values)?;
        }
        Ok(())
    }

    /// The leases Redis records for `key` under `limit` that may still be
    /// in use (taken by any process; see the module docs), oldest first.
    ///
    /// ```no_run
    /// # async fn demo(backend: ratewall_redis::RedisBackend) -> Result<(), Box<dyn std::error::Error>> {
    /// use ratewall::{Key, Limit};
    /// let limit = Limit::per_minute(1_000_000)?.with_lease(10_000)?;
    /// for lease in backend.leases(&Key::new("app", "api", "tenant-1"), &limit).await? {
    ///     println!("{} units until {} µs", lease.units, lease.until_micros);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`BackendError::Timeout`] when Redis does not answer within the call
    /// timeout; [`BackendError::Unavailable`] or [`BackendError::Protocol`] when
    /// it cannot be reached or answers with an error.
    pub async fn leases(&self, key: &Key, limit: &Limit) -> Result<Vec<LeaseRecord>, BackendError> {
        let mut records_key = format!("{key}:");
        limit.write_storage_suffix(&mut records_key);
        records_key.push_str(LEASES_SUFFIX);
        let mut range = redis::cmd("ZRANGE");
        range.arg(&records_key).arg(0).arg(-1).arg("WITHSCORES");
        let now: u64 = match self.time() {
            crate::script::Time::Client(now) => now,
            crate::script::Time::Server => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg("local t = redis.call('TIME') return t[1] * 1000000 + t[2]")
                    .arg(1)
                    .arg(&records_key);
                self.registry_query("reading the server time", crate::registry::Query::Cmd(cmd))
                    .await?
            }
        };
        let entries: Vec<(String, f64)> = self
            .registry_query("reading lease records", crate::registry::Query::Cmd(range))
            .await?;
        Ok(entries
            .into_iter()
            .filter_map(|(member, until)| {
                let (at, units) = member.split_once(':')?;
                Some(LeaseRecord {
                    taken_at_micros: at.parse().ok()?,
                    units: units.parse().ok()?,
                    until_micros: until as u64,
                })
            })
            .filter(|record| record.until_micros >= now)
            .collect())
    }
}
