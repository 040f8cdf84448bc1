use super::rows::{MAX_CLASSES, REBASE};
use super::tables::Tables;
use super::*;
use crate::model::clock::ManualClock;
use crate::model::key::Key;
use crate::model::limit::Algorithm;

#[test]
fn an_identity_entry_is_small() {
    // A GCRA state of a number, packed (see `rows`).
    assert_eq!(std::mem::size_of::<rows::PackedTat>(), 20);
    assert_eq!(std::mem::align_of::<rows::PackedTat>(), 1);
    assert_eq!(std::mem::size_of::<Entry<Tat, u64>>(), 32);
    assert_eq!(std::mem::size_of::<Entry<Tat, CompactString>>(), 48);
    // A window keeps its count's end, the count and a pause's end.
    assert_eq!(std::mem::size_of::<Entry<Window, u64>>(), 40);
    assert!(std::mem::size_of::<Entry<Window, CompactString>>() <= 56);
}

#[test]
fn what_a_decision_on_a_number_touches_shares_the_lock_s_cache_line() {
    use std::mem::{offset_of, size_of};
    let lock = Mutex::new(Shard {
        last_now: 0,
        tables: AllTables::default(),
        packing: Packing::default(),
        hasher: Hasher::fixed(),
        sweep_at: MIN_SWEEP,
        freed: HashMap::new(),
        blocks: HashTable::new(),
        blocks_sweep_at: MIN_SWEEP,
    });
    // Where the shard starts after the lock (the mutex is cache-padded).
    let shard = std::ptr::from_ref(&*lock.lock()) as usize - std::ptr::from_ref(&lock) as usize;
    let numbers = offset_of!(Shard, tables) + offset_of!(AllTables, numbers);
    // Where a GCRA decision on a number finds its row: the packed rows'
    // table (whole), then the wide entries' (which starts in the line).
    let packed = numbers + offset_of!(Tables<u64>, gcra);
    let wide = numbers + offset_of!(Tables<u64>, wide_gcra);
    let touched = [
        offset_of!(Shard, last_now) + size_of::<u64>(),
        packed + size_of::<LineTable>(),
        wide + 1,
    ];
    for end in touched {
        assert!(shard + end <= 64, "{touched:?} after {shard}");
    }
}

#[test]
fn refused_calls_and_peeks_add_no_identity() {
    let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let limit = Limit::per_minute(1).unwrap();
    let key = Key::new("rl", "s", "a");
    let req = [Request::new(&key, &limit, 1)];
    assert!(store.peek_sync(&req).allowed());
    assert_eq!(store.len(), 0);
    assert!(store.acquire_sync(&req).allowed());
    assert!(!store.acquire_sync(&req).allowed());
    assert_eq!(store.len(), 1);
}

#[test]
fn tables_grow_past_many_identities_and_keep_every_state() {
    let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let limit = Limit::per_minute(1).unwrap();
    let keys: Vec<Key> = (0..5_000u32)
        .map(|i| Key::from_display("rl", "s", &i))
        .collect();
    for key in &keys {
        assert!(store.acquire_one(&Request::new(key, &limit, 1)).allowed());
    }
    for key in &keys {
        assert!(!store.acquire_one(&Request::new(key, &limit, 1)).allowed());
    }
    assert_eq!(store.len(), 5_000);
}

#[test]
fn an_address_shares_state_with_its_text_and_never_with_the_number_of_its_value() {
    use crate::model::key::{Identity, Part};
    use crate::store::target::{KeyRef, Op, Target};
    let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let limit = Limit::per_minute(1).unwrap();
    let head = "rl:{s:";
    let acquire = |identity: Identity| {
        let target = Target {
            name: "s",
            key: KeyRef {
                head,
                identity: identity.as_ref(),
            },
            limit: &limit,
            cost: 1,
            slot: None,
            lease: 0,
        };
        let Ok(Stored::Decided(decisions)) = store.run(Op::Acquire, &[target]) else {
            panic!("an acquire decides");
        };
        decisions.allowed()
    };
    let address = std::net::Ipv4Addr::new(0, 0, 0, 5);
    assert!(acquire(Identity::of(Part::Ip(address.into()))));
    // The number 5 is another identity, with its own state.
    assert!(acquire(Identity::of(Part::Unsigned(5))));
    // The address however given: its text, a key, its `Display`.
    assert!(!acquire(Identity::of(Part::Text("0.0.0.5"))));
    assert!(!acquire(Identity::render(&address)));
    let key = Key::new("rl", "s", "0.0.0.5");
    assert!(!store.acquire_one(&Request::new(&key, &limit, 1)).allowed());
    assert!(!acquire(Identity::of(Part::Unsigned(5))));
    assert_eq!(store.len(), 2);
}

#[test]
fn one_identity_under_two_scopes_or_two_limits_has_two_states() {
    let store = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let minute = Limit::per_minute(1).unwrap();
    let hour = Limit::per_hour(1).unwrap();
    let a = Key::new("rl", "a", "x");
    let b = Key::new("rl", "b", "x");
    for (key, limit) in [(&a, &minute), (&b, &minute), (&a, &hour)] {
        assert!(store.acquire_one(&Request::new(key, limit, 1)).allowed());
    }
    assert_eq!(store.len(), 3);
}

