//! The stream commands that take several Redis commands: the queue's
//! health, a trim by retention, the consumers' housekeeping script, and
//! a `Locate` (alone, or a sweep's batch of them as one pipeline).

use super::*;

impl RedisStream {
    /// `AutoClaim`: XPENDING IDLE for the first idle entry from `start`,
    /// then XAUTOCLAIM from it; nothing idle, no XAUTOCLAIM, and the scan
    /// is over.
    pub(super) async fn autoclaim(
        &self,
        key: &str,
        consumer: &str,
        min_idle_ms: u64,
        start: EntryId,
        count: usize,
    ) -> Result<StreamResult, Unavailable> {
        let group = &self.names.group;
        let mut first = redis::cmd("XPENDING");
        first
            .arg(key)
            .arg(group)
            .arg("IDLE")
            .arg(min_idle_ms)
            .arg(start.local().to_string())
            .arg("+")
            .arg(1);
        let first = match self.query(&first).await? {
            Ok(Value::Array(rows)) => match rows.first() {
                Some(row) => first_pending_id(row).ok_or(Unavailable)?,
                None => return Ok(Ok(StreamReply::AutoClaimed(AutoClaim::scan_over()))),
            },
            Ok(_) => return Err(Unavailable),
            Err(e) => return Ok(Err(e)),
        };
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(key)
            .arg(group)
            .arg(consumer)
            .arg(min_idle_ms)
            .arg(first.to_string())
            .arg("COUNT")
            .arg(count);
        Ok(self.query(&cmd).await?.map(autoclaim_reply))
    }

    /// `Retain` on `partition`; partition 0's also trims the dead-letter
    /// stream (XTRIM MINID `before`), and the reply counts both.
    pub(super) async fn retain_all(
        &self,
        partition: Partition,
        before: pelican_model::time::Timestamp,
    ) -> Result<StreamResult, Unavailable> {
        let dead = if partition == 0 {
            let mut trim = redis::cmd("XTRIM");
            trim.arg(&self.names.dead)
                .arg("MINID")
                .arg(EntryId::new(before.0, 0).to_string());
            match self.query(&trim).await? {
                Ok(v) => int(&v).unwrap_or(0),
                Err(e) => return Ok(Err(e)),
            }
        } else {
            0
        };
        let jobs = self.on(partition, async |key| self.retain(key, before).await);
        Ok(jobs.await?.map(|r| match r {
            StreamReply::Trimmed(k) => StreamReply::Trimmed(k + dead),
            other => other,
        }))
    }

    /// `Queue`: every partition's reading ([`Self::queue_of`]), merged as
    /// the model merges them.
    pub(super) async fn queue(&self) -> Result<StreamResult, Unavailable> {
        let dead_apart = matches!(self.conn, RedisConn::Cluster(_));
        let dead_letters = if dead_apart {
            let mut dead = redis::cmd("XLEN");
            dead.arg(&self.names.dead);
            Some(
                self.query(&dead)
                    .await?
                    .ok()
                    .as_ref()
                    .and_then(int)
                    .unwrap_or(0),
            )
        } else {
            None
        };
        let mut parts = Vec::with_capacity(self.names.partitions.len());
        for (p, key) in self.names.partitions.iter().enumerate() {
            let p = Partition::try_from(p).expect("partitions fit their type");
            parts.push(self.queue_of(key, dead_letters).await?.in_partition(p));
        }
        Ok(Ok(StreamReply::Queue(QueueState::merge(parts))))
    }

