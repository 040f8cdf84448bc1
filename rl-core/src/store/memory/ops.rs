//! The memory store's work on one shard: decide, refund, release, reset
//! and take back each target's state in its algorithm's table.

use super::*;

/// Runs `decide` in `target`'s shard of `memory`, locked, at the shard's
/// time: the one-target hot path.
#[inline(always)]
pub(super) fn in_shard<R>(
    memory: &MemoryBackend,
    target: &Target<'_>,
    decide: impl FnOnce(&mut Shard, &Located, u64) -> R,
) -> R {
    let at = memory.locate(target);
    let clock = memory.clock.now_micros();
    let mut shard = memory.shards.at(at.shard).lock();
    let now = shard.now(clock);
    decide(&mut shard, &at, now)
}

/// Decides every target against its state, in order.
pub(super) fn decide_all(
    guards: &mut Locked<'_, Shard>,
    targets: &[Target<'_>],
    located: &[Located],
    now: u64,
    commit: bool,
) -> Decisions {
    Decisions::new(
        targets
            .iter()
            .zip(located)
            .map(|(target, at)| decide_in(guards.shard(at.shard), at, target, now, commit, now)),
    )
}

/// Runs `$body` with `$state` the memory store's state type of
/// `$algorithm`: the store's one table of algorithms. Exhaustive: a new
/// algorithm does not compile until it has a row here.
macro_rules! with_state {
    ($algorithm:expr, $state:ident => $body:expr) => {
        match $algorithm {
            Algorithm::FixedWindow => {
                type $state = Window;
                $body
            }
            Algorithm::SlidingLog => {
                type $state = Log;
                $body
            }
            Algorithm::SlidingWindow => {
                type $state = Slots;
                $body
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                type $state = Meter;
                $body
            }
            Algorithm::Gcra => {
                type $state = Tat;
                $body
            }
            Algorithm::InFlight => {
                type $state = Flight;
                $body
            }
        }
    };
}

/// Decides one target in its (locked) shard at `now` (a reservation's slot
/// may be later than the shard's time, `clock`, which a new identity's
/// insertion sweeps by).
pub(super) fn decide_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    if target.limit.block_micros() != 0 {
        return decide_blocking(shard, at, target, now, commit, clock);
    }
    decide_state(shard, at, target, now, commit, clock)
}

/// [`decide_in`] on the target's state alone.
#[inline(always)]
fn decide_state(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    with_state!(target.limit.algorithm(), S => decide::<S>(shard, at, target, now, commit, clock))
}

/// [`decide_in`] for a limit that blocks ([`Limit::with_block`]): an
/// identity blocked after `now` is refused until the block's end (its state
/// decided without a commit, for the later of its own retry and reset);
/// otherwise its state decides, and a refusal blocks the identity from
/// `now` when `commit` (the decision of a peek, or of an all-or-nothing
/// call's first pass, is the same, written by [`block::refused`]).
#[cold]
fn decide_blocking(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    let identity = target.key.identity;
    if let Some(end) = block::live(shard, at, identity, now) {
        return decide_state(shard, at, target, now, false, clock).blocked(end - now);
    }
    let decision = decide_state(shard, at, target, now, commit, clock);
    if decision.allowed() {
        return decision;
    }
    let block = target.limit.block_micros();
    if commit {
        block::write(shard, at, identity, now.saturating_add(block), clock);
    }
    decision.blocked(block)
}

/// Decides every target as of `at` (later than the shard's time `now`)
/// on a copy of its state: what the state will hold then with no call in
/// between. The states are left as they are (a decision at a later time
/// may drop entries that still count now).
pub(super) fn project_all(
    guards: &mut Locked<'_, Shard>,
    targets: &[Target<'_>],
    located: &[Located],
    now: u64,
    at: u64,
) -> Decisions {
    Decisions::new(targets.iter().zip(located).map(|(target, l)| {
        let shard = guards.shard(l.shard);
        let decision = with_state!(target.limit.algorithm(), S => {
            on_state::<S, _>(shard, l, target, (now, false, now), Project { target, at })
        });
        // A limit that blocks: as a peek at `at` (see `decide_blocking`).
        match target.limit.block_micros() {
            0 => decision,
            _ => match block::live(shard, l, target.key.identity, at) {
                Some(end) => decision.blocked(end - at),
                None if decision.allowed() => decision,
                None => decision.blocked(target.limit.block_micros()),
            },
        }
    }))
}

/// Takes back a reservation if it is still the last one of its queue.
pub(super) fn unreserve_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    slot: u64,
    mark: u64,
) -> bool {
    if !target.limit.algorithm().reserves() {
        return false;
    }
    with_state!(target.limit.algorithm(), S => unreserve::<S>(shard, at, target, now, slot, mark))
}

