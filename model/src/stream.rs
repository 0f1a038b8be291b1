// Over 600 lines: one stream's reference semantics, a method a Redis command it models.
//! Reference semantics of one Redis stream with one consumer group. One
//! file, because every command shares the entries and the PEL's bookkeeping.
//!
//! [`Stream`] behaves as Redis 7.0 does for the commands Pelican issues:
//! XADD, XGROUP CREATE, XREADGROUP `>`, XACK, XAUTOCLAIM, XCLAIM (JUSTID,
//! IDLE), XPENDING (summary and extended), XRANGE, XTRIM (MAXLEN, MINID; exact
//! trimming), XDEL, XLEN and XINFO GROUPS' lag. Idle times come from the `now`
//! each call is given, which is what makes the simulator deterministic.
//!
//! Two facts of Redis matter most to the protocol and are kept here exactly:
//! XACK takes no consumer (anyone can acknowledge anything), and XAUTOCLAIM
//! and XCLAIM drop pending IDs whose entries were deleted or trimmed, which
//! XAUTOCLAIM reports in its third reply element. The differential tests in
//! `tests/` hold this model to a live Redis.
//!
//! The payload type `P` is generic: the protocol uses its typed
//! [`crate::protocol::JobEntry`], the conformance tests raw field lists.

use crate::ids::EntryId;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// XAUTOCLAIM scans at most `COUNT * 10` PEL entries per call (Redis'
/// `attempts_factor`).
pub const AUTOCLAIM_ATTEMPTS_FACTOR: usize = 10;

/// Errors Redis answers these commands with.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum StreamError {
    /// `NOGROUP`: the key or the consumer group does not exist.
    #[error("NOGROUP No such key or consumer group")]
    NoGroup,
    /// `BUSYGROUP`: XGROUP CREATE on an existing group.
    #[error("BUSYGROUP Consumer Group name already exists")]
    BusyGroup,
    /// XADD with an explicit ID not greater than the stream's last ID.
    #[error("ERR The ID specified in XADD is equal or smaller than the target stream top item")]
    IdTooSmall,
    /// XGROUP CREATE without MKSTREAM on a missing key.
    #[error("ERR The XGROUP subcommand requires the key to exist")]
    NoKey,
}

/// One pending delivery: the PEL's record of an entry delivered to a consumer
/// and not yet acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pending {
    /// The consumer that holds it.
    pub consumer: String,
    /// When it was last delivered (idle time is measured from here).
    pub delivery_time: Timestamp,
    /// How many times it was delivered.
    pub delivery_count: u64,
}

/// A consumer group.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Group {
    /// The group's name.
    pub name: String,
    /// The last ID delivered by `>`.
    pub last_delivered: EntryId,
    /// The logical read counter (`entries-read`), `None` when Redis cannot
    /// know it.
    pub entries_read: Option<u64>,
    /// The pending entries list.
    pub pel: BTreeMap<EntryId, Pending>,
    /// The consumers the group knows, each with when it was last seen:
    /// created or handed entries, or named by a read or a claim since.
    pub consumers: BTreeMap<String, Timestamp>,
}

impl Group {
    /// `consumer` named by a command at `now`: seen again if the group
    /// knows it, created if `handed` it entries.
    fn seen(&mut self, consumer: &str, now: Timestamp, handed: bool) {
        if let Some(seen) = self.consumers.get_mut(consumer) {
            *seen = now;
        } else if handed {
            self.consumers.insert(consumer.to_owned(), now);
        }
    }
}

/// One row of XINFO CONSUMERS.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// Its name.
    pub name: String,
    /// Entries pending for it.
    pub pending: u64,
    /// Milliseconds since it was last seen.
    pub idle_ms: u64,
}

/// XAUTOCLAIM's reply.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AutoClaim<P> {
    /// The cursor for the next call; `0-0` when the scan wrapped around.
    pub next: EntryId,
    /// The claimed entries (with payload `None` under JUSTID).
    pub claimed: Vec<(EntryId, Option<P>)>,
    /// Pending IDs whose entries no longer exist; Redis removed them from the
    /// PEL.
    pub deleted: Vec<EntryId>,
}