    /// One partition's queue: XLEN of its stream (and of the dead stream,
    /// unless `dead_letters` is read already), XINFO GROUPS, and XPENDING's
    /// summary and oldest row, as one pipeline (one round trip; on a
    /// cluster, where a pipeline stays within one slot, the dead stream's
    /// XLEN is read apart). The reads need no transaction: each figure is a
    /// reading, as a scrape's are.
    pub(super) async fn queue_of(
        &self,
        key: &str,
        dead_letters: Option<u64>,
    ) -> Result<QueueState, Unavailable> {
        let n = &self.names;
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN").arg(key);
        if dead_letters.is_none() {
            pipe.cmd("XLEN").arg(&n.dead);
        }
        pipe.cmd("XINFO").arg("GROUPS").arg(key);
        pipe.cmd("XPENDING").arg(key).arg(&n.group);
        pipe.cmd("XPENDING")
            .arg(key)
            .arg(&n.group)
            .arg("-")
            .arg("+")
            .arg(1);
        let mut replies = self.pipeline(&mut pipe).await?.into_iter().map(answer);
        let mut next = || replies.next().unwrap_or(Err(Unavailable));
        let length = next()?.ok().as_ref().and_then(int).unwrap_or(0);
        let dead_letters = match dead_letters {
            Some(n) => n,
            None => next()?.ok().as_ref().and_then(int).unwrap_or(0),
        };
        let info = match next()? {
            Ok(Value::Array(groups)) => groups
                .iter()
                .filter_map(fields)
                .find(|f| field(f, "name").as_deref() == Some(n.group.as_str())),
            _ => None,
        };
        let summary = next()?;
        let oldest = next()?;
        let Some(info) = info else {
            return Ok(QueueState {
                length,
                dead_letters,
                group: None,
            });
        };
        let (pending, consumers) = pending_summary(&summary);
        let oldest = oldest_pending(&oldest);
        Ok(QueueState {
            length,
            dead_letters,
            group: Some(GroupState {
                lag: field(&info, "lag").and_then(|v| v.parse().ok()),
                pending,
                oldest_pending: oldest.as_ref().and_then(|o| o.0),
                oldest_idle_ms: oldest.and_then(|o| o.1),
                consumers,
            }),
        })
    }

    /// Our group's row of XINFO GROUPS on `key`, as (field, value) texts;
    /// `None` without the key or the group.
    pub(crate) async fn group_info(
        &self,
        key: &str,
    ) -> Result<Option<Vec<(String, String)>>, Unavailable> {
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(key);
        Ok(match self.query(&info).await? {
            Ok(Value::Array(groups)) => groups
                .iter()
                .filter_map(fields)
                .find(|f| field(f, "name").as_deref() == Some(self.names.group.as_str())),
            _ => None,
        })
    }

    /// The group's last delivered ID on `key` (XINFO GROUPS), if the group
    /// exists.
    pub(super) async fn last_delivered(&self, key: &str) -> Result<Option<EntryId>, Unavailable> {
        Ok(self
            .group_info(key)
            .await?
            .and_then(|f| field(&f, "last-delivered-id"))
            .and_then(|s| s.parse::<EntryId>().ok()))
    }

    /// `Retain`: XPENDING (summary) and XINFO GROUPS give the oldest
    /// pending and the last delivered ID; XTRIM MINID removes what is older
    /// than all three bounds. New pending entries can only come from IDs
    /// above the last delivered one, so the two reads and the trim need no
    /// transaction.
    pub(super) async fn retain(
        &self,
        key: &str,
        before: pelican_model::time::Timestamp,
    ) -> Result<StreamResult, Unavailable> {
        let n = &self.names;
        let mut summary = redis::cmd("XPENDING");
        summary.arg(key).arg(&n.group);
        let oldest = match self.query(&summary).await? {
            Ok(Value::Array(parts)) => parts
                .get(1)
                .and_then(text)
                .and_then(|s| s.parse::<EntryId>().ok()),
            Ok(_) => None,
            // Nothing is trimmed without the group.
            Err(StreamError::NoGroup | StreamError::NoKey) => {
                return Ok(Ok(StreamReply::Trimmed(0)));
            }
            Err(e) => return Ok(Err(e)),
        };
        let Some(last) = self.last_delivered(key).await? else {
            return Ok(Ok(StreamReply::Trimmed(0)));
        };
        let cutoff = pelican_model::world::retention_cutoff(before, oldest, last);
        let mut trim = redis::cmd("XTRIM");
        trim.arg(key).arg("MINID").arg(cutoff.to_string());
        Ok(self
            .query(&trim)
            .await?
            .map(|v| StreamReply::Trimmed(int(&v).unwrap_or(0))))
    }

