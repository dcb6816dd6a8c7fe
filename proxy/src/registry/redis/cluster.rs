//! What the Redis registry needs on a Redis Cluster besides redis-rs's cluster client: the slot of
//! a key, which master serves which slot, and commands for many slots sent as one pipeline per
//! master, with one MULTI/EXEC block per slot.
//!
//! redis-rs routes a pipeline as a whole to the node of its first key and refuses one whose keys
//! span slots, so a refresh of N agents (2 N keys over as many slots) would be N transactions.
//! Grouping by master instead makes it one pipeline per master, sent concurrently.

use std::collections::{BTreeMap, HashMap};

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

/// Redis Cluster's number of hash slots.
const SLOTS: usize = 16384;

/// The slot of a key, by Redis Cluster's rule: CRC16 (XMODEM) of its hash tag (what the first `{`
/// and the next `}` enclose, unless that is empty), or else of the whole key, modulo 16384.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter().position(|&b| b == b'}').filter(|&close| close > 0).map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tag.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 { crc << 1 } else { (crc << 1) ^ 0x1021 };
        }
    }
    crc % SLOTS as u16
}

/// Which master serves each slot, as `CLUSTER SLOTS` said.
#[derive(Debug)]
pub(super) struct SlotOwners {
    /// By slot: a number naming its master, or `UNSERVED`.
    owner: Vec<u32>,
}

const UNSERVED: u32 = u32::MAX;

impl SlotOwners {
    /// Reads a `CLUSTER SLOTS` reply: `[start, end, [host, port, ...], replicas...]` per range.
    pub(super) fn parse(reply: Value) -> Result<Self, String> {
        let Value::Array(ranges) = reply else { return Err(format!("CLUSTER SLOTS answered {reply:?}")) };
        let mut owner = vec![UNSERVED; SLOTS];
        let mut masters: HashMap<(String, i64), u32> = HashMap::new();
        for range in ranges {
            let bad = || format!("unexpected CLUSTER SLOTS range {range:?}");
            let Value::Array(fields) = &range else { return Err(bad()) };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(bad());
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => return Err(bad()),
            };
            let Some(Value::Int(port)) = master.get(1) else { return Err(bad()) };
            let next = u32::try_from(masters.len()).map_err(|_| bad())?;
            let number = *masters.entry((host, *port)).or_insert(next);
            let (Ok(start), Ok(end)) = (usize::try_from(*start), usize::try_from(*end)) else { return Err(bad()) };
            for slot in owner.iter_mut().take(end.saturating_add(1).min(SLOTS)).skip(start) {
                *slot = number;
            }
        }
        Ok(Self { owner })
    }

    /// A number naming the master of `slot`. A slot no master serves gets a number of its own:
    /// its commands go alone (and fail, unless the cluster changed meanwhile).
    fn master(&self, slot: u16) -> u64 {
        match self.owner.get(usize::from(slot)) {
            Some(&n) if n != UNSERVED => u64::from(n),
            _ => (1 << 32) + u64::from(slot),
        }
    }
}

/// Asks any node which master serves which slot.
pub(super) async fn slot_owners(conn: &mut ClusterConnection) -> Result<SlotOwners, String> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply = conn
        .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
        .await
        .map_err(|e| e.to_string())?;
    SlotOwners::parse(reply)
}

/// Commands for several slots, each with the key that decides its slot.
pub(super) type Commands = [(String, redis::Cmd)];