impl<P> AutoClaim<P> {
    /// Nothing claimed, nothing deleted, the scan over (cursor `0-0`).
    #[must_use]
    pub fn scan_over() -> Self {
        AutoClaim {
            next: EntryId::ZERO,
            claimed: Vec::new(),
            deleted: Vec::new(),
        }
    }
}

/// XPENDING's summary form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PendingSummary {
    /// Number of pending entries.
    pub count: u64,
    /// Smallest and largest pending ID, when any.
    pub range: Option<(EntryId, EntryId)>,
    /// Pending count per consumer, by name.
    pub consumers: Vec<(String, u64)>,
}

/// One row of XPENDING's extended form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PendingRow {
    /// The pending ID.
    pub id: EntryId,
    /// Its consumer.
    pub consumer: String,
    /// Milliseconds since its last delivery.
    pub idle_ms: u64,
    /// Times delivered.
    pub delivery_count: u64,
}

/// One row of XINFO GROUPS.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupInfo {
    /// Group name.
    pub name: String,
    /// Number of consumers.
    pub consumers: u64,
    /// PEL size.
    pub pending: u64,
    /// Last delivered ID.
    pub last_delivered: EntryId,
    /// `entries-read`.
    pub entries_read: Option<u64>,
    /// `lag`: entries not yet delivered to the group, when Redis can tell.
    pub lag: Option<u64>,
}

/// How XADD picks the ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AddId {
    /// `*`: from the clock, or the last ID's successor when the clock is behind.
    Auto,
    /// An explicit ID.
    Explicit(EntryId),
}

/// How XTRIM trims (exactly; Pelican never uses `~`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Trim {
    /// `MAXLEN n`: keep the newest `n` entries.
    MaxLen(u64),
    /// `MINID id`: remove entries with IDs below `id`.
    MinId(EntryId),
}

/// One Redis stream key: its entries, metadata and (at most) one consumer
/// group. A key that does not exist is the default value with
/// `exists == false`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stream<P> {
    /// Whether the key exists.
    pub exists: bool,
    /// The entries.
    pub entries: BTreeMap<EntryId, P>,
    /// The last ID ever added (`last-generated-id`).
    pub last_id: EntryId,
    /// Entries ever added (`entries-added`).
    pub entries_added: u64,
    /// The largest ID removed by XDEL (`max-deleted-entry-id`).
    pub max_deleted: EntryId,
    /// The consumer group, if created.
    pub group: Option<Group>,
}

impl<P> Default for Stream<P> {
    fn default() -> Self {
        Stream {
            exists: false,
            entries: BTreeMap::new(),
            last_id: EntryId::ZERO,
            entries_added: 0,
            max_deleted: EntryId::ZERO,
            group: None,
        }
    }
}