    /// `ForgetConsumers` (or its mutant twin): `script` on `key`, one
    /// atomic step.
    pub(super) async fn forget(
        &self,
        script: &str,
        key: &str,
        idle_ms: u64,
    ) -> Result<StreamResult, Unavailable> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(script)
            .arg(1)
            .arg(key)
            .arg(&self.names.group)
            .arg(idle_ms);
        Ok(self
            .query(&eval)
            .await?
            .map(|v| StreamReply::Forgot(int(&v).unwrap_or(0))))
    }

    /// `Locate`: XRANGE id id, XPENDING id id 1, XINFO GROUPS (read-only).
    pub(super) async fn locate(&self, key: &str, id: EntryId) -> Result<StreamResult, Unavailable> {
        let n = &self.names;
        let at = id.to_string();
        let mut range = redis::cmd("XRANGE");
        range.arg(key).arg(&at).arg(&at).arg("COUNT").arg(1);
        let entry = match self.query(&range).await? {
            Ok(Value::Array(items)) => items.first().map(|e| decode_entry(e).1),
            _ => None,
        };
        let mut pending = redis::cmd("XPENDING");
        pending.arg(key).arg(&n.group).arg(&at).arg(&at).arg(1);
        let pending = matches!(self.query(&pending).await?, Ok(Value::Array(a)) if !a.is_empty());
        let delivered = self
            .last_delivered(key)
            .await?
            .is_some_and(|last| id <= last);
        Ok(Ok(StreamReply::Located {
            entry,
            pending,
            delivered,
        }))
    }

    /// A sweep's `Locate`s, one pipeline a partition: each ID's XRANGE and
    /// XPENDING, then the group's XINFO GROUPS once, after all of them (as
    /// [`Self::locate`] reads it after its own two). A thousand candidates
    /// cost one round trip a partition, not three thousand.
    pub(super) async fn locate_many(
        &self,
        ids: &[EntryId],
    ) -> Result<Vec<StreamResult>, Unavailable> {
        let mut parts: Vec<Partition> = ids.iter().map(|id| id.partition).collect();
        parts.sort_unstable();
        parts.dedup();
        let sent = futures_util::future::join_all(parts.iter().map(|&p| async move {
            let Some(key) = self.names.key(p) else {
                return Ok(None);
            };
            let mut pipe = redis::pipe();
            for id in ids.iter().filter(|id| id.partition == p) {
                let at = id.local().to_string();
                pipe.cmd("XRANGE")
                    .arg(key)
                    .arg(&at)
                    .arg(&at)
                    .arg("COUNT")
                    .arg(1);
                pipe.cmd("XPENDING")
                    .arg(key)
                    .arg(&self.names.group)
                    .arg(&at)
                    .arg(&at)
                    .arg(1);
            }
            pipe.cmd("XINFO").arg("GROUPS").arg(key);
            self.pipeline(&mut pipe).await.map(Some)
        }))
        .await;
        let mut out: Vec<Option<StreamResult>> = vec![None; ids.len()];
        for (&p, replies) in parts.iter().zip(sent) {
            let members: Vec<usize> = (0..ids.len()).filter(|&i| ids[i].partition == p).collect();
            let Some(mut replies) = replies? else {
                for i in members {
                    out[i] = Some(Err(StreamError::NoGroup));
                }
                continue;
            };
            if replies.len() != 2 * members.len() + 1 {
                return Err(Unavailable);
            }
            let info = replies.pop().expect("counted");
            let last = match answer(info)? {
                Ok(Value::Array(groups)) => groups
                    .iter()
                    .filter_map(fields)
                    .find(|f| field(f, "name").as_deref() == Some(self.names.group.as_str()))
                    .and_then(|f| field(&f, "last-delivered-id"))
                    .and_then(|s| s.parse::<EntryId>().ok()),
                _ => None,
            };
            let mut replies = replies.into_iter();
            for i in members {
                let (range, pending) = (replies.next(), replies.next());
                let entry = match range.map(answer).transpose()? {
                    Some(Ok(Value::Array(items))) => items.first().map(|e| decode_entry(e).1),
                    _ => None,
                };
                let pending = matches!(
                    pending.map(answer).transpose()?,
                    Some(Ok(Value::Array(a))) if !a.is_empty()
                );
                let delivered = last.is_some_and(|last| ids[i].local() <= last);
                let located = StreamReply::Located {
                    entry,
                    pending,
                    delivered,
                };
                out[i] = Some(Ok(located.in_partition(p)));
            }
        }
        out.into_iter().map(|r| r.ok_or(Unavailable)).collect()
    }
}
