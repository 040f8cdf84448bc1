//! [`RedisCluster`]: a real Redis Cluster made of `redis-server` processes
//! (`valkey-server` when Valkey is selected), created with `CLUSTER`
//! commands (no `redis-cli` or `valkey-cli` needed).

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::server::RedisServer;

/// Number of masters in every cluster the harness builds.
pub const MASTERS: usize = 3;

/// Number of hash slots in Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long cluster creation may take before the harness panics.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(20);

const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How long the nodes have to know each other before a node that does not
/// know them all is made to meet them again (the node timeout is 2 s).
const REMEET_AFTER: Duration = Duration::from_secs(3);
const ADDSLOTS_CHUNK: u16 = 1024;

/// Three masters (plus optional replicas), each a [`RedisServer`] with
/// `--cluster-enabled yes --cluster-node-timeout 2000`, joined with
/// `CLUSTER MEET` and with the 16384 slots split in three contiguous ranges.
///
/// [`start`](Self::start) returns only when every node reports
/// `cluster_state:ok` and all nodes agree on the topology. Dropping the
/// value kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    /// Masters first (`0..MASTERS`), then replicas; replica `j` follows
    /// master `j % MASTERS`.
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts a cluster of three masters without replicas.
    ///
    /// # Panics
    ///
    /// Panics if a node cannot be started, or if the cluster is not healthy
    /// within 20 s (the message includes every node's view).
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// Starts three masters with `replicas_per_master` replicas each,
    /// attached with `CLUSTER REPLICATE`; returns once every replica has
    /// synced (`master_link_status:up`).
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start).
    pub fn start_with_replicas(replicas_per_master: usize) -> Self {
        let count = MASTERS * (1 + replicas_per_master);
        Self::start_nodes(vec![Vec::new(); count])
    }

    /// Starts three masters, each with its own extra `redis-server`
    /// arguments (`node_args[i]` for master `i`, e.g. `--tls-port` and
    /// `--tls-cluster yes`), without replicas. The harness itself talks to
    /// the nodes on their plain ports.
    ///
    /// # Panics
    ///
    /// Panics unless `node_args` has three entries; see [`start`](Self::start).
    pub fn start_with_node_args(node_args: Vec<Vec<String>>) -> Self {
        assert_eq!(node_args.len(), MASTERS, "one argument list per master");
        Self::start_nodes(node_args)
    }

    fn start_nodes(node_args: Vec<Vec<String>>) -> Self {
        let nodes: Vec<RedisServer> = thread::scope(|scope| {
            let handles: Vec<_> = node_args
                .iter()
                .map(|args| scope.spawn(move || RedisServer::start_cluster_node_with(args)))
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let cluster = Self { nodes };
        cluster.create();
        cluster
    }

    fn create(&self) {
        let ids: Vec<String> = self
            .nodes
            .iter()
            .map(|node| expect_ok(node, &["CLUSTER", "MYID"]))
            .collect();

        for (index, master) in self.masters().iter().enumerate() {
            let (first, last) = slot_range(index);
            add_slots(master, first, last);
        }
        // Distinct config epochs avoid the epoch-collision dance (this is
        // what `redis-cli --cluster create` does as well).
        for (index, node) in self.nodes.iter().enumerate() {
            let epoch = (index + 1).to_string();
            expect_ok::<String>(node, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
        }
        let first = &self.nodes[0];
        for node in &self.nodes[1..] {
            meet(first, node, expect_ok::<String>);
        }

        let deadline = Instant::now() + CREATE_TIMEOUT;
        let mut met_at = Instant::now();
        let mut last_problem;
        loop {
            self.attach_replicas(&ids);
            match self.check_converged(&ids) {
                Ok(()) => return,
                Err(problem) => last_problem = problem,
            }
            if met_at.elapsed() >= REMEET_AFTER {
                self.meet_strays();
                met_at = Instant::now();
            }
            if Instant::now() >= deadline {
                panic!(
                    "Redis Cluster did not converge within {CREATE_TIMEOUT:?}: {last_problem}\n{}",
                    self.describe()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Has every node that knows fewer nodes than the cluster has meet the
    /// others again. On a loaded machine a node's side of a handshake can
    /// time out (after the node timeout) while the other side completed
    /// it: the other side then counts it as connected, but it ignores the
    /// gossip of nodes it does not know and would stay alone for good.
    fn meet_strays(&self) {
        let everyone = self.nodes.len().to_string();
        for stray in &self.nodes {
            let info: String = match stray.blocking_cmd(&["CLUSTER", "INFO"]) {
                Ok(info) => info,
                Err(_) => continue,
            };
            let known = info
                .lines()
                .find_map(|line| line.trim().strip_prefix("cluster_known_nodes:"));
            if known == Some(everyone.as_str()) {
                continue;
            }
            for other in self.nodes.iter().filter(|n| n.port() != stray.port()) {
                // Retried at the next round if it fails.
                let _ = meet(stray, other, |node, args| node.blocking_cmd::<String>(args));
            }
        }
    }

    /// Issues `CLUSTER REPLICATE` on every replica that does not follow its
    /// master yet (it fails until gossip has told the replica about it).
    fn attach_replicas(&self, ids: &[String]) {
        for (offset, replica) in self.replicas().iter().enumerate() {
            let master_id = &ids[offset % MASTERS];
            let nodes: String = match replica.blocking_cmd(&["CLUSTER", "NODES"]) {
                Ok(nodes) => nodes,
                Err(_) => continue,
            };
            let myself = nodes.lines().find(|line| line.contains("myself"));
            let follows = myself.is_some_and(|line| line.split(' ').nth(3) == Some(master_id));
            if !follows && nodes.contains(master_id.as_str()) {
                let _ = replica.blocking_cmd::<String>(&["CLUSTER", "REPLICATE", master_id]);
            }
        }
    }

    fn check_converged(&self, ids: &[String]) -> Result<(), String> {
        let mut views = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let port = node.port();
            let info: String = node
                .blocking_cmd(&["CLUSTER", "INFO"])
                .map_err(|err| format!("CLUSTER INFO on {port}: {err}"))?;
            for expected in [
                "cluster_state:ok".to_string(),
                format!("cluster_slots_assigned:{SLOTS}"),
                format!("cluster_slots_ok:{SLOTS}"),
                format!("cluster_known_nodes:{}", self.nodes.len()),
            ] {
                if !info.lines().any(|line| line.trim() == expected) {
                    return Err(format!("node {port} does not report `{expected}` yet"));
                }
            }
            let nodes: String = node
                .blocking_cmd(&["CLUSTER", "NODES"])
                .map_err(|err| format!("CLUSTER NODES on {port}: {err}"))?;
            views.push(parse_view(&nodes).map_err(|problem| format!("node {port}: {problem}"))?);
        }
        if let Some(position) = views.iter().position(|view| view != &views[0]) {
            return Err(format!(
                "nodes {} and {} disagree on the topology",
                self.nodes[0].port(),
                self.nodes[position].port()
            ));
        }
        for (offset, replica) in self.replicas().iter().enumerate() {
            let master_id = &ids[offset % MASTERS];
            let replica_id = &ids[MASTERS + offset];
            let attached = views[0].iter().any(|entry| {
                &entry.id == replica_id && entry.role == "slave" && &entry.master == master_id
            });
            if !attached {
                return Err(format!(
                    "replica {} is not attached to its master yet",
                    replica.port()
                ));
            }
            let replication: String = replica
                .blocking_cmd(&["INFO", "replication"])
                .map_err(|err| format!("INFO replication on {}: {err}", replica.port()))?;
            if !replication
                .lines()
                .any(|line| line.trim() == "master_link_status:up")
            {
                return Err(format!("replica {} has not synced yet", replica.port()));
            }
        }
        Ok(())
    }

    /// `CLUSTER INFO` and `CLUSTER NODES` of every node, for panic messages.
    fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|node| {
                let info = node
                    .blocking_cmd::<String>(&["CLUSTER", "INFO"])
                    .unwrap_or_else(|err| err.to_string());
                let state = info
                    .lines()
                    .filter(|line| {
                        line.starts_with("cluster_state") || line.starts_with("cluster_known")
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                let nodes = node
                    .blocking_cmd::<String>(&["CLUSTER", "NODES"])
                    .unwrap_or_else(|err| err.to_string());
                format!(
                    "--- node {} (pid {}): {state}\n{nodes}",
                    node.port(),
                    node.pid()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every node: the masters first, then the replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes started as masters (slots `0..=5460`, `5461..=10921`,
    /// `10922..=16383`). Roles may change after a failover; indexes don't.
    pub fn masters(&self) -> &[RedisServer] {
        &self.nodes[..MASTERS]
    }

    /// The nodes started as replicas; replica `j` follows master `j % 3`.
    pub fn replicas(&self) -> &[RedisServer] {
        &self.nodes[MASTERS..]
    }

    /// The URLs of all nodes, in [`nodes`](Self::nodes) order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A cluster client seeded with every node's URL.
    pub fn client(&self) -> ClusterClient {
        ClusterClient::new(self.urls()).expect("the harness URLs are valid")
    }

    /// An async cluster connection (`redis::cluster_async`).
    ///
    /// # Panics
    ///
    /// Panics if the connection cannot be established.
    pub async fn async_connection(&self) -> ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .unwrap_or_else(|err| panic!("cannot connect to the cluster {:?}: {err}", self.urls()))
    }

    /// Kills master `index` (in [`masters`](Self::masters) order) with
    /// SIGKILL, simulating a crash. Without replicas the cluster goes to
    /// `cluster_state:fail` once the other nodes notice (about 2 s).
    ///
    /// # Panics
    ///
    /// Panics if `index >= 3`.
    pub fn kill_master(&self, index: usize) {
        self.masters()[index].kill();
    }

    /// Waits until one of the replicas of (killed) master `index` has been
    /// promoted and every running node reports `cluster_state:ok`; returns
    /// the promoted node.
    ///
    /// # Panics
    ///
    /// Panics if that does not happen within `timeout`.
    pub fn wait_for_failover(&self, index: usize, timeout: Duration) -> &RedisServer {
        let deadline = Instant::now() + timeout;
        loop {
            let promoted = self
                .replicas()
                .iter()
                .enumerate()
                .filter(|(offset, replica)| offset % MASTERS == index && replica.is_running())
                .map(|(_, replica)| replica)
                .find(|replica| {
                    replica
                        .blocking_cmd::<String>(&["INFO", "replication"])
                        .is_ok_and(|info| info.lines().any(|line| line.trim() == "role:master"))
                });
            if let Some(promoted) = promoted
                && self.running_nodes_report_ok()
            {
                return promoted;
            }
            if Instant::now() >= deadline {
                panic!(
                    "no replica of master {index} took over within {timeout:?}\n{}",
                    self.describe()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until every running node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// Panics if that does not happen within `timeout`.
    pub fn wait_for_state_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.running_nodes_report_ok() {
            if Instant::now() >= deadline {
                panic!(
                    "cluster_state is not ok after {timeout:?}\n{}",
                    self.describe()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    fn running_nodes_report_ok(&self) -> bool {
        self.nodes
            .iter()
            .filter(|node| node.is_running())
            .all(|node| {
                node.blocking_cmd::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.lines().any(|line| line.trim() == "cluster_state:ok"))
            })
    }
}

/// The inclusive slot range of master `index`.
fn slot_range(index: usize) -> (u16, u16) {
    let slots = usize::from(SLOTS);
    let first = index * slots / MASTERS;
    let last = (index + 1) * slots / MASTERS - 1;
    (
        u16::try_from(first).expect("slot fits in u16"),
        u16::try_from(last).expect("slot fits in u16"),
    )
}

/// `CLUSTER ADDSLOTSRANGE` (Redis 7), falling back to `CLUSTER ADDSLOTS` in
/// chunks on older servers.
fn add_slots(node: &RedisServer, first: u16, last: u16) {
    let (from, to) = (first.to_string(), last.to_string());
    if node
        .blocking_cmd::<String>(&["CLUSTER", "ADDSLOTSRANGE", &from, &to])
        .is_ok()
    {
        return;
    }
    let mut start = first;
    while start <= last {
        let end = last.min(start + ADDSLOTS_CHUNK - 1);
        let slots: Vec<String> = (start..=end).map(|slot| slot.to_string()).collect();
        let mut args = vec!["CLUSTER", "ADDSLOTS"];
        args.extend(slots.iter().map(String::as_str));
        expect_ok::<String>(node, &args);
        start = end + 1;
    }
}

/// Has `node` meet `other` (`CLUSTER MEET` with its address and bus
/// port), sent by `send`.
fn meet<T>(
    node: &RedisServer,
    other: &RedisServer,
    send: impl FnOnce(&RedisServer, &[&str]) -> T,
) -> T {
    let port = other.port().to_string();
    let bus = other.cluster_bus_port().expect("cluster node").to_string();
    send(node, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus])
}

fn expect_ok<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> T {
    node.blocking_cmd(args).unwrap_or_else(|err| {
        panic!(
            "`{}` on cluster node {} failed: {err}\n--- log tail ---\n{}",
            args.join(" "),
            node.port(),
            node.log_tail()
        )
    })
}

/// One line of `CLUSTER NODES`, reduced to what all nodes must agree on.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct NodeEntry {
    id: String,
    address: String,
    role: &'static str,
    master: String,
    slots: String,
}

/// Parses `CLUSTER NODES`, failing while any node is still in handshake,
/// unreachable, suspected down or disconnected.
fn parse_view(nodes: &str) -> Result<BTreeSet<NodeEntry>, String> {
    let mut view = BTreeSet::new();
    for line in nodes.lines().filter(|line| !line.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(format!("malformed CLUSTER NODES line `{line}`"));
        }
        let flags: Vec<&str> = fields[2].split(',').collect();
        if let Some(bad) = flags
            .iter()
            .find(|flag| matches!(**flag, "handshake" | "noaddr" | "fail" | "fail?"))
        {
            return Err(format!("node {} is flagged `{bad}`", fields[1]));
        }
        if fields[7] != "connected" {
            return Err(format!("link to {} is {}", fields[1], fields[7]));
        }
        let role = if flags.contains(&"master") {
            "master"
        } else if flags.contains(&"slave") {
            "slave"
        } else {
            return Err(format!("node {} has no role yet", fields[1]));
        };
        view.insert(NodeEntry {
            id: fields[0].to_string(),
            address: fields[1].to_string(),
            role,
            master: fields[3].to_string(),
            slots: fields[8..].join(" "),
        });
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_cover_all_slots_without_overlap() {
        assert_eq!(slot_range(0), (0, 5460));
        assert_eq!(slot_range(1), (5461, 10921));
        assert_eq!(slot_range(2), (10922, 16383));
    }
}
