use super::*;
use crate::model::clock::ManualClock;
use crate::model::key::Key;

#[test]
fn an_identity_entry_is_small() {
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
        hasher: Hasher::fixed(),
        sweep_at: MIN_SWEEP,
        freed: HashMap::new(),
        blocks: HashTable::new(),
        blocks_sweep_at: MIN_SWEEP,
    });
    // Where the shard starts after the lock (the mutex is cache-padded).
    let shard = std::ptr::from_ref(&*lock.lock()) as usize - std::ptr::from_ref(&lock) as usize;
    let gcra =
        offset_of!(Shard, tables) + offset_of!(AllTables, numbers) + offset_of!(Tables<u64>, gcra);
    let touched = [
        offset_of!(Shard, last_now) + size_of::<u64>(),
        gcra + size_of::<HashTable<Entry<Tat, u64>>>(),
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
            .map(|shard| shard.lock().tables.numbers.gcra.capacity())
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