fn unreserve<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    slot: u64,
    mark: u64,
) -> bool {
    change::<S>(shard, at, target, now, |state| {
        state.unreserve(target.limit, now, slot, mark, target.cost)
    })
}

/// The slots given back under a target's state that are still ahead (drops
/// the ones already past).
pub(super) fn freed_of(shard: &mut Shard, at: &Located, target: &Target<'_>, now: u64) -> Freed {
    if shard.freed.is_empty() {
        return Freed::default();
    }
    let key = (at.partition, Owned::of(target.key.identity));
    let Some(freed) = shard.freed.get_mut(&key) else {
        return Freed::default();
    };
    freed.drop_before(now);
    let kept = freed.clone();
    if freed.is_empty() {
        shard.freed.remove(&key);
    }
    kept
}

/// Takes a target's cost from the slot given back at `slot`.
pub(super) fn take_freed(shard: &mut Shard, at: &Located, target: &Target<'_>, slot: u64) {
    let key = (at.partition, Owned::of(target.key.identity));
    if let Some(freed) = shard.freed.get_mut(&key) {
        freed.take(slot, target.cost);
        if freed.is_empty() {
            shard.freed.remove(&key);
        }
    }
}

/// Records a target's cost as given back at `slot`.
pub(super) fn give_back(shard: &mut Shard, at: &Located, target: &Target<'_>, slot: u64, now: u64) {
    if shard.freed.len() >= shard.sweep_at {
        sweep_freed(&mut shard.freed, now);
    }
    shard
        .freed
        .entry((at.partition, Owned::of(target.key.identity)))
        .or_default()
        .give(slot, target.cost);
}

/// Drops every given-back slot already past.
pub(super) fn sweep_freed(freed: &mut HashMap<(u32, Owned), Freed>, now: u64) {
    freed.retain(|_, slots| {
        slots.drop_before(now);
        !slots.is_empty()
    });
}

pub(super) fn refund_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    at_micros: u64,
) {
    with_state!(target.limit.algorithm(), S => refund::<S>(shard, at, target, now, at_micros))
}

/// Takes a target's cost as debt ([`State::charge`]), creating its state
/// when there is none.
pub(super) fn charge_in(shard: &mut Shard, at: &Located, target: &Target<'_>, now: u64) {
    with_state!(target.limit.algorithm(), S => raise::<S>(shard, at, target, now, |state| {
        state.charge(target.limit, now, target.cost);
    }))
}

/// Raises a target's state so that at most `left` units remain `after` µs
/// from now ([`State::hold`]), creating it when there is none.
pub(super) fn hold_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    after: u64,
    left: u64,
) {
    with_state!(target.limit.algorithm(), S => raise::<S>(shard, at, target, now, |state| {
        state.hold(target.limit, now, after, left);
    }))
}

/// Applies `apply`, which may only add to a state, to the state `target`
/// names, or to a fresh one kept unless it stayed idle.
fn raise<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S),
) {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            raise_held::<S, u64>(shard, at, target, now, apply)
        }
        IdentityRef::Text(_) => raise_held::<S, CompactString>(shard, at, target, now, apply),
    }
}

fn raise_held<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S),
) {
    let identity = target.key.identity;
    if let (Some(found), packing) = find_held::<S, I>(shard, at, identity, now) {
        found.with(packing, apply);
        return;
    }
    let mut state = S::default();
    apply(&mut state);
    if !state.is_idle(now) {
        insert::<S, I>(shard, at, identity, state, now);
    }
}

pub(super) fn release_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    at_micros: u64,
    stamp: u64,
) {
    let release = Release { at_micros, stamp };
    // Only leased units are released; an algorithm that cannot lease has
    // none.
    if !target.limit.algorithm().leases() {
        return;
    }
    with_state!(target.limit.algorithm(), S => release_state::<S>(shard, at, target, now, release))
}

/// The lease a release gives units back to.
#[derive(Clone, Copy)]
struct Release {
    at_micros: u64,
    stamp: u64,
}

fn release_state<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    release: Release,
) {
    change::<S>(shard, at, target, now, |state| {
        state.release(
            target.limit,
            now,
            target.cost,
            release.at_micros,
            release.stamp,
        );
        true
    });
}

/// Forgets a target's state, and lifts its identity's block.
pub(super) fn reset_in(shard: &mut Shard, at: &Located, target: &Target<'_>) {
    block::lift(shard, at, target.key.identity);
    with_state!(target.limit.algorithm(), S => reset::<S>(shard, at, target))
}

