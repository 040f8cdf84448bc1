//! Self-tests of the Redis harness: they specify what `RedisServer`,
//! `RedisCluster` and `RedisSentinel` guarantee, against real processes.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ratewall_tests::harness::{MASTERS, SLOTS, find_redis_server, pid_is_alive};
use ratewall_tests::{RedisCluster, RedisSentinel, RedisServer};
use redis::Value;

fn port_accepts_connections(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// Polls `condition` every 50 ms until it holds or `timeout` expires.
fn eventually(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn redis_server_is_installed() {
    assert!(
        find_redis_server().is_some(),
        "{}",
        ratewall_tests::harness::NOT_FOUND_MESSAGE
    );
}

#[tokio::test]
async fn standalone_server_answers_ping_and_is_killed_on_drop() {
    let server = RedisServer::start();
    let (port, pid, dir) = (server.port(), server.pid(), server.dir().to_path_buf());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert!(server.is_running());
    assert!(pid_is_alive(pid));
    assert!(dir.join("redis.log").exists());

    let pong: String = server.cmd(&["PING"]).await;
    assert_eq!(pong, "PONG");

    drop(server);

    assert!(!pid_is_alive(pid), "/proc/{pid} still shows a live process");
    assert!(
        !port_accepts_connections(port),
        "port {port} still accepts connections"
    );
    assert!(!dir.exists(), "temp dir {} was not removed", dir.display());
}

#[test]
fn server_is_killed_when_the_owning_test_panics() {
    let (sender, receiver) = mpsc::channel();
    let outcome = thread::spawn(move || {
        let server = RedisServer::start();
        sender.send((server.pid(), server.port())).unwrap();
        panic!("simulated test failure");
    })
    .join();

    assert!(outcome.is_err());
    let (pid, port) = receiver.recv().unwrap();
    assert!(!pid_is_alive(pid), "server pid {pid} survived the panic");
    assert!(!port_accepts_connections(port));
}

#[tokio::test]
async fn restart_keeps_port_and_empties_data() {
    let server = RedisServer::start();
    let (port, old_pid) = (server.port(), server.pid());
    let _: () = server.cmd(&["SET", "key", "value"]).await;
    assert_eq!(
        server
            .cmd::<Option<String>>(&["GET", "key"])
            .await
            .as_deref(),
        Some("value")
    );

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(!pid_is_alive(old_pid));
    assert!(server.is_running());
    assert_eq!(server.cmd::<Option<String>>(&["GET", "key"]).await, None);
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]).await, 0);
}

#[tokio::test]
async fn paused_server_does_not_answer_until_resumed() {
    let server = RedisServer::start();
    let mut con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = server.cmd(&["SET", "key", "value"]).await;

    server.pause();
    assert!(server.is_running(), "a paused server is still running");
    let mut get_cmd = redis::cmd("GET");
    let get = get_cmd.arg("key").query_async::<Option<String>>(&mut con);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), get)
            .await
            .is_err(),
        "a paused server answered"
    );

    server.resume();
    let value: Option<String> = server.cmd(&["GET", "key"]).await;
    assert_eq!(value.as_deref(), Some("value"));
}

#[test]
fn stop_shuts_down_gracefully_and_restart_brings_the_server_back() {
    let server = RedisServer::start();
    let pid = server.pid();

    server.stop();
    assert!(!server.is_running());
    assert!(!pid_is_alive(pid));
    assert!(!port_accepts_connections(server.port()));
    assert!(
        server.log_tail().contains("ready to exit"),
        "SIGTERM should shut down cleanly"
    );
    server.stop(); // stopping twice is a no-op

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.blocking_cmd::<String>(&["PING"]).unwrap(), "PONG");
}

#[test]
fn stop_works_on_a_paused_server() {
    let server = RedisServer::start();
    server.pause();
    let started = Instant::now();
    server.stop();
    assert!(!server.is_running());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stop should not need SIGKILL"
    );
}

#[test]
fn kill_simulates_a_crash() {
    let server = RedisServer::start();
    let pid = server.pid();
    server.kill();
    assert!(!server.is_running());
    assert!(!pid_is_alive(pid));
    assert!(!port_accepts_connections(server.port()));
}

#[tokio::test]
async fn start_with_passes_extra_arguments_to_redis_server() {
    let server =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"]);
    let maxmemory: Vec<String> = server.cmd(&["CONFIG", "GET", "maxmemory"]).await;
    assert_eq!(maxmemory, ["maxmemory", "10485760"]);
    let save: Vec<String> = server.cmd(&["CONFIG", "GET", "save"]).await;
    assert_eq!(save, ["save", ""], "persistence is disabled");
}

#[test]
fn servers_started_in_parallel_get_distinct_ports() {
    let servers: Vec<RedisServer> = (0..8)
        .map(|_| thread::spawn(RedisServer::start))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .collect();
    let ports: BTreeSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        assert_eq!(server.blocking_cmd::<String>(&["PING"]).unwrap(), "PONG");
    }
}

