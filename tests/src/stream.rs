//! The job stream as a test reads it (the PEL, undelivered entries, the
//! dead letters) and tampers with it (raw entries, trims, republications).

use crate::Env;
use pelican_model::ids::EntryId;
use std::collections::BTreeSet;

impl Env {
    /// The stream key.
    #[must_use]
    pub fn jobs_key(&self) -> String {
        format!("{}:jobs", self.stream)
    }

    /// The group's consumers over every partition (XINFO CONSUMERS), by
    /// name: each one's pending deliveries and its idle time in ms (the
    /// least over the partitions that know it).
    #[must_use]
    pub fn consumers(&self) -> std::collections::BTreeMap<String, (u64, u64)> {
        let mut c = self.redis.conn();
        let mut all = std::collections::BTreeMap::new();
        for key in &self.names().partitions {
            let rows: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(key)
                .arg("pelican")
                .query(&mut c)
                .unwrap_or_default();
            for row in rows {
                let int = |k: &str| match row.get(k) {
                    Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                    _ => 0,
                };
                let Some(redis::Value::BulkString(name)) = row.get("name") else {
                    continue;
                };
                let e = all
                    .entry(String::from_utf8_lossy(name).into_owned())
                    .or_insert((0, u64::MAX));
                e.0 += int("pending");
                e.1 = e.1.min(int("idle"));
            }
        }
        all
    }

    /// Pending deliveries in every partition (0 where the group is gone).
    #[must_use]
    pub fn pel_len(&self) -> u64 {
        let mut c = self.redis.conn();
        self.names()
            .partitions
            .iter()
            .map(|key| {
                let v: redis::Value = redis::cmd("XPENDING")
                    .arg(key)
                    .arg("pelican")
                    .query(&mut c)
                    .unwrap_or(redis::Value::Nil);
                match v {
                    redis::Value::Array(parts) => match parts.first() {
                        Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                        _ => 0,
                    },
                    _ => 0,
                }
            })
            .sum()
    }

    /// Whether the group has delivered every entry and none is pending.
    /// Undelivered entries are read first, then the PEL: an entry a reader
    /// takes between the two reads is then seen pending. In the other
    /// order, such a read hid it from both.
    #[must_use]
    pub fn stream_drained(&self) -> bool {
        !self.undelivered() && self.pel_len() == 0
    }

    /// Whether a partition's stream holds entries the group has not
    /// delivered yet.
    #[must_use]
    pub fn undelivered(&self) -> bool {
        let mut c = self.redis.conn();
        self.names()
            .partitions
            .iter()
            .any(|key| undelivered_in(&mut c, key))
    }

