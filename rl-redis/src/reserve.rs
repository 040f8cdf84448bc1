//! Waiting calls on Redis: [`RedisBackend`]'s [`ratewall::backend::Backend::reserve`]
//! and [`ratewall::backend::Backend::cancel`], each one call of the batch entry point
//! (`lua/batch.lua`, ops `reserve` and `cancel`).
//!
//! On Redis Cluster a call whose limits span several hash tags cannot be
//! one call. Its groups (one per hash tag) then agree on one slot in turn:
//! each is reserved no earlier than the latest slot any group got so far
//! (the call's `not before`); a group that got an earlier slot than a later
//! one is given back and reserved again at the later one. Every group ends
//! up committed as of the same slot, or the call is refused and every
//! group given back. Each group is decided at the `TIME` of its master.

use std::time::Duration;

use ratewall::{
    Decision,
    backend::{Decisions, Request, Reservation},
    error::BackendError,
};

use crate::backend::{Group, RedisBackend, micros};
use crate::script::{Op, Plan, Time, parse_reservation};

/// Rounds of the cluster agreement before a call gives up (each round
/// reserves every group that is not at the latest slot yet).
const ROUNDS: usize = 4;

/// A reservation's cancel fields, per request: whether it took a
/// given-back slot, and the mark its decision left (`slot + reset_after`).
fn cancel_fields(reservation: &Reservation, slot: u64) -> Vec<(u64, u64)> {
    reservation
        .decisions()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let reset = micros(d.reset_after());
            (
                u64::from(reservation.took_freed_slot(i)),
                slot.saturating_add(reset),
            )
        })
        .collect()
}