#[test]
fn two_stores_used_in_turn_by_one_thread_keep_their_own_partitions() {
    // Each store numbers its partitions from 0: a lookup cached for one
    // store must never answer for the other.
    let first = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let second = MemoryBackend::with_clock(ManualClock::new(1_000_000));
    let limit = Limit::per_minute(1).unwrap();
    let a = Key::new("rl", "a", "x");
    let b = Key::new("rl", "b", "x");
    assert!(first.acquire_one(&Request::new(&a, &limit, 1)).allowed());
    assert!(second.acquire_one(&Request::new(&b, &limit, 1)).allowed());
    assert!(first.acquire_one(&Request::new(&b, &limit, 1)).allowed());
    assert!(second.acquire_one(&Request::new(&a, &limit, 1)).allowed());
    for store in [&first, &second] {
        assert!(!store.acquire_one(&Request::new(&a, &limit, 1)).allowed());
        assert!(!store.acquire_one(&Request::new(&b, &limit, 1)).allowed());
        assert_eq!(store.len(), 2);
    }
}

#[test]
fn a_sweep_gives_back_the_room_of_the_states_it_dropped_and_keeps_the_rest_findable() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryBackend::with_clock(clock.clone());
    let (second, hour) = (Limit::per_second(1).unwrap(), Limit::per_hour(1).unwrap());
    // Room taken by the GCRA tables of numbers, over every shard.
    let room = || -> usize {
        store
            .shards
            .iter()
            .map(|shard| {
                let shard = shard.lock();
                shard.tables.numbers.wide_gcra.capacity() + shard.tables.numbers.gcra.capacity()
            })
            .sum()
    };
    let brief: Vec<Key> = (0..40_000u32)
        .map(|i| Key::from_display("rl", "brief", &i))
        .collect();
    let kept: Vec<Key> = (0..1_000u32)
        .map(|i| Key::from_display("rl", "kept", &i))
        .collect();
    for (keys, limit) in [(&brief, &second), (&kept, &hour)] {
        for key in keys {
            assert!(store.acquire_one(&Request::new(key, limit, 1)).allowed());
        }
    }
    let grown = room();
    clock.advance(std::time::Duration::from_secs(2));
    assert_eq!(store.evict_expired(), 40_000);
    assert_eq!(store.len(), 1_000);
    let left = room();
    assert!(left * 8 <= grown, "room {grown} -> {left} for 1 000 states");
    // Rehashed where a lookup finds them: each is still spent for the hour.
    for key in &kept {
        assert!(!store.acquire_one(&Request::new(key, &hour, 1)).allowed());
    }
    assert_eq!(store.len(), 1_000);
}

/// A small deterministic generator (xorshift), for the sequences below.
struct Steps(u64);