    /// The job entries quarantined on the dead-letter stream.
    #[must_use]
    pub fn quarantined(&self) -> BTreeSet<EntryId> {
        let mut c = self.redis.conn();
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(format!("{}:jobs:dead", self.stream))
            .arg("-")
            .arg("+")
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let mut out = BTreeSet::new();
        if let redis::Value::Array(entries) = v {
            for e in entries {
                let redis::Value::Array(parts) = e else {
                    continue;
                };
                let Some(redis::Value::Array(fields)) = parts.get(1) else {
                    continue;
                };
                let text = |v: &redis::Value| match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                };
                let kv: Vec<(String, String)> = fields
                    .chunks(2)
                    .filter_map(|p| match p {
                        [k, v] => Some((text(k), text(v))),
                        _ => None,
                    })
                    .collect();
                let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
                if get("kind").as_deref() == Some("quarantined")
                    && let Some(id) = get("source").and_then(|s| s.parse().ok())
                {
                    out.insert(id);
                }
            }
        }
        out
    }

    /// XADDs raw bytes to the job stream; `None` when Redis does not answer.
    pub fn xadd_raw(&self, fields: &[(&[u8], Vec<u8>)]) -> Option<EntryId> {
        let mut c = self.redis.try_conn()?;
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(v.as_slice());
        }
        let id: String = cmd.query(&mut c).ok()?;
        id.parse().ok()
    }

    /// Which of `ids` are still entries of the job stream.
    #[must_use]
    pub fn present(&self, ids: &[EntryId]) -> Vec<EntryId> {
        let mut c = self.redis.conn();
        let names = self.names();
        ids.iter()
            .copied()
            .filter(|id| {
                let Some(key) = names.key(id.partition) else {
                    return false;
                };
                let at = id.local().to_string();
                let v: redis::Value = redis::cmd("XRANGE")
                    .arg(key)
                    .arg(&at)
                    .arg(&at)
                    .query(&mut c)
                    .unwrap_or(redis::Value::Nil);
                matches!(v, redis::Value::Array(ref es) if !es.is_empty())
            })
            .collect()
    }

    /// Pending entry IDs (up to 1,000), oldest first.
    fn pending_ids(&self, c: &mut dyn redis::ConnectionLike) -> Vec<String> {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(self.jobs_key())
            .arg("pelican")
            .arg("-")
            .arg("+")
            .arg(1000)
            .query(c)
            .unwrap_or(redis::Value::Nil);
        let redis::Value::Array(rows) = v else {
            return Vec::new();
        };
        rows.iter()
            .filter_map(|r| match r {
                redis::Value::Array(p) => match p.first() {
                    Some(redis::Value::BulkString(b)) => {
                        Some(String::from_utf8_lossy(b).into_owned())
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// Removes entries below pending IDs: XTRIM MINID at the median pending
    /// ID (everything older goes, pending or not), or, with `xdel`, XDEL of
    /// the oldest pending entry. Returns how many entries went (0 when
    /// nothing was pending or Redis did not answer).
    pub fn trim_below_pending(&self, xdel: bool) -> u64 {
        let Some(mut c) = self.redis.try_conn() else {
            return 0;
        };
        let pending = self.pending_ids(&mut c);
        let removed: redis::RedisResult<u64> = if xdel {
            let Some(id) = pending.first() else { return 0 };
            redis::cmd("XDEL")
                .arg(self.jobs_key())
                .arg(id)
                .query(&mut c)
        } else {
            let Some(id) = pending.get(pending.len() / 2) else {
                return 0;
            };
            redis::cmd("XTRIM")
                .arg(self.jobs_key())
                .arg("MINID")
                .arg(id)
                .query(&mut c)
        };
        removed.unwrap_or(0)
    }

    /// XADDs a copy of one of the newest job entries (a publisher that
    /// retried after a lost reply); false when there was none or Redis did
    /// not answer.
    pub fn publish_again(&self) -> bool {
        let Some(mut c) = self.redis.try_conn() else {
            return false;
        };
        let v: redis::Value = redis::cmd("XREVRANGE")
            .arg(self.jobs_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(20)
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let redis::Value::Array(entries) = v else {
            return false;
        };
        let job = entries.iter().rev().find_map(|e| {
            let redis::Value::Array(parts) = e else {
                return None;
            };
            let Some(redis::Value::Array(fields)) = parts.get(1) else {
                return None;
            };
            let kv: Vec<Vec<u8>> = fields
                .iter()
                .filter_map(|f| match f {
                    redis::Value::BulkString(b) => Some(b.clone()),
                    _ => None,
                })
                .collect();
            let is_job = kv.len() == 4 && kv[0] == b"run_id" && kv[2] == b"dispatch";
            is_job.then_some(kv)
        });
        let Some(kv) = job else { return false };
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for f in &kv {
            cmd.arg(f.as_slice());
        }
        cmd.query::<String>(&mut c).is_ok()
    }

    /// XADDs raw fields to the job stream (for malformed entries and
    /// duplicate publications).
    pub fn xadd(&self, fields: &[(&str, &str)]) -> EntryId {
        let mut c = self.redis.conn();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        let id: String = cmd.query(&mut c).expect("XADD to the test's Redis");
        id.parse().expect("Redis answers an entry ID")
    }
}

/// Whether `key`'s stream holds entries the group has not delivered yet.
fn undelivered_in(c: &mut dyn redis::ConnectionLike, key: &str) -> bool {
    let newest: redis::Value = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(c)
        .unwrap_or(redis::Value::Nil);
    let id_text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse::<EntryId>().ok(),
        _ => None,
    };
    let newest = match &newest {
        redis::Value::Array(es) => es.first().and_then(|e| match e {
            redis::Value::Array(p) => p.first().and_then(id_text),
            _ => None,
        }),
        _ => None,
    };
    let Some(newest) = newest else { return false };
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query(c)
        .unwrap_or(redis::Value::Nil);
    let last = match &groups {
        redis::Value::Array(gs) => gs.iter().find_map(|g| match g {
            redis::Value::Array(kv) => kv
                .chunks(2)
                .find(|p| matches!(&p[0], redis::Value::BulkString(k) if k == b"last-delivered-id"))
                .and_then(|p| id_text(&p[1])),
            redis::Value::Map(kv) => kv
                .iter()
                .find(
                    |(k, _)| matches!(k, redis::Value::BulkString(k) if k == b"last-delivered-id"),
                )
                .and_then(|(_, v)| id_text(v)),
            _ => None,
        }),
        _ => None,
    };
    last.is_none_or(|last| newest > last)
}