fn slot_ranges(cluster_slots: Vec<Value>) -> Vec<(i64, i64)> {
    cluster_slots
        .into_iter()
        .map(|entry| match entry {
            Value::Array(fields) => match fields.as_slice() {
                [Value::Int(first), Value::Int(last), ..] => (*first, *last),
                other => panic!("unexpected CLUSTER SLOTS entry {other:?}"),
            },
            other => panic!("unexpected CLUSTER SLOTS entry {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn cluster_reaches_state_ok_with_all_slots_covered() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), MASTERS);
    assert_eq!(cluster.urls().len(), MASTERS);

    for node in cluster.nodes() {
        let info: String = node.cmd(&["CLUSTER", "INFO"]).await;
        for expected in [
            "cluster_state:ok".to_string(),
            format!("cluster_slots_assigned:{SLOTS}"),
            format!("cluster_known_nodes:{MASTERS}"),
            format!("cluster_size:{MASTERS}"),
        ] {
            assert!(
                info.contains(&expected),
                "node {}: missing {expected}\n{info}",
                node.port()
            );
        }

        let mut ranges = slot_ranges(node.cmd(&["CLUSTER", "SLOTS"]).await);
        ranges.sort();
        assert_eq!(ranges.len(), MASTERS, "one contiguous range per master");
        assert_eq!(ranges.first().unwrap().0, 0);
        assert_eq!(ranges.last().unwrap().1, i64::from(SLOTS) - 1);
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].1 + 1, pair[1].0, "no gap or overlap between ranges");
        }
    }
}

#[tokio::test]
async fn cluster_connection_routes_keys_with_different_hash_tags() {
    let cluster = RedisCluster::start();
    let mut con = cluster.async_connection().await;

    // Pick hash tags until every master owns at least one of them.
    let mut tags = Vec::new();
    let mut owners = BTreeSet::new();
    for n in 0.. {
        let tag = format!("tag{n}");
        let slot: i64 = cluster.nodes()[0].cmd(&["CLUSTER", "KEYSLOT", &tag]).await;
        owners.insert(slot * MASTERS as i64 / i64::from(SLOTS));
        tags.push(tag);
        if owners.len() == MASTERS && tags.len() >= 10 {
            break;
        }
    }

    for tag in &tags {
        for field in ["a", "b"] {
            let key = format!("{{{tag}}}:{field}");
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(format!("{tag}-{field}"))
                .query_async(&mut con)
                .await
                .unwrap();
        }
        // Both keys share a slot, so a multi-key command works.
        let values: Vec<String> = redis::cmd("MGET")
            .arg(format!("{{{tag}}}:a"))
            .arg(format!("{{{tag}}}:b"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(values, [format!("{tag}-a"), format!("{tag}-b")]);
    }

    let mut total = 0;
    for master in cluster.masters() {
        let keys: i64 = master.cmd(&["DBSIZE"]).await;
        assert!(keys > 0, "master {} received no key", master.port());
        total += keys;
    }
    assert_eq!(total, 2 * tags.len() as i64);
}

#[tokio::test]
async fn cluster_with_replicas_fails_over_when_a_master_is_killed() {
    let cluster = RedisCluster::start_with_replicas(1);
    assert_eq!(cluster.nodes().len(), 2 * MASTERS);
    for replica in cluster.replicas() {
        let info: String = replica.cmd(&["INFO", "replication"]).await;
        assert!(
            info.contains("role:slave") && info.contains("master_link_status:up"),
            "{info}"
        );
    }

    // A key in master 0's slots, replicated before the crash.
    let master = &cluster.masters()[0];
    let mut key = String::new();
    for n in 0.. {
        key = format!("key{n}");
        let slot: i64 = master.cmd(&["CLUSTER", "KEYSLOT", &key]).await;
        if slot < i64::from(SLOTS) / MASTERS as i64 {
            break;
        }
    }
    let mut direct = master
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("survives")
        .query_async(&mut direct)
        .await
        .unwrap();
    // Until the replica acknowledged the write: each WAIT shorter than the
    // client's response timeout (a replica still syncing on a busy machine
    // can take longer than one WAIT).
    let waiting = std::time::Instant::now();
    loop {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query_async(&mut direct)
            .await
            .unwrap();
        if acked == 1 {
            break;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "the replica never acknowledged the write"
        );
    }

    cluster.kill_master(0);
    let promoted = cluster.wait_for_failover(0, Duration::from_secs(20));
    assert_eq!(promoted.port(), cluster.replicas()[0].port());

    let mut con = cluster.async_connection().await;
    let value: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("survives"));
}

#[tokio::test]
async fn sentinel_monitors_the_master_and_reports_its_address() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start(&master);
    assert_ne!(sentinel.port(), master.port());
    assert_eq!(
        sentinel.url(),
        format!("redis://127.0.0.1:{}/", sentinel.port())
    );

    let addr = sentinel.master_addr().unwrap();
    assert_eq!(addr, ("127.0.0.1".to_string(), master.port()));
    let info: String = sentinel.cmd(&["INFO", "server"]).await;
    // Valkey names the field `server_mode`.
    assert!(
        info.contains("redis_mode:sentinel") || info.contains("server_mode:sentinel"),
        "{info}"
    );
}

#[test]
fn sentinel_flags_a_paused_master_as_down() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start(&master);
    let flags = || -> String {
        let fields: Vec<String> = sentinel
            .server()
            .blocking_cmd(&["SENTINEL", "MASTER", sentinel.master_name()])
            .unwrap();
        let at = fields.iter().position(|field| field == "flags").unwrap();
        fields[at + 1].clone()
    };
    eventually(Duration::from_secs(5), "the master is seen as up", || {
        flags() == "master"
    });

    master.pause();
    eventually(
        Duration::from_secs(10),
        "the master is flagged s_down",
        || flags().contains("s_down"),
    );

    master.resume();
    eventually(Duration::from_secs(10), "the master is up again", || {
        flags() == "master"
    });
}