impl Steps {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every GCRA state a shard saw packed, or held aside, decides exactly as
/// the whole state it stands for: a long run of acquires, peeks, refunds,
/// debt, holds and resets on numbers, under limits changed live (one
/// period, several rates), periods too long to pack (30 days, 2^44 µs),
/// and time that jumps past the base's reach, against bare [`Tat`]s.
#[test]
fn a_packed_gcra_state_decides_exactly_as_the_whole_state() {
    const DAY: u64 = 86_400_000_000;
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryBackend::with_clock(clock.clone()).with_pack_at(0);
    let gcra = |limit: Limit| limit.with_algorithm(Algorithm::Gcra).unwrap();
    let periods = [
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(3_600),
        std::time::Duration::from_micros(30 * DAY),
        std::time::Duration::from_micros(1 << 44),
    ];
    // Per period, limits of one partition: a live change moves between them.
    let limits: Vec<Vec<Limit>> = periods
        .iter()
        .map(|&period| {
            [(1, 1), (3, 3), (10, 4), (10, 10), (7, 2), (100, 50)]
                .into_iter()
                .map(|(threshold, burst)| {
                    gcra(Limit::new(threshold, period).unwrap())
                        .with_burst(burst)
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let keys: Vec<Key> = (0..24u32)
        .map(|i| Key::from_display("rl", "packed", &(u64::from(i) * 7_919)))
        .collect();
    let mut model: HashMap<(usize, usize), Tat> = HashMap::new();
    let mut steps = Steps(0x9e37_79b9_7f4a_7c15);
    let (mut aside_seen, mut bases) = (0, std::collections::HashSet::new());
    for step in 0..40_000 {
        let (k, p) = (steps.below(24) as usize, steps.below(4) as usize);
        let limit = &limits[p][steps.below(6) as usize];
        let req = [Request::new(&keys[k], limit, 1 + steps.below(3))];
        let cost = req[0].cost;
        let now = clock.now_micros();
        let state = model.entry((k, p)).or_default();
        match steps.below(10) {
            0..=3 => assert_eq!(
                store.acquire_one(&req[0]),
                state.decide(limit, now, cost, true),
                "step {step}: acquire"
            ),
            4 => assert_eq!(
                store.peek_sync(&req)[0],
                state.decide(limit, now, cost, false),
                "step {step}: peek"
            ),
            5 => {
                store.refund_sync(&req, now);
                state.refund(limit, now, cost, now);
            }
            6 => {
                let units = steps.below(2_000);
                store.charge_sync(&[Request::new(&keys[k], limit, units)]);
                state.charge(limit, now, units);
            }
            7 => {
                let after = steps.below(1 << 40);
                let left = steps.below(3);
                store.hold_sync(&req, std::time::Duration::from_micros(after), left);
                state.hold(limit, now, after, left);
            }
            8 if steps.below(20) == 0 => {
                store.reset_sync(&req);
                *state = Tat::default();
            }
            _ => {}
        }
        // Time moves: mostly by less than an interval, now and then by
        // days, and past the base's reach.
        let jump = match steps.below(200) {
            0 => REBASE + steps.below(REBASE),
            1..=4 => steps.below(2 * DAY),
            _ => steps.below(20_000_000),
        };
        clock.advance(std::time::Duration::from_micros(jump));
        for shard in store.shards.iter() {
            let shard = shard.lock();
            aside_seen = aside_seen.max(shard.packing.aside());
            bases.insert(shard.packing.base());
        }
    }
    // Every state, as the model holds it.
    let now = clock.now_micros();
    for ((k, p), state) in &mut model {
        let limit = &limits[*p][0];
        let req = [Request::new(&keys[*k], limit, 1)];
        assert_eq!(store.peek_sync(&req)[0], state.decide(limit, now, 1, false));
    }
    assert!(aside_seen > 0, "some state was held aside");
    assert!(bases.len() > 3, "the base moved: {bases:?}");
}

/// A shard past [`MAX_CLASSES`] (one identity under ever new rates) holds
/// the states of new classes aside, exactly; removing them drops what was
/// aside.
#[test]
fn a_shard_past_its_classes_holds_states_aside_and_drops_them_with_their_row() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryBackend::with_clock(clock.clone()).with_pack_at(0);
    let key = Key::new("rl", "rates", "1");
    let mut state = Tat::default();
    let aside = || -> usize { store.shards.iter().map(|s| s.lock().packing.aside()).sum() };
    for threshold in 1..=(MAX_CLASSES as u64 + 100) {
        let limit = Limit::per_hour(threshold * 10)
            .unwrap()
            .with_algorithm(Algorithm::Gcra)
            .unwrap();
        let req = Request::new(&key, &limit, 1);
        let now = clock.now_micros();
        assert_eq!(
            store.acquire_one(&req),
            state.decide(&limit, now, 1, true),
            "rate {threshold}"
        );
        clock.advance(std::time::Duration::from_micros(1_000));
    }
    assert_eq!(aside(), 1, "the one state is held aside");
    let limit = Limit::per_hour(1)
        .unwrap()
        .with_algorithm(Algorithm::Gcra)
        .unwrap();
    store.reset_sync(&[Request::new(&key, &limit, 1)]);
    assert_eq!((store.len(), aside()), (0, 0));
}

/// A shard holds GCRA states of numbers wide until it holds
/// [`Packing::pack_at`] of them, then packs them all: every state, before,
/// across and after, decides exactly as the whole state (a live limit
/// change on the way), and idle ones are still swept.
#[test]
fn a_shard_that_grows_packs_its_states_and_each_decides_as_before() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryBackend::with_clock(clock.clone()).with_pack_at(16);
    let gcra = |threshold| {
        Limit::per_minute(threshold)
            .unwrap()
            .with_algorithm(Algorithm::Gcra)
            .unwrap()
    };
    let (three, five) = (gcra(3), gcra(5));
    let keys: Vec<Key> = (0..8_000u64)
        .map(|i| Key::from_display("rl", "grows", &(i * 104_729)))
        .collect();
    let mut model = vec![Tat::default(); keys.len()];
    let packed_shards = || {
        store
            .shards
            .iter()
            .filter(|s| !s.lock().tables.numbers.gcra.is_empty())
            .count()
    };
    let mut steps = Steps(0x2545_f491_4f6c_dd1d);
    let mut seen_wide = false;
    for round in 0..3 {
        // The limit changes live in the last round.
        let limit = if round == 2 { &five } else { &three };
        for (i, key) in keys.iter().enumerate() {
            let now = clock.now_micros();
            let req = Request::new(key, limit, 1 + steps.below(2));
            assert_eq!(
                store.acquire_one(&req),
                model[i].decide(limit, now, req.cost, true),
                "round {round}, identity {i}"
            );
            if round == 0 && i == 500 {
                seen_wide = packed_shards() < store.shards.len();
            }
            clock.advance(std::time::Duration::from_micros(steps.below(3_000)));
        }
    }
    assert!(seen_wide, "shards held states wide before they grew");
    assert_eq!(
        packed_shards(),
        store.shards.len(),
        "every shard grew past 16"
    );
    clock.advance(std::time::Duration::from_secs(3_600));
    assert_eq!(store.evict_expired(), keys.len());
    assert_eq!(store.len(), 0);
}