/// Runs `commands` with one pipeline per master, all concurrently; when `atomic`, the commands of
/// each slot form one MULTI/EXEC block. Returns each command's reply, in order, or the first
/// error (a slot that moved since `owners` was read fails its block). `sent` is called once per
/// pipeline.
pub(super) async fn run_per_master(
    conn: &ClusterConnection,
    owners: &SlotOwners,
    commands: &Commands,
    atomic: bool,
    sent: impl Fn(),
) -> Result<Vec<Value>, String> {
    // master -> slot -> indexes of its commands.
    let mut plan: BTreeMap<u64, BTreeMap<u16, Vec<usize>>> = BTreeMap::new();
    for (i, (key, _)) in commands.iter().enumerate() {
        let slot = key_slot(key.as_bytes());
        plan.entry(owners.master(slot)).or_default().entry(slot).or_default().push(i);
    }
    let requests = plan.into_values().map(|slots| {
        let mut pipe = redis::pipe();
        for indexes in slots.values() {
            if atomic {
                pipe.cmd("MULTI");
            }
            for &i in indexes {
                pipe.add_command(commands[i].1.clone());
            }
            if atomic {
                pipe.cmd("EXEC");
            }
        }
        // Routed by one of its own slots: redis-rs sends it to the master serving that slot.
        let route = slots.keys().next().map_or(SingleNodeRoutingInfo::Random, |&slot| {
            SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
        });
        let mut conn = conn.clone();
        sent();
        async move {
            let count = pipe.len();
            (slots, conn.route_pipeline(pipe, 0, count, route).await)
        }
    });
    let mut results = vec![Value::Nil; commands.len()];
    for (slots, replies) in futures::future::join_all(requests).await {
        let mut replies = replies.map_err(|e| e.to_string())?.into_iter();
        for indexes in slots.values() {
            let values = if atomic {
                // +OK for MULTI, +QUEUED per command (or the error refusing it), then EXEC's array.
                for reply in replies.by_ref().take(indexes.len() + 1) {
                    reply.extract_error().map_err(|e| e.to_string())?;
                }
                match replies.next().map(Value::extract_error) {
                    Some(Ok(Value::Array(values))) if values.len() == indexes.len() => values,
                    Some(Err(e)) => return Err(e.to_string()),
                    other => return Err(format!("unexpected EXEC reply {other:?}")),
                }
            } else {
                replies.by_ref().take(indexes.len()).collect()
            };
            if values.len() != indexes.len() {
                return Err(format!("{} replies for {} commands", values.len(), indexes.len()));
            }
            for (&i, value) in indexes.iter().zip(values) {
                results[i] = value.extract_error().map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use redis::Value;
    use redis::cluster_routing::{Route, SlotAddr};

    use super::{SlotOwners, key_slot};

    #[test]
    fn slots_follow_redis_cluster_and_hash_tags() {
        // Redis's own examples (CLUSTER KEYSLOT on redis-server 7.0).
        // The CRC16 check value of "123456789" (below 16384, so it is the slot).
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"kas:agent:{1}"), 9842);
        assert_eq!(key_slot(b"kas:agent:{7}"), 1716);
        assert_eq!(key_slot(b"kas:events:{pubsub}"), 13799);
        // Only the tag counts; an empty tag or an unclosed brace hashes the whole key.
        assert_eq!(key_slot(b"kas:agent:{7}"), key_slot(b"other:seen:{7}:x"));
        for key in ["kas:project:{10}", "a{}b", "x{", "{a}{b}", "no tag", ""] {
            assert_eq!(
                Route::new(key_slot(key.as_bytes()), SlotAddr::Master),
                Route::with_key(key.as_bytes(), SlotAddr::Master),
                "{key}"
            );
        }
    }

    #[test]
    fn slot_owners_group_slots_by_master_and_reject_nonsense() {
        let master = |port| Value::Array(vec![Value::BulkString(b"127.0.0.1".to_vec()), Value::Int(port)]);
        let range = |start, end, port| Value::Array(vec![Value::Int(start), Value::Int(end), master(port)]);
        let owners = SlotOwners::parse(Value::Array(vec![
            range(0, 5460, 7001),
            range(5461, 10922, 7002),
            range(10923, 16000, 7001),
        ]))
        .unwrap();
        assert_eq!(owners.master(0), owners.master(16000));
        assert_ne!(owners.master(0), owners.master(5461));
        // Unserved slots are each their own group.
        assert_ne!(owners.master(16001), owners.master(16002));
        assert_ne!(owners.master(16001), owners.master(0));
        assert!(SlotOwners::parse(Value::Okay).is_err());
        assert!(SlotOwners::parse(Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }
}
