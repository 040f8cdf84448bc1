//! [`Nodes`]: which master of a Redis Cluster serves which hash slot, as
//! `CLUSTER SLOTS` last said, so that a coalescing backend queues each
//! node's calls apart (see [`crate::coalesce`]).
//!
//! The map only groups calls: a coalesced call goes to the node that
//! redis-rs routes its first call's slot to, and a call whose key that node
//! does not serve fails there before it writes anything and is sent again
//! alone (which follows the cluster's redirections). So a map that is out
//! of date costs calls sent twice, never a wrong decision; such a failure
//! marks the map out of date, and it is read again in the background (at
//! most every [`REFRESH_EVERY`]) while calls go on being grouped by the
//! map they have. (Sending every call alone until the new map came, as a
//! first version did, sent bursts of calls through redis-rs's cluster
//! client while it followed `MOVED` replies, and under load some of them
//! stalled until their timeout.)

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

/// The hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The least time between two reads of the map.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// A slot no known node serves.
const NONE: u16 = u16::MAX;

/// The hash slot of `key` (the part between its first `{` and the next
/// `}` when that part is not empty, else the whole key), as Redis Cluster
/// computes it.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The map, and one value of `L` (a lane) per node ever seen.
pub(crate) struct Nodes<L> {
    inner: Mutex<Inner<L>>,
}

struct Inner<L> {
    /// Per slot, its node's index in `nodes`, or [`NONE`].
    slots: Vec<u16>,
    /// The nodes ever seen (`host:port`) and their lanes: a node that
    /// left keeps its lane, which nothing is queued on any more.
    nodes: Vec<(String, Arc<L>)>,
    /// Whether the map was read and no call found it out of date since.
    fresh: bool,
    /// Whether a read is under way.
    reading: bool,
    /// When the last read began.
    last: Option<Instant>,
}

impl<L> Nodes<L> {
    /// No map yet: every slot unknown.
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                slots: vec![NONE; SLOTS],
                nodes: Vec::new(),
                fresh: false,
                reading: false,
                last: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<L>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lane of the node serving `slot`, as the map last read says
    /// (out of date or not: a call its node no longer serves is sent again
    /// alone); `None` while no map knows the slot. Whether the map is out
    /// of date (and should be read again).
    pub(crate) fn lane(&self, slot: u16) -> (Option<Arc<L>>, bool) {
        let inner = self.lock();
        let lane = inner
            .slots
            .get(usize::from(slot))
            .and_then(|&node| inner.nodes.get(usize::from(node)))
            .map(|(_, lane)| Arc::clone(lane));
        (lane, !inner.fresh)
    }

    /// Marks the map out of date (a call found its slot served elsewhere).
    pub(crate) fn stale(&self) {
        self.lock().fresh = false;
    }

    /// Whether the map should be read now; if so, the caller reads it and
    /// hands the reply to [`Nodes::update`] (or `None` when the read
    /// failed).
    pub(crate) fn claim_read(&self, now: Instant) -> bool {
        let mut inner = self.lock();
        let due = !inner.fresh
            && !inner.reading
            && inner
                .last
                .is_none_or(|last| now.duration_since(last) >= REFRESH_EVERY);
        if due {
            inner.reading = true;
            inner.last = Some(now);
        }
        due
    }

    /// Takes the reply of `CLUSTER SLOTS` (`None`: the read failed, the
    /// map stays out of date); `lane` makes the lane of a node first seen.
    pub(crate) fn update(&self, reply: Option<Value>, lane: impl Fn() -> L) {
        let ranges = reply.as_ref().and_then(ranges);
        let mut inner = self.lock();
        inner.reading = false;
        let Some(ranges) = ranges else {
            return;
        };
        let mut slots = vec![NONE; SLOTS];
        for (first, last, node) in ranges {
            let index = match inner.nodes.iter().position(|(name, _)| *name == node) {
                Some(index) => index,
                None => {
                    inner.nodes.push((node, Arc::new(lane())));
                    inner.nodes.len() - 1
                }
            };
            let Ok(index) = u16::try_from(index) else {
                continue;
            };
            for slot in &mut slots[usize::from(first)..=usize::from(last)] {
                *slot = index;
            }
        }
        inner.slots = slots;
        inner.fresh = true;
    }
}

/// The ranges of a `CLUSTER SLOTS` reply: first slot, last slot, and the
/// master's `host:port`; `None` when the reply is not one.
fn ranges(reply: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let first = u16::try_from(*first).ok()?;
        let last = u16::try_from(*last).ok()?;
        if first > last || usize::from(last) >= SLOTS {
            return None;
        }
        out.push((first, last, format!("{host}:{port}")));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_s_slot_is_its_hash_tag_s_as_redis_computes_it() {
        // Values from `CLUSTER KEYSLOT` (Redis 7).
        assert_eq!(slot_of(b"foo"), 12_182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"rl:{sms:+33 6}:gc:60"), slot_of(b"sms:+33 6"));
        // An empty tag is no tag; the first `}` after the first `{` ends it.
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    #[test]
    fn the_map_groups_slots_by_master_and_waits_for_its_next_read_once_stale() {
        let nodes: Nodes<u8> = Nodes::new();
        let now = Instant::now();
        assert!(nodes.lane(0).0.is_none() && nodes.lane(0).1);
        assert!(nodes.claim_read(now));
        assert!(!nodes.claim_read(now), "one read at a time");
        let master = |first: i64, last: i64, port: i64| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(port),
                ]),
            ])
        };
        let reply = Value::Array(vec![
            master(0, 5_460, 7000),
            master(5_461, 10_922, 7001),
            master(10_923, 16_383, 7002),
        ]);
        nodes.update(Some(reply.clone()), || 7);
        let (a, b) = (nodes.lane(0).0.unwrap(), nodes.lane(5_460).0.unwrap());
        assert!(Arc::ptr_eq(&a, &b) && !nodes.lane(0).1);
        assert!(!Arc::ptr_eq(&a, &nodes.lane(5_461).0.unwrap()));
        // Out of date, the map still groups calls while it is read again.
        nodes.stale();
        assert!(Arc::ptr_eq(&a, &nodes.lane(0).0.unwrap()) && nodes.lane(0).1);
        assert!(!nodes.claim_read(now), "not again before REFRESH_EVERY");
        assert!(nodes.claim_read(now + REFRESH_EVERY));
        // The same masters keep their lanes; a failed read keeps it stale.
        nodes.update(None, || 8);
        assert!(nodes.lane(0).1);
        assert!(nodes.claim_read(now + REFRESH_EVERY * 2));
        nodes.update(Some(reply), || 9);
        assert!(Arc::ptr_eq(&a, &nodes.lane(1).0.unwrap()) && !nodes.lane(1).1);
        assert!(!nodes.claim_read(now + REFRESH_EVERY * 3));
        // Not a map: ignored.
        nodes.stale();
        assert!(nodes.claim_read(now + REFRESH_EVERY * 3));
        nodes.update(Some(Value::Int(1)), || 10);
        assert!(nodes.lane(0).1);
    }
}