impl<P: Clone> Stream<P> {
    /// A key that does not exist.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn group_mut(&mut self) -> Result<&mut Group, StreamError> {
        self.group.as_mut().ok_or(StreamError::NoGroup)
    }

    /// The group, or `NOGROUP`.
    pub fn group(&self) -> Result<&Group, StreamError> {
        self.group.as_ref().ok_or(StreamError::NoGroup)
    }

    /// `XLEN`.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether the stream has no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn first_id(&self) -> EntryId {
        self.entries.keys().next().copied().unwrap_or(EntryId::ZERO)
    }

    /// `XADD key <id> field value ...`: appends and returns the new ID.
    pub fn xadd(&mut self, id: AddId, payload: P, now: Timestamp) -> Result<EntryId, StreamError> {
        let id = match id {
            AddId::Auto => {
                if now.as_ms() > self.last_id.ms {
                    EntryId::new(now.as_ms(), 0)
                } else {
                    // The clock is behind the last ID: Redis continues the
                    // last ID's sequence.
                    self.last_id.successor().ok_or(StreamError::IdTooSmall)?
                }
            }
            AddId::Explicit(id) => {
                if id <= self.last_id {
                    return Err(StreamError::IdTooSmall);
                }
                id
            }
        };
        self.exists = true;
        self.entries.insert(id, payload);
        self.last_id = id;
        self.entries_added += 1;
        Ok(id)
    }

    /// `XGROUP CREATE key group <start> [MKSTREAM]`, where `start` is `None`
    /// for `$` (only new entries) and an ID (usually `0`) otherwise.
    pub fn xgroup_create(
        &mut self,
        name: &str,
        start: Option<EntryId>,
        mkstream: bool,
    ) -> Result<(), StreamError> {
        if !self.exists {
            if !mkstream {
                return Err(StreamError::NoKey);
            }
            self.exists = true;
        }
        if self.group.is_some() {
            return Err(StreamError::BusyGroup);
        }
        self.group = Some(Group {
            name: name.to_owned(),
            last_delivered: start.unwrap_or(self.last_id),
            entries_read: None,
            pel: BTreeMap::new(),
            consumers: BTreeMap::new(),
        });
        Ok(())
    }

    /// `XGROUP DESTROY key group`: 1 if the group existed (its PEL goes
    /// with it), 0 if not.
    ///
    /// # Errors
    /// `NoKey` when the key does not exist.
    pub fn xgroup_destroy(&mut self, name: &str) -> Result<u64, StreamError> {
        if !self.exists {
            return Err(StreamError::NoKey);
        }
        match &self.group {
            Some(g) if g.name == name => {
                self.group = None;
                Ok(1)
            }
            _ => Ok(0),
        }
    }

    /// `XREADGROUP GROUP g <consumer> COUNT <count> STREAMS key >`: delivers
    /// up to `count` entries never delivered to the group, adding each to the
    /// PEL under `consumer`. Never blocks (the caller owns blocking).
    pub fn xreadgroup(
        &mut self,
        consumer: &str,
        count: usize,
        now: Timestamp,
    ) -> Result<Vec<(EntryId, P)>, StreamError> {
        let start = self.group()?.last_delivered;
        let batch: Vec<(EntryId, P)> = self
            .entries
            .range(start.successor().unwrap_or(EntryId::MAX)..)
            .filter(|(id, _)| **id > start)
            .take(count)
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        for (id, _) in &batch {
            let read = self.advance_entries_read(*id);
            let group = self.group_mut()?;
            group.entries_read = read;
            group.last_delivered = *id;
            group.pel.insert(
                *id,
                Pending {
                    consumer: consumer.to_owned(),
                    delivery_time: now,
                    delivery_count: 1,
                },
            );
        }
        // Redis 7.0 creates the consumer only when it is delivered something
        // (found by the conformance tests).
        self.group_mut()?.seen(consumer, now, !batch.is_empty());
        Ok(batch)
    }

    /// The group's `entries-read` after delivering `id` (Redis'
    /// `streamReplyWithRange` bookkeeping).
    fn advance_entries_read(&self, id: EntryId) -> Option<u64> {
        let group = self.group.as_ref().expect("called with a group");
        match group.entries_read {
            Some(read) if !self.range_has_tombstones(id) => Some(read + 1),
            _ if self.entries_added > 0 => self.estimate_distance(id),
            other => other,
        }
    }

    /// Redis' `streamRangeHasTombstones(s, start, NULL)`.
    fn range_has_tombstones(&self, start: EntryId) -> bool {
        if self.entries.is_empty() || self.max_deleted == EntryId::ZERO {
            return false;
        }
        if self.first_id() > self.max_deleted {
            return false;
        }
        start <= self.max_deleted
    }

    /// Redis' `streamEstimateDistanceFromFirstEverEntry`.
    fn estimate_distance(&self, id: EntryId) -> Option<u64> {
        if self.entries_added == 0 {
            return Some(0);
        }
        if self.entries.is_empty() && id <= self.last_id {
            return Some(self.entries_added);
        }
        match id.cmp(&self.last_id) {
            std::cmp::Ordering::Equal => return Some(self.entries_added),
            std::cmp::Ordering::Greater => return None,
            std::cmp::Ordering::Less => {}
        }
        let first = self.first_id();
        if self.max_deleted == EntryId::ZERO || self.max_deleted < first {
            if id < first {
                return Some(self.entries_added - self.len());
            } else if id == first {
                return Some(self.entries_added - self.len() + 1);
            }
        }
        None
    }

    /// `XACK key group id ...`: removes the IDs from the PEL, whoever holds
    /// them; returns how many were pending.
    pub fn xack(&mut self, ids: &[EntryId]) -> Result<u64, StreamError> {
        // Redis answers 0, not NOGROUP, when the key or the group is missing
        // (found by the conformance tests).
        let Ok(group) = self.group_mut() else {
            return Ok(0);
        };
        Ok(ids
            .iter()
            .filter(|id| group.pel.remove(id).is_some())
            .count() as u64)
    }

    /// `XAUTOCLAIM key group <consumer> <min_idle_ms> <start> COUNT <count>
    /// [JUSTID]`, as Redis 7.0 runs it: scans the PEL from `start`, at most
    /// `count * 10` entries; drops IDs whose entries were deleted (reporting
    /// them) before looking at idle time; transfers entries idle at least
    /// `min_idle_ms` to `consumer`, resetting their idle time and, unless
    /// JUSTID, incrementing their delivery count.
    #[allow(clippy::too_many_arguments)]
    pub fn xautoclaim(
        &mut self,
        consumer: &str,
        min_idle_ms: u64,
        start: EntryId,
        count: usize,
        justid: bool,
        now: Timestamp,
    ) -> Result<AutoClaim<P>, StreamError> {
        assert!(count > 0, "XAUTOCLAIM COUNT must be positive");
        let candidates: Vec<EntryId> = self
            .group()?
            .pel
            .range(start..)
            .map(|(id, _)| *id)
            .collect();
        let mut attempts = count * AUTOCLAIM_ATTEMPTS_FACTOR;
        let mut left = count;
        let mut claimed = Vec::new();
        let mut deleted = Vec::new();
        let mut next = EntryId::ZERO;
        let mut scan = candidates.into_iter();
        loop {
            if attempts == 0 || left == 0 {
                next = scan.next().unwrap_or(EntryId::ZERO);
                break;
            }
            attempts -= 1;
            let Some(id) = scan.next() else { break };
            let payload = self.entries.get(&id).cloned();
            let group = self.group.as_mut().expect("checked above");
            let Some(payload) = payload else {
                group.pel.remove(&id);
                deleted.push(id);
                // A deleted entry uses up COUNT like a claimed one (Redis
                // 7.0; found by the conformance tests).
                left -= 1;
                continue;
            };
            let nack = group.pel.get_mut(&id).expect("collected from the PEL");
            if now.ms_since(nack.delivery_time) < min_idle_ms {
                continue;
            }
            nack.consumer = consumer.to_owned();
            nack.delivery_time = now;
            if !justid {
                nack.delivery_count += 1;
            }
            claimed.push((id, (!justid).then_some(payload)));
            left -= 1;
        }
        // As XCLAIM: the consumer exists once it claimed something.
        self.group_mut()?.seen(consumer, now, !claimed.is_empty());
        Ok(AutoClaim {
            next,
            claimed,
            deleted,
        })
    }

    /// `XCLAIM key group <consumer> <min_idle_ms> id ... [IDLE ms] [JUSTID]`:
    /// transfers each listed pending ID idle at least `min_idle_ms`; drops
    /// pending IDs whose entries were deleted (Redis 7 behaviour); sets the
    /// delivery time to `now - idle_ms` (or `now`); increments the delivery
    /// count unless JUSTID. Returns the claimed IDs (with payloads unless
    /// JUSTID).
    pub fn xclaim(
        &mut self,
        consumer: &str,
        min_idle_ms: u64,
        ids: &[EntryId],
        idle_ms: Option<u64>,
        justid: bool,
        now: Timestamp,
    ) -> Result<Vec<(EntryId, Option<P>)>, StreamError> {
        self.group()?;
        let delivery_time = idle_ms.map_or(now, |idle| now.sub_ms(idle));
        let mut out = Vec::new();
        for id in ids {
            let payload = self.entries.get(id).cloned();
            let group = self.group.as_mut().expect("checked above");
            if !group.pel.contains_key(id) {
                continue;
            }
            let Some(payload) = payload else {
                group.pel.remove(id);
                continue;
            };
            let nack = group.pel.get_mut(id).expect("checked above");
            if now.ms_since(nack.delivery_time) < min_idle_ms {
                continue;
            }
            nack.consumer = consumer.to_owned();
            nack.delivery_time = delivery_time;
            if !justid {
                nack.delivery_count += 1;
            }
            out.push((*id, (!justid).then_some(payload)));
        }
        // Redis creates the consumer only once an entry is claimed (found
        // by the conformance tests).
        self.group_mut()?.seen(consumer, now, !out.is_empty());
        Ok(out)
    }

    /// `XINFO CONSUMERS key group`: each consumer by name, with its
    /// pending count and the milliseconds since it was last seen.
    ///
    /// # Errors
    /// `NoKey` without the key, `NoGroup` without the group.
    pub fn xinfo_consumers(&self, now: Timestamp) -> Result<Vec<ConsumerInfo>, StreamError> {
        if !self.exists {
            return Err(StreamError::NoKey);
        }
        let group = self.group()?;
        Ok(group
            .consumers
            .iter()
            .map(|(name, seen)| ConsumerInfo {
                name: name.clone(),
                pending: group.pel.values().filter(|p| p.consumer == *name).count() as u64,
                idle_ms: now.ms_since(*seen),
            })
            .collect())
    }

    /// `XGROUP DELCONSUMER key group consumer`: deletes the consumer and
    /// its pending entries with it (they leave the PEL unacknowledged);
    /// answers how many it held (0 for a consumer the group does not know).
    ///
    /// # Errors
    /// `NoKey` without the key, `NoGroup` without the group.
    pub fn xgroup_delconsumer(&mut self, consumer: &str) -> Result<u64, StreamError> {
        if !self.exists {
            return Err(StreamError::NoKey);
        }
        let group = self.group_mut()?;
        if group.consumers.remove(consumer).is_none() {
            return Ok(0);
        }
        let before = group.pel.len();
        group.pel.retain(|_, p| p.consumer != consumer);
        Ok((before - group.pel.len()) as u64)
    }

    /// `XPENDING key group`: the summary form.
    pub fn xpending_summary(&self) -> Result<PendingSummary, StreamError> {
        let group = self.group()?;
        let mut per: BTreeMap<&str, u64> = BTreeMap::new();
        for p in group.pel.values() {
            *per.entry(p.consumer.as_str()).or_default() += 1;
        }
        let range = match (group.pel.keys().next(), group.pel.keys().next_back()) {
            (Some(a), Some(b)) => Some((*a, *b)),
            _ => None,
        };
        Ok(PendingSummary {
            count: group.pel.len() as u64,
            range,
            consumers: per.into_iter().map(|(c, n)| (c.to_owned(), n)).collect(),
        })
    }

    /// `XPENDING key group [IDLE min] start end count [consumer]`: the
    /// extended form, IDs in `start..=end`.
    pub fn xpending_range(
        &self,
        min_idle_ms: Option<u64>,
        start: EntryId,
        end: EntryId,
        count: usize,
        consumer: Option<&str>,
        now: Timestamp,
    ) -> Result<Vec<PendingRow>, StreamError> {
        let group = self.group()?;
        if start > end {
            return Ok(Vec::new());
        }
        Ok(group
            .pel
            .range(start..=end)
            .filter(|(_, p)| consumer.is_none_or(|c| p.consumer == c))
            .filter(|(_, p)| min_idle_ms.is_none_or(|m| now.ms_since(p.delivery_time) >= m))
            .take(count)
            .map(|(id, p)| PendingRow {
                id: *id,
                consumer: p.consumer.clone(),
                idle_ms: now.ms_since(p.delivery_time),
                delivery_count: p.delivery_count,
            })
            .collect())
    }

    /// `XRANGE key start end [COUNT n]`.
    #[must_use]
    pub fn xrange(&self, start: EntryId, end: EntryId, count: usize) -> Vec<(EntryId, P)> {
        if start > end {
            return Vec::new();
        }
        self.entries
            .range(start..=end)
            .take(count)
            .map(|(id, p)| (*id, p.clone()))
            .collect()
    }

    /// `XTRIM key MAXLEN|MINID = x`: exact trimming; the PEL is untouched, so
    /// pending IDs may now point at nothing. Returns entries removed.
    pub fn xtrim(&mut self, trim: Trim) -> u64 {
        let doomed: Vec<EntryId> = match trim {
            Trim::MaxLen(keep) => {
                let excess = self.len().saturating_sub(keep) as usize;
                self.entries.keys().take(excess).copied().collect()
            }
            Trim::MinId(min) => self.entries.range(..min).map(|(id, _)| *id).collect(),
        };
        for id in &doomed {
            self.entries.remove(id);
        }
        doomed.len() as u64
    }

    /// `XDEL key id ...`: removes entries (not PEL records) and remembers the
    /// largest deleted ID. Returns entries removed.
    pub fn xdel(&mut self, ids: &[EntryId]) -> u64 {
        let mut n = 0;
        for id in ids {
            if self.entries.remove(id).is_some() {
                n += 1;
                self.max_deleted = self.max_deleted.max(*id);
            }
        }
        n
    }

    /// `XINFO GROUPS key`.
    pub fn xinfo_groups(&self) -> Result<Vec<GroupInfo>, StreamError> {
        if !self.exists {
            // "ERR no such key" (found by the conformance tests).
            return Err(StreamError::NoKey);
        }
        Ok(self.group.iter().map(|g| self.group_info(g)).collect())
    }

    fn group_info(&self, group: &Group) -> GroupInfo {
        let lag = if self.entries_added == 0 {
            Some(0)
        } else if group.entries_read.is_some() && !self.range_has_tombstones(group.last_delivered) {
            group.entries_read.map(|r| self.entries_added - r)
        } else {
            self.estimate_distance(group.last_delivered)
                .map(|r| self.entries_added - r)
        };
        GroupInfo {
            name: group.name.clone(),
            consumers: group.consumers.len() as u64,
            pending: group.pel.len() as u64,
            last_delivered: group.last_delivered,
            entries_read: group.entries_read,
            lag,
        }
    }

    /// The pending record of `id`, if any.
    #[must_use]
    pub fn pending(&self, id: EntryId) -> Option<&Pending> {
        self.group.as_ref().and_then(|g| g.pel.get(&id))
    }

    /// PEL size (0 without a group).
    #[must_use]
    pub fn pel_len(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.pel.len())
    }

    /// Model-only fault: Redis restarted having lost its newest write (AOF
    /// `everysec` loses up to the last second). If the newest entry is the
    /// last one added, it is gone as if never added, together with its
    /// delivery (which came after it). Returns whether anything was lost.
    pub fn lose_newest(&mut self) -> bool {
        let Some((&id, _)) = self.entries.iter().next_back() else {
            return false;
        };
        if id != self.last_id {
            return false;
        }
        self.entries.remove(&id);
        let previous = self
            .entries
            .keys()
            .next_back()
            .copied()
            .unwrap_or(EntryId::ZERO);
        self.last_id = previous;
        self.entries_added -= 1;
        if let Some(g) = self.group.as_mut() {
            g.pel.remove(&id);
            if g.last_delivered == id {
                g.last_delivered = previous;
                g.entries_read = g.entries_read.map(|r| r.saturating_sub(1));
            }
        }
        true
    }

    /// Model-only: every delivery in the PEL becomes idle since the epoch.
    /// The checker uses this to say "a long time passes" without keeping an
    /// ever-growing clock in its states.
    pub fn age_all(&mut self) {
        if let Some(g) = self.group.as_mut() {
            for p in g.pel.values_mut() {
                p.delivery_time = Timestamp::ZERO;
            }
            for seen in g.consumers.values_mut() {
                *seen = Timestamp::ZERO;
            }
        }
    }
}

#[cfg(test)]
mod tests;