fn decide<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    commit: bool,
    clock: u64,
) -> Decision {
    let decide = Decide {
        target,
        now,
        commit,
    };
    on_state::<S, _>(shard, at, target, (now, commit, clock), decide)
}

/// What a decision does with the state it found or made: run once, and
/// inlined there (a closure can only be hinted to inline; the memory
/// store's GCRA decision was left out of line on the full road).
trait OnState<S> {
    type Out;
    fn run(self, state: &mut S) -> Self::Out;
}

/// [`State::decide`] of a target at `now`.
struct Decide<'a> {
    target: &'a Target<'a>,
    now: u64,
    commit: bool,
}

impl<S: State> OnState<S> for Decide<'_> {
    type Out = Decision;
    #[inline(always)]
    fn run(self, state: &mut S) -> Decision {
        let target = self.target;
        state.decide(target.limit, self.now, target.cost, self.commit)
    }
}

/// [`State::decide`] of a target at `at`, on a copy of its state.
struct Project<'a> {
    target: &'a Target<'a>,
    at: u64,
}

impl<S: State + Clone> OnState<S> for Project<'_> {
    type Out = Decision;
    fn run(self, state: &mut S) -> Decision {
        let target = self.target;
        state
            .clone()
            .decide(target.limit, self.at, target.cost, false)
    }
}

/// [`State::admit`] of a target at `now`.
struct Admit<'a> {
    target: &'a Target<'a>,
    now: u64,
}

impl<S: State> OnState<S> for Admit<'_> {
    type Out = Result<(), Decision>;
    #[inline(always)]
    fn run(self, state: &mut S) -> Result<(), Decision> {
        state.admit(self.target.limit, self.now, self.target.cost)
    }
}

/// [`decide_in`] with `commit`, for a caller that uses no figure of an
/// admission ([`State::admit`]): `Err` holds the refusal.
pub(super) fn admit_in(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
) -> Result<(), Decision> {
    if target.limit.block_micros() != 0 {
        let decision = decide_blocking(shard, at, target, now, true, now);
        return if decision.allowed() {
            Ok(())
        } else {
            Err(decision)
        };
    }
    with_state!(target.limit.algorithm(), S => {
        on_state::<S, _>(shard, at, target, (now, true, now), Admit { target, now })
    })
}

/// Runs `decide` on the state of `target` (a fresh one when it has none);
/// a fresh state it left busy is kept when `commit`. `times` is the
/// decision's time, `commit`, and the shard's time (a reservation's slot
/// may be later than the shard's time, which an insertion sweeps by).
#[inline]
fn on_state<S: Tabled, R>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    times: (u64, bool, u64),
    decide: impl OnState<S, Out = R>,
) -> R {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            decide_held::<S, u64, R>(shard, at, target, times, decide)
        }
        IdentityRef::Text(_) => {
            decide_held::<S, CompactString, R>(shard, at, target, times, decide)
        }
    }
}

#[inline]
fn decide_held<S: Tabled, I: Side, R>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    (now, commit, clock): (u64, bool, u64),
    decide: impl OnState<S, Out = R>,
) -> R {
    let identity = target.key.identity;
    if let (Some(found), packing) = find_held::<S, I>(shard, at, identity, clock) {
        return found.with(packing, |state| decide.run(state));
    }
    let mut state = S::default();
    let decided = decide.run(&mut state);
    if commit && !state.is_idle(now) {
        insert::<S, I>(shard, at, identity, state, clock);
    }
    decided
}

/// A state found in its shard's table ([`find_held`]).
enum Found<'a, S: Tabled, I: Side> {
    Wide(&'a mut Entry<S, I>),
    Row(&'a mut S::Row<I>, <S::Row<I> as Row<S>>::Key),
}

impl<S: Tabled, I: Side> Found<'_, S, I> {
    /// Runs `f` on the state, keeping what it changed.
    #[inline(always)]
    fn with<T>(self, packing: &mut Packing, f: impl FnOnce(&mut S) -> T) -> T {
        match self {
            Found::Wide(entry) => f(&mut entry.state),
            Found::Row(row, key) => row.with(packing, key, f),
        }
    }
}