impl RedisBackend {
    pub(crate) async fn reserve_batch(
        &self,
        requests: &[Request<'_>],
        max_wait: Duration,
    ) -> Result<Reservation, BackendError> {
        Request::check_reservation(requests).map_err(BackendError::Invalid)?;
        if requests.is_empty() {
            return Ok(Reservation::new(Decisions::new([]), 0, []));
        }
        let max_wait = micros(max_wait);
        match self.groups(requests) {
            None => {
                self.reserve_one(self.deadline(), self.time(), max_wait, 0, requests)
                    .await
            }
            Some(groups) => self.reserve_groups(requests.len(), &groups, max_wait).await,
        }
    }

    /// One reserve call over requests sharing a hash tag, no earlier than
    /// `not_before` (µs, 0 for none).
    async fn reserve_one(
        &self,
        deadline: tokio::time::Instant,
        time: Time,
        max_wait: u64,
        not_before: u64,
        requests: &[Request<'_>],
    ) -> Result<Reservation, BackendError> {
        let fields = vec![(not_before, 0); requests.len()];
        let plan = Plan::reservation(
            Op::Reserve,
            time,
            max_wait,
            self.parts().1.extra_ttl_ms,
            requests,
            &fields,
        );
        let values = self.send(deadline, &plan).await?;
        parse_reservation(requests.len(), &values)
    }

    /// One cancel call over requests sharing a hash tag.
    async fn cancel_one(
        &self,
        requests: &[Request<'_>],
        reservation: &Reservation,
    ) -> Result<(), BackendError> {
        let Some(slot) = reservation.slot_micros() else {
            return Ok(());
        };
        let fields = cancel_fields(reservation, slot);
        let plan = Plan::reservation(
            Op::Cancel,
            self.time(),
            slot,
            self.parts().1.extra_ttl_ms,
            requests,
            &fields,
        );
        self.send(self.deadline(), &plan).await.map(drop)
    }

    pub(crate) async fn cancel_batch(
        &self,
        requests: &[Request<'_>],
        reservation: &Reservation,
    ) -> Result<(), BackendError> {
        if reservation.slot_micros().is_none() || requests.is_empty() {
            return Ok(());
        }
        let Some(groups) = self.groups(requests) else {
            return self.cancel_one(requests, reservation).await;
        };
        for group in &groups {
            let part = part_of(reservation, group);
            self.cancel_one(&group.requests, &part).await?;
        }
        Ok(())
    }

    /// The cluster agreement over several hash tags (see the module docs).
    async fn reserve_groups(
        &self,
        count: usize,
        groups: &[Group<'_>],
        max_wait: u64,
    ) -> Result<Reservation, BackendError> {
        let deadline = self.deadline();
        let time = self.time();
        let mut slot = 0;
        let mut taken: Vec<Option<Reservation>> = vec![None; groups.len()];
        for _ in 0..ROUNDS {
            for (index, group) in groups.iter().enumerate() {
                if let Some(held) = &taken[index] {
                    if held.slot_micros() == Some(slot) {
                        continue;
                    }
                    // Reserved earlier than a later group could: give it
                    // back and reserve it again at the later slot.
                    if let Err(error) = self.cancel_one(&group.requests, held).await {
                        self.give_back_slots(groups, &mut taken).await;
                        return Err(error);
                    }
                    taken[index] = None;
                }
                let reply = match self
                    .reserve_one(deadline, time, max_wait, slot, &group.requests)
                    .await
                {
                    Ok(reply) => reply,
                    Err(error) => {
                        self.give_back_slots(groups, &mut taken).await;
                        return Err(error);
                    }
                };
                let Some(got) = reply.slot_micros() else {
                    self.give_back_slots(groups, &mut taken).await;
                    return Ok(refused(count, groups, index, &reply));
                };
                slot = slot.max(got);
                taken[index] = Some(reply);
            }
            if taken
                .iter()
                .all(|t| t.as_ref().and_then(Reservation::slot_micros) == Some(slot))
            {
                return Ok(gathered(count, groups, &taken));
            }
        }
        self.give_back_slots(groups, &mut taken).await;
        Err(BackendError::unavailable(format_args!(
            "the hash tags of a waiting call did not agree on a slot in {ROUNDS} rounds (heavy contention)"
        )))
    }

    /// Gives back every group's reservation (best effort: a failure is
    /// logged; the slot then stays taken, which admits less, not more).
    async fn give_back_slots(&self, groups: &[Group<'_>], taken: &mut [Option<Reservation>]) {
        for (group, held) in groups.iter().zip(taken.iter_mut()) {
            if let Some(held) = held.take()
                && let Err(error) = self.cancel_one(&group.requests, &held).await
            {
                tracing::warn!(%error, "could not give back a slot reserved on a Redis Cluster hash tag");
            }
        }
    }
}

/// The part of a call's reservation that concerns one group.
fn part_of(reservation: &Reservation, group: &Group<'_>) -> Reservation {
    let decisions = reservation.decisions().as_slice();
    Reservation::new(
        Decisions::new(
            group
                .positions
                .iter()
                .filter_map(|&p| decisions.get(p).copied()),
        ),
        reservation.now_micros(),
        group
            .positions
            .iter()
            .map(|&p| reservation.took_freed_slot(p)),
    )
}

/// The call's reservation from every group's (all at one slot).
fn gathered(count: usize, groups: &[Group<'_>], taken: &[Option<Reservation>]) -> Reservation {
    let mut decisions: Vec<Option<Decision>> = vec![None; count];
    let mut freed = vec![false; count];
    let mut now = u64::MAX;
    for (group, held) in groups.iter().zip(taken) {
        let Some(held) = held else { continue };
        now = now.min(held.now_micros());
        for (i, &position) in group.positions.iter().enumerate() {
            decisions[position] = held.decisions().as_slice().get(i).copied();
            freed[position] = held.took_freed_slot(i);
        }
    }
    Reservation::new(Decisions::new(decisions.into_iter().flatten()), now, freed)
}

/// The refusal of a call whose group `index` refused: that group's
/// decisions, and the others' as allowed at the refusal's time (nothing
/// is kept: every other group was given back).
fn refused(count: usize, groups: &[Group<'_>], index: usize, reply: &Reservation) -> Reservation {
    let now = reply.now_micros();
    let mut decisions: Vec<Decision> = vec![
        Decision::new(ratewall::backend::Figures {
            allowed: true,
            at_micros: now,
            ..ratewall::backend::Figures::default()
        });
        count
    ];
    for (i, &position) in groups[index].positions.iter().enumerate() {
        if let Some(d) = reply.decisions().as_slice().get(i) {
            decisions[position] = *d;
        }
    }
    Reservation::new(Decisions::new(decisions), now, vec![false; count])
}
