//! The Redis backend on a real three-master Redis Cluster: identities spread
//! over slots, limits over several hash tags stay all-or-nothing (blocks
//! included: an identity refused by a limit that blocks stays refused for
//! the block, to the microsecond, and the others are untouched), and a
//! flushed script cache on every node is survived.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, Decisions, MemoryBackend, Request},
    clock::ManualClock,
};
use ratewall_redis::RedisBackend;
use ratewall_tests::harness::RedisCluster;

const EPOCH_US: u64 = 1_700_000_000_000_000;

fn limit(algorithm: Algorithm, threshold: u64, period: Duration) -> Limit {
    Limit::new(threshold, period)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

async fn slot_of(cluster: &RedisCluster, key: &str) -> u16 {
    cluster.masters()[0].cmd(&["CLUSTER", "KEYSLOT", key]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identities_spread_over_slots_and_stay_isolated_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    assert!(backend.is_cluster());
    let long = "y".repeat(10 * 1024);
    let mut identities: Vec<String> = [
        "{",
        "}",
        "{}",
        "a}{b",
        ":",
        "a:b",
        "a b",
        "",
        "%7B",
        "日本語",
        "😀",
        long.as_str(),
    ]
    .map(String::from)
    .to_vec();
    identities.extend((0..30).map(|n| format!("user-{n}")));
    let log = limit(Algorithm::SlidingLog, 1, Duration::from_secs(60));
    let gcra = limit(Algorithm::Gcra, 1, Duration::from_secs(60));
    let keys: Vec<Key> = identities
        .iter()
        .map(|id| Key::new("spread", "otp", id))
        .collect();
    for key in &keys {
        let batch = [Request::new(key, &log, 1), Request::new(key, &gcra, 1)];
        assert!(
            backend.acquire(&batch).await.expect("acquire").allowed(),
            "first call of {:.40}",
            key.hash_tag()
        );
    }
    for key in &keys {
        let batch = [Request::new(key, &log, 1), Request::new(key, &gcra, 1)];
        assert!(
            !backend.acquire(&batch).await.expect("acquire").allowed(),
            "second call of {:.40}",
            key.hash_tag()
        );
    }
    let mut slots = BTreeSet::new();
    for key in &keys {
        let base = format!("{key}:{}", log.storage_suffix());
        let own: HashSet<u16> = [
            slot_of(&cluster, &base).await,
            slot_of(&cluster, &format!("{key}:{}", gcra.storage_suffix())).await,
        ]
        .into();
        assert_eq!(
            own.len(),
            1,
            "the keys of {:.40} span several slots",
            key.hash_tag()
        );
        slots.extend(own);
    }
    assert!(
        slots.len() > identities.len() / 2,
        "only {} slots for {} identities",
        slots.len(),
        identities.len()
    );
    let masters_used: HashSet<u16> = slots.iter().map(|slot| slot / 5_461).collect();
    assert_eq!(masters_used.len(), 3, "identities land on every master");
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// On a backend from the cluster's URLs and on one built on the
/// application's own cluster connection, each under its own key prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_over_several_hash_tags_are_all_or_nothing_and_decide_like_the_memory_backend_on_a_cluster()
 {
    let cluster = RedisCluster::start();
    let own = cluster.async_connection().await;
    let builders = [
        (
            "from URLs",
            "sms",
            RedisBackend::cluster_builder(cluster.urls()),
        ),
        (
            "on a ClusterConnection",
            "own-sms",
            RedisBackend::cluster_builder_with_connection(own.clone()),
        ),
    ];
    for (built, prefix, builder) in builders {
        let clock = ManualClock::new(EPOCH_US);
        let redis = builder
            .client_clock(clock.clone())
            .extra_ttl(Duration::from_secs(3_600))
            .connect()
            .await
            .expect("connect");
        assert!(redis.is_cluster());
        decides_like_the_memory_backend(&redis, &clock, prefix, built).await;
    }
}

/// Random SMS calls over three hash tags each, decided by `redis` and by
/// a memory backend under `clock`, keys under `prefix`: acquires, peeks,
/// refunds, reading and lifting an identity's blocks, and clock advances
/// (0 to 2 s, or to the end of an identity's block, -1, 0 or +1 µs);
/// every decision and every identity's blocks identical.
async fn decides_like_the_memory_backend(
    redis: &RedisBackend,
    clock: &ManualClock,
    prefix: &str,
    built: &str,
) {
    let memory = MemoryBackend::with_clock(clock.clone());
    // SMS: per phone 3/10 s (log), 10/min (window), 2/10 s (GCRA, blocking
    // for 20 s); per IP a token bucket (3/10 s, blocking for 7 s and 1 µs)
    // and a sliding window; per device a leaky bucket (2/5 s, blocking for
    // 2.5 s). The limits that block are each tag's tightest, so that they
    // refuse and block.
    let block = |limit: Limit, block: Duration| limit.with_block(block).expect("block");
    let phone_limits = [
        limit(Algorithm::SlidingLog, 3, Duration::from_secs(10)),
        limit(Algorithm::FixedWindow, 10, Duration::from_secs(60)),
        block(
            limit(Algorithm::Gcra, 2, Duration::from_secs(10)),
            Duration::from_secs(20),
        ),
    ];
    let ip_limits = [
        block(
            limit(Algorithm::TokenBucket, 3, Duration::from_secs(10)),
            Duration::from_micros(7_000_001),
        ),
        limit(Algorithm::SlidingWindow, 8, Duration::from_secs(10))
            .with_slots(5)
            .expect("slots"),
    ];
    let device_limit = block(
        limit(Algorithm::LeakyBucket, 2, Duration::from_secs(5)),
        Duration::from_millis(2_500),
    );
    let phones: Vec<Key> = (0..3)
        .map(|i| Key::from_display(prefix, "phone", &i))
        .collect();
    let ips: Vec<Key> = (0..2)
        .map(|i| Key::from_display(prefix, "ip", &i))
        .collect();
    let devices: Vec<Key> = (0..2)
        .map(|i| Key::from_display(prefix, "device", &i))
        .collect();
    let every: Vec<&Key> = phones.iter().chain(&ips).chain(&devices).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut allowed, mut refused) = (0, 0);
    // Per hash tag (phone, IP, device): refusals by its limit that blocks.
    let mut blocking = [0u32; 3];
    // Refusals by the limits that block of two tags or three in one call
    // (the tags after the one that refused are probed, and block, as one
    // all-or-nothing step would).
    let mut together = 0;
    let (mut blocks_read, mut lifted) = (0, 0);
    let mut last_allowed: Option<(usize, usize, usize, u64)> = None;
    for step in 0..600 {
        let (p, i, d) = (
            rng.below(3) as usize,
            rng.below(2) as usize,
            rng.below(2) as usize,
        );
        let batch: Vec<Request<'_>> = phone_limits
            .iter()
            .map(|l| Request::new(&phones[p], l, 1))
            .chain(ip_limits.iter().map(|l| Request::new(&ips[i], l, 1)))
            .chain([Request::new(&devices[d], &device_limit, 1)])
            .collect();
        match rng.below(20) {
            0 | 1 => {
                let m = memory.peek(&batch).await.expect("memory");
                let r = redis.peek(&batch).await.expect("redis");
                assert_eq!(m, r, "{built}: peek at step {step}");
            }
            2 => {
                for key in &every {
                    let m = memory.blocks(key).await.expect("memory");
                    let r = redis.blocks(key).await.expect("redis");
                    assert_eq!(m, r, "{built}: blocks of {key} at step {step}");
                    blocks_read += usize::from(!m.is_empty());
                }
            }
            3 => {
                let key = every[rng.below(every.len() as u64) as usize];
                let m = memory.unblock(key).await.expect("memory");
                let r = redis.unblock(key).await.expect("redis");
                assert_eq!(m, r, "{built}: unblock of {key} at step {step}");
                lifted += usize::from(m);
            }
            4 | 5 => {
                if let Some((p, i, d, at)) = last_allowed.take() {
                    let batch: Vec<Request<'_>> = phone_limits
                        .iter()
                        .map(|l| Request::new(&phones[p], l, 1))
                        .chain(ip_limits.iter().map(|l| Request::new(&ips[i], l, 1)))
                        .chain([Request::new(&devices[d], &device_limit, 1)])
                        .collect();
                    memory.refund(&batch, at).await.expect("memory");
                    redis.refund(&batch, at).await.expect("redis");
                }
            }
            _ => {
                let m: Decisions = memory.acquire(&batch).await.expect("memory");
                let r: Decisions = redis.acquire(&batch).await.expect("redis");
                assert_eq!(m, r, "{built}: acquire at step {step}");
                if m.allowed() {
                    allowed += 1;
                    last_allowed = Some((p, i, d, m[0].at_micros()));
                } else {
                    refused += 1;
                    // The limits that block: the phone's GCRA, the IP's
                    // bucket, the device's.
                    let mut tags = 0;
                    for (tag, index) in [2, 3, 5].into_iter().enumerate() {
                        blocking[tag] += u32::from(!m[index].allowed());
                        tags += u32::from(!m[index].allowed());
                    }
                    together += u32::from(tags > 1);
                }
            }
        }
        // Mostly 0 to 2 s; now and then to the end of an identity's
        // block, -1, 0 or +1 µs.
        let key = every[rng.below(every.len() as u64) as usize];
        let end = memory
            .blocks(key)
            .await
            .expect("memory")
            .first()
            .map(|b| b.left);
        match end {
            Some(left) if rng.below(4) == 0 => {
                let left = u64::try_from(left.as_micros()).expect("µs");
                clock.advance_micros(left + rng.below(3) - 1);
            }
            _ => clock.advance_micros(rng.below(2_000_000)),
        }
    }
    for key in &every {
        let m = memory.blocks(key).await.expect("memory");
        let r = redis.blocks(key).await.expect("redis");
        assert_eq!(m, r, "{built}: final blocks of {key}");
    }
    eprintln!(
        "{built}: allowed {allowed}, refused {refused}, refusals by a blocking limit per tag (phone, ip, device) {blocking:?}, of several tags at once {together}, non-empty block reads {blocks_read}, lifts {lifted}"
    );
    assert!(
        allowed > 20 && refused > 20,
        "{built}: allowed {allowed}, refused {refused}: the scenario must exercise both"
    );
    assert!(
        blocking.iter().all(|&n| n > 5) && together > 5 && blocks_read > 5 && lifted > 0,
        "{built}: blocks refused by tag {blocking:?}, {together} by several, read {blocks_read}, lifted {lifted}: the scenario must exercise them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_a_later_hash_tag_gives_back_what_earlier_ones_reserved_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let per_phone = limit(Algorithm::SlidingLog, 1, Duration::from_secs(60));
    let per_ip = limit(Algorithm::FixedWindow, 1, Duration::from_secs(3_600));
    let ip = Key::new("comp", "ip", "198.51.100.1");
    let first = Key::new("comp", "phone", "first");
    let second = Key::new("comp", "phone", "second");
    let call = |phone| {
        [
            Request::new(phone, &per_phone, 1),
            Request::new(&ip, &per_ip, 1),
        ]
    };
    assert!(
        backend
            .acquire(&call(&first))
            .await
            .expect("acquire")
            .allowed()
    );
    let refused = backend.acquire(&call(&second)).await.expect("acquire");
    assert!(
        !refused.allowed() && refused[0].allowed() && !refused[1].allowed(),
        "{refused:?}"
    );
    assert_eq!(
        refused[0].remaining(),
        1,
        "the phone limit reports its state without the reservation"
    );
    let phone_key = format!("{second}:{}", per_phone.storage_suffix());
    let node = &cluster.masters()[usize::from(slot_of(&cluster, &phone_key).await / 5_461)];
    let exists: i64 = node.cmd(&["EXISTS", &phone_key]).await;
    assert_eq!(exists, 0, "the reservation on the phone was given back");
    assert!(
        backend
            .acquire(&[Request::new(&second, &per_phone, 1)])
            .await
            .expect("acquire")
            .allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_on_every_node_during_a_load_run_causes_no_errors_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = Arc::new(
        RedisBackend::connect_cluster(cluster.urls())
            .await
            .expect("connect"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..8u64 {
        let (backend, stop, calls, errors) =
            (backend.clone(), stop.clone(), calls.clone(), errors.clone());
        workers.spawn(async move {
            let limits: Vec<Limit> = Algorithm::ALL
                .iter()
                .map(|&a| limit(a, 10_000, Duration::from_secs(1)))
                .collect();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = Key::from_display("cflush", "load", &(worker * 1_000 + n % 50));
                let batch: Vec<Request<'_>> =
                    limits.iter().map(|l| Request::new(&key, l, 1)).collect();
                if let Err(error) = backend.acquire(&batch).await {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("call failed: {error}");
                }
                calls.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        });
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for node in cluster.masters() {
            let _: String = node.cmd(&["SCRIPT", "FLUSH"]).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = workers.join_next().await {
        done.expect("worker");
    }
    let (calls, errors) = (
        calls.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    assert!(calls > 200, "only {calls} calls");
    assert_eq!(errors, 0, "{errors} of {calls} calls failed");
}

/// One round: `callers` concurrent callers over `phones` phones from one IP,
/// each asking for its phone's limit then the IP's (two hash tags, so two
/// groups on the cluster). Returns the decisions of every call.
async fn sms_round(
    backend: &Arc<RedisBackend>,
    round: &str,
    callers: usize,
    phones: usize,
    per_phone: Limit,
    per_ip: Limit,
) -> Vec<Decisions> {
    let mut tasks = tokio::task::JoinSet::new();
    let start = Arc::new(tokio::sync::Barrier::new(callers));
    for caller in 0..callers {
        let (backend, start, round) = (backend.clone(), start.clone(), round.to_owned());
        tasks.spawn(async move {
            let phone = Key::from_display(&round, "phone", &(caller % phones));
            let ip = Key::new(&round, "ip", "198.51.100.7");
            let batch = [
                Request::new(&phone, &per_phone, 1),
                Request::new(&ip, &per_ip, 1),
            ];
            start.wait().await;
            backend.acquire(&batch).await.expect("acquire")
        });
    }
    let mut decided = Vec::with_capacity(callers);
    while let Some(done) = tasks.join_next().await {
        decided.push(done.expect("caller"));
    }
    decided
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_over_two_hash_tags_are_never_refused_while_the_ip_has_room_on_a_cluster() {
    const ROUNDS: usize = 30;
    const CALLERS: usize = 200;
    const PHONES: usize = 50;
    const IP_QUOTA: u64 = 20;
    let cluster = RedisCluster::start();
    let backend = Arc::new(
        RedisBackend::connect_cluster(cluster.urls())
            .await
            .expect("connect"),
    );
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingLog] {
        let per_phone = limit(algorithm, 1, Duration::from_secs(60));
        let per_ip = limit(algorithm, IP_QUOTA, Duration::from_secs(3_600));
        for round in 0..ROUNDS {
            let prefix = format!("sms-{}-{round}", algorithm.name());
            let decided = sms_round(&backend, &prefix, CALLERS, PHONES, per_phone, per_ip).await;
            let admitted: Vec<u64> = decided
                .iter()
                .filter(|d| d.allowed())
                .map(|d| d[1].at_micros())
                .collect();
            assert_eq!(
                admitted.len() as u64,
                IP_QUOTA,
                "{algorithm}, round {round}: admitted {} of {CALLERS}",
                admitted.len()
            );
            // A call the IP refused (its phone had room) must come after all
            // the IP's units were taken: both are decided on the IP's master,
            // at its TIME, so the decision times order them.
            for refused in decided.iter().filter(|d| d[0].allowed() && !d[1].allowed()) {
                let at = refused[1].at_micros();
                let before = admitted.iter().filter(|&&t| t <= at).count() as u64;
                assert_eq!(
                    before, IP_QUOTA,
                    "{algorithm}, round {round}: refused by the IP with {} of {IP_QUOTA} \
                     taken: {refused:?}",
                    before
                );
            }
            // Every phone that was admitted holds its one unit, no other does.
            let phones_used: HashSet<usize> = decided
                .iter()
                .filter(|d| d.allowed())
                .map(|d| d[0].remaining() as usize)
                .collect();
            assert_eq!(phones_used, HashSet::from([0]));
        }
    }
}

/// Limits that block, by Redis time, in calls over two hash tags: a
/// refusal by the later tag blocks its identity (the earlier tag's units
/// given back, nothing blocked there); a refusal by the earlier tag blocks
/// it and the later tag's refusing limit too, as one all-or-nothing step
/// would; each block ends at the refusal's time plus the block, to the
/// microsecond, on the master of its identity's slot; other identities are
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_identity_stays_refused_for_its_block_by_redis_time_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::connect_cluster(cluster.urls())
        .await
        .expect("connect");
    let block = Duration::from_secs(3);
    let per_phone = Limit::per_minute(5)
        .and_then(|l| l.with_block(block))
        .expect("limit");
    let per_ip = Limit::per_second(1)
        .and_then(|l| l.with_block(block))
        .expect("limit");
    let (first, second) = (
        Key::new("pbox", "phone", "first"),
        Key::new("pbox", "phone", "second"),
    );
    let ip = Key::new("pbox", "ip", "198.51.100.7");
    let call = |phone| {
        [
            Request::new(phone, &per_phone, 1),
            Request::new(&ip, &per_ip, 1),
        ]
    };
    let blocked_until = async |key: &Key, limit: &Limit| -> Option<u64> {
        let block_key = format!("{key}:b");
        let node = &cluster.masters()[usize::from(slot_of(&cluster, &block_key).await / 5_461)];
        let end: Option<String> = node
            .cmd(&["HGET", &block_key, &limit.storage_suffix()])
            .await;
        end.map(|e| e.parse().expect("µs"))
    };
    assert!(
        backend
            .acquire(&call(&first))
            .await
            .expect("acquire")
            .allowed()
    );
    // The IP (the later tag) refuses: it is blocked, the phone is not.
    let refused = backend.acquire(&call(&second)).await.expect("acquire");
    assert!(refused[0].allowed() && !refused[1].allowed(), "{refused:?}");
    assert_eq!(refused[1].retry_after(), block);
    let end = refused[1].at_micros() + 3_000_000;
    assert_eq!(blocked_until(&ip, &per_ip).await, Some(end));
    assert_eq!(blocked_until(&second, &per_phone).await, None);
    assert!(backend.blocks(&second).await.expect("blocks").is_empty());
    // Another IP is untouched.
    let elsewhere = Key::new("pbox", "ip", "203.0.113.9");
    let other = [
        Request::new(&second, &per_phone, 1),
        Request::new(&elsewhere, &per_ip, 1),
    ];
    assert!(backend.acquire(&other).await.expect("acquire").allowed());
    // Past the IP's second, still refused until the block's end, which is
    // not extended.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let during = backend.acquire(&call(&first)).await.expect("acquire");
    assert!(!during.allowed() && during[0].allowed());
    assert_eq!(
        during[1].at_micros() + during[1].retry_after().as_micros() as u64,
        end
    );
    tokio::time::sleep(during[1].retry_after() + Duration::from_millis(5)).await;
    assert!(
        backend
            .acquire(&call(&first))
            .await
            .expect("acquire")
            .allowed()
    );
    // The phone (the earlier tag) refuses; the IP, probed, refuses too:
    // both are blocked from the same time.
    let phone = Key::new("pbox", "phone", "third");
    let once = Limit::per_minute(1)
        .and_then(|l| l.with_block(block))
        .expect("limit");
    let both = [
        Request::new(&phone, &once, 1),
        Request::new(&ip, &per_ip, 1),
    ];
    let taken = backend
        .acquire(&[Request::new(&phone, &once, 1)])
        .await
        .expect("acquire");
    assert!(taken.allowed());
    let refused = backend.acquire(&both).await.expect("acquire");
    assert!(
        !refused[0].allowed() && !refused[1].allowed(),
        "{refused:?}"
    );
    let end = refused[0].at_micros() + 3_000_000;
    assert_eq!(blocked_until(&phone, &once).await, Some(end));
    assert_eq!(
        blocked_until(&ip, &per_ip).await,
        Some(refused[1].at_micros() + 3_000_000)
    );
    assert_eq!(backend.blocks(&ip).await.expect("blocks").len(), 1);
}

/// A cluster connection whose calls went unanswered for the period set
/// is opened again in the background, and the calls after go through the
/// new one and decide exactly. (Every master paused, about a second, below
/// the cluster's node timeout: two calls time out, half a second apart;
/// the second starts the opening, which the nodes answer once resumed.)
/// The application's own connection is never replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_whose_calls_went_unanswered_for_the_period_is_opened_again() {
    let cluster = RedisCluster::start();
    let timeout = Duration::from_millis(500);
    let period = Some(Duration::from_millis(400));
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .timeout(timeout)
        .reopen_stalled_cluster(period)
        .connect()
        .await
        .expect("connect");
    let given = RedisBackend::cluster_builder_with_connection(cluster.async_connection().await)
        .timeout(timeout)
        .reopen_stalled_cluster(period)
        .connect()
        .await
        .expect("connect");
    let per_minute = limit(Algorithm::Gcra, 2, Duration::from_secs(60));
    let paused = Key::new("stall", "paused", "a");
    // Up to three stalls: an opening that failed (the machine slow enough
    // for it to time out before the nodes resumed) is logged, not counted.
    let mut stalls = 0;
    while backend.cluster_connections_reopened() == 0 && stalls < 3 {
        stall(&cluster, &backend, &per_minute, &paused).await;
        stalls += 1;
        let started = std::time::Instant::now();
        while backend.cluster_connections_reopened() == 0
            && started.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(backend.cluster_connections_reopened(), 1);
    let fresh = Key::new("stall", "after", "a");
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let decided = backend
            .acquire(&[Request::new(&fresh, &per_minute, 1)])
            .await
            .expect("a call through the new connection");
        allowed.push(decided.allowed());
    }
    assert_eq!(allowed, [true, true, false]);

    stall(&cluster, &given, &per_minute, &paused).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(given.cluster_connections_reopened(), 0);
    let after = given
        .acquire(&[Request::new(&fresh, &per_minute, 1)])
        .await
        .expect("the given connection answers once the nodes resume");
    assert!(!after.allowed());
}

/// With every master of `cluster` paused, two calls of `backend` time out
/// (half a second apart, at its timeout); then the masters resume.
async fn stall(cluster: &RedisCluster, backend: &RedisBackend, per_minute: &Limit, paused: &Key) {
    // Answered (allowed or not: stalls may repeat) before the pause.
    backend
        .acquire(&[Request::new(&Key::new("stall", "warm", "a"), per_minute, 1)])
        .await
        .expect("a call before the pause");
    for node in cluster.masters() {
        node.pause();
    }
    for _ in 0..2 {
        let timed_out = backend
            .acquire(&[Request::new(paused, per_minute, 1)])
            .await;
        assert!(timed_out.is_err(), "{timed_out:?}");
    }
    for node in cluster.masters() {
        node.resume();
    }
}

/// A period under a millisecond for reopening a stalled cluster
/// connection cannot work (every unanswered call would reopen), and says
/// so when building, before connecting.
#[tokio::test]
async fn a_period_of_zero_for_reopening_is_refused_when_building() {
    for period in [Duration::ZERO, Duration::from_micros(500)] {
        let error = RedisBackend::cluster_builder(["redis://127.0.0.1:1/"])
            .reopen_stalled_cluster(Some(period))
            .connect()
            .await
            .expect_err("a period under a millisecond is refused");
        assert!(
            error
                .to_string()
                .contains(&format!("reopen_stalled_cluster(Some({period:?}))")),
            "{error}"
        );
    }
}