/// The state of `identity` under `at`'s partition in its shard's table
/// (see [`Tabled::pick`]), if it holds one, and what the shard's packed
/// rows share. `now` is the shard's time.
#[inline(always)]
fn find_held<'a, S: Tabled, I: Side>(
    shard: &'a mut Shard,
    at: &Located,
    identity: IdentityRef<'_>,
    now: u64,
) -> (Option<Found<'a, S, I>>, &'a mut Packing) {
    let packing = &mut shard.packing;
    let hasher = &shard.hasher;
    let found = match S::pick(I::tables(&mut shard.tables)) {
        Pick::Wide(table) => table
            .find_mut(at.hash, |entry| entry.is(packing, at.partition, identity))
            .map(Found::Wide),
        Pick::Rows(table) => {
            S::Row::<I>::ready(table, packing, hasher, now);
            let key = S::Row::<I>::key(packing, at.partition);
            table
                .find_mut(at.hash, |row| row.is(packing, key, identity))
                .map(|row| Found::Row(row, key))
        }
    };
    (found, packing)
}

/// Removes the state of `identity` under `at`'s partition from its
/// shard's table, if it holds one.
fn remove_held<S: Tabled, I: Side>(shard: &mut Shard, at: &Located, identity: IdentityRef<'_>) {
    let packing = &mut shard.packing;
    match S::pick(I::tables(&mut shard.tables)) {
        Pick::Wide(table) => remove_row(table, packing, at, identity),
        Pick::Rows(table) => remove_row(table, packing, at, identity),
    }
}

/// [`remove_held`] in one table.
fn remove_row<S, T: RowTable<Row: Row<S>>>(
    table: &mut T,
    packing: &mut Packing,
    at: &Located,
    identity: IdentityRef<'_>,
) {
    let key = T::Row::key(packing, at.partition);
    if let Some(row) = table.remove(at.hash, |row| row.is(packing, key, identity)) {
        row.forget(packing);
    }
}

/// Adds a new identity's state, sweeping idle ones first when the shard
/// has doubled since its last sweep. A GCRA state of a number goes into the
/// shard's wide entries while it holds fewer than [`Packing::pack_at`] of
/// them; past that, they are all packed (see [`Packing`]).
fn insert<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    identity: IdentityRef<'_>,
    state: S,
    now: u64,
) {
    if shard.tables.len() >= shard.sweep_at {
        shard.tables.sweep(now, &shard.hasher, &mut shard.packing);
        sweep_freed(&mut shard.freed, now);
        shard.sweep_at = (shard.tables.len() * 2).max(MIN_SWEEP);
    }
    let packing = &mut shard.packing;
    let hasher = &shard.hasher;
    let tables = I::tables(&mut shard.tables);
    // The tables rehash their rows when they grow (see `Row::hash`).
    let state = match S::pick(tables) {
        Pick::Wide(wide) if wide.len() < packing.pack_at() => {
            let entry = Row::new(packing, at.partition, identity, state);
            wide.insert_unique(at.hash, entry, |e| e.hash(packing, hasher));
            return;
        }
        Pick::Wide(_) => {
            S::pack_all(tables, packing, hasher);
            state
        }
        Pick::Rows(_) => state,
    };
    let row = S::Row::<I>::new(packing, at.partition, identity, state);
    S::table(tables).insert_unique(at.hash, row, |row| row.hash(packing, hasher));
}

fn refund<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    at_micros: u64,
) {
    change::<S>(shard, at, target, now, |state| {
        state.refund(target.limit, now, target.cost, at_micros);
        true
    });
}

/// Applies `apply` to the state `target` names, when there is one, and
/// drops that state when the change left it idle; whether `apply` said it
/// changed it (a state it did not change is kept as it is).
fn change<S: Tabled>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S) -> bool,
) -> bool {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            change_held::<S, u64>(shard, at, target, now, apply)
        }
        IdentityRef::Text(_) => change_held::<S, CompactString>(shard, at, target, now, apply),
    }
}

fn change_held<S: Tabled, I: Side>(
    shard: &mut Shard,
    at: &Located,
    target: &Target<'_>,
    now: u64,
    apply: impl FnOnce(&mut S) -> bool,
) -> bool {
    let identity = target.key.identity;
    let (Some(found), packing) = find_held::<S, I>(shard, at, identity, now) else {
        return false;
    };
    let (changed, idle) = found.with(packing, |state| {
        let changed = apply(state);
        (changed, changed && state.is_idle(now))
    });
    if idle {
        remove_held::<S, I>(shard, at, identity);
    }
    changed
}

fn reset<S: Tabled>(shard: &mut Shard, at: &Located, target: &Target<'_>) {
    match target.key.identity {
        IdentityRef::Number(_) | IdentityRef::Ipv4(_) => {
            remove_held::<S, u64>(shard, at, target.key.identity)
        }
        IdentityRef::Text(_) => remove_held::<S, CompactString>(shard, at, target.key.identity),
    }
}
