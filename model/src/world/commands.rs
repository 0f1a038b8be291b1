//! Every stream command Pelican sends, declared once: its fields (the
//! [`StreamOp`] variant), its name, the sender's clock it carries, the
//! partition it touches, whether it deletes consumers, and its reference
//! semantics on the model's [`Redis`] (the twin the binding on Redis
//! follows, and the conformance suite compares with it). Everything else
//! follows from the table: [`StreamOp::name`], [`StreamOp::clock`],
//! [`StreamOp::clock_mut`], [`StreamOp::partition`],
//! [`StreamOp::forgets_consumers`] and [`Redis::execute`].
//!
//! `jobs` is the job stream of one partition: the one named, or the one of
//! the IDs given (an [`EntryId`] carries its partition). Every command but
//! `Queue` and `PublishDead` touches one partition's key only, as a Redis
//! Cluster requires.

use super::{GROUP, Redis, autoclaim, forget, locate};
use crate::ids::{EntryId, Partition};
use crate::protocol::{DeadEntry, JobEntry, StreamReply};
use crate::stream::{AddId, StreamError};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

macro_rules! stream_commands {
    ($(
        $(#[cfg($cfg:meta)])?
        $(#[doc = $doc:literal])*
        $op:ident { $($(#[$fattr:meta])* $field:ident : $ty:ty),* $(,)? } => {
            name: $name:literal,
            $(clock: $clock:ident,)?
            partition: $part:expr,
            $(forgets: $forgets:ident,)?
            model: |$r:ident| $model:expr $(,)?
        }
    )*) => {
        /// A stream command, executed by [`Redis::execute`] in the model
        /// and by the binding's twin on Redis.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[allow(missing_docs)]
        pub enum StreamOp {
            $(
                $(#[cfg($cfg)])?
                $(#[doc = $doc])*
                $op { $($(#[$fattr])* $field: $ty),* },
            )*
        }

        impl StreamOp {
            /// Its name, in snake case: for logs, metrics and timelines.
            #[must_use]
            pub const fn name(&self) -> &'static str {
                match self { $($(#[cfg($cfg)])? StreamOp::$op { .. } => $name,)* }
            }

            /// The time the model's Redis reads for this command: the
            /// sender's clock, which real Redis ignores (it stamps IDs,
            /// delivery times and idle times with its own).
            /// [`World::stream`](super::World::stream) replaces it with the
            /// server's.
            #[must_use]
            #[allow(unused_variables)]
            pub fn clock(&self) -> Option<Timestamp> {
                match self {
                    $($(#[cfg($cfg)])? StreamOp::$op { $($field),* } => {
                        let clock: Option<Timestamp> = None;
                        $(let clock = Some(*$clock);)?
                        clock
                    })*
                }
            }

            /// [`StreamOp::clock`], to change.
            #[allow(unused_variables)]
            pub fn clock_mut(&mut self) -> Option<&mut Timestamp> {
                match self {
                    $($(#[cfg($cfg)])? StreamOp::$op { $($field),* } => {
                        let clock: Option<&mut Timestamp> = None;
                        $(let clock = Some($clock);)?
                        clock
                    })*
                }
            }

            /// The partition whose job stream this command touches; `None`
            /// for `Queue` (all of them) and `PublishDead` (the dead-letter
            /// stream).
            #[must_use]
            #[allow(unused_variables)]
            pub fn partition(&self) -> Option<Partition> {
                match self {
                    $($(#[cfg($cfg)])? StreamOp::$op { $($field),* } => $part,)*
                }
            }

            /// The partition whose consumers this command deletes, if it is
            /// one that does.
            #[must_use]
            #[allow(unused_variables)]
            pub fn forgets_consumers(&self) -> Option<Partition> {
                match self {
                    $($(#[cfg($cfg)])? StreamOp::$op { .. } => {
                        let forgets: Option<Partition> = None;
                        $(let forgets = { let _ = stringify!($forgets); self.partition() };)?
                        forgets
                    })*
                }
            }
        }

        impl Redis {
            /// Executes one stream command against the reference streams:
            /// on the stream of its partition, with IDs as Redis knows them
            /// (without partition), and the reply's IDs put back in the
            /// partition.
            ///
            /// # Errors
            /// As Redis answers: no such group, a malformed ID, ...
            #[allow(unused_variables)]
            pub fn execute(&mut self, op: &StreamOp) -> Result<StreamReply, StreamError> {
                match op {
                    $($(#[cfg($cfg)])? StreamOp::$op { $($field),* } => {
                        let $r = &mut *self;
                        $model
                    })*
                }
            }
        }
    };
}

stream_commands! {
    /// XADD jobs * run_id .. dispatch ..
    Publish {
        #[serde(default)]
        partition: Partition,
        entry: JobEntry,
        now: Timestamp,
    } => {
        name: "publish",
        clock: now,
        partition: Some(*partition),
        model: |r| r.on(*partition, |jobs| {
            jobs.xadd(AddId::Auto, entry.clone(), *now).map(StreamReply::Added)
        }),
    }

    /// XADD jobs:dead * ...
    PublishDead { entry: DeadEntry, now: Timestamp } => {
        name: "publish_dead",
        clock: now,
        partition: None,
        model: |r| r.dead.xadd(AddId::Auto, entry.clone(), *now).map(StreamReply::Added),
    }

    /// XGROUP CREATE jobs group 0 MKSTREAM (BUSYGROUP counts as success).
    EnsureGroup {
        #[serde(default)]
        partition: Partition,
    } => {
        name: "ensure_group",
        partition: Some(*partition),
        model: |r| r.on(*partition, |jobs| {
            match jobs.xgroup_create(GROUP, Some(EntryId::ZERO), true) {
                Ok(()) | Err(StreamError::BusyGroup) => Ok(StreamReply::GroupReady),
                Err(e) => Err(e),
            }
        }),
    }

    /// XREADGROUP GROUP group consumer COUNT n STREAMS jobs >
    Read {
        #[serde(default)]
        partition: Partition,
        consumer: String,
        count: usize,
        now: Timestamp,
    } => {
        name: "read",
        clock: now,
        partition: Some(*partition),
        model: |r| r.on(*partition, |jobs| {
            jobs.xreadgroup(consumer, *count, *now).map(StreamReply::Entries)
        }),
    }

    /// XACK jobs group id... (the IDs of one partition)
    Ack { ids: Vec<EntryId> } => {
        name: "ack",
        partition: Some(StreamOp::ack_partition(ids)),
        model: |r| {
            let p = StreamOp::ack_partition(ids);
            debug_assert!(
                ids.iter().all(|id| id.partition == p),
                "one XACK acknowledges IDs of one partition"
            );
            let local: Vec<EntryId> = ids.iter().map(|id| id.local()).collect();
            r.on(p, |jobs| jobs.xack(&local).map(StreamReply::Acked))
        },
    }

    /// XPENDING jobs group IDLE min_idle start + 1, then XAUTOCLAIM jobs
    /// group consumer min_idle first COUNT n from the first idle entry it
    /// named, in `start`'s partition; with nothing idle from `start` on, no
    /// XAUTOCLAIM, and the scan is over (cursor 0-0).
    ///
    /// Why not XAUTOCLAIM alone: Redis 7.0's looks each PEL entry it scans
    /// (up to ten times COUNT) up in the stream before it looks at its idle
    /// time, so a pass over a busy worker's deliveries, none idle, holds
    /// Redis for milliseconds; XPENDING's IDLE filter reads the PEL alone.
    /// The two commands are not atomic. What they do is an XAUTOCLAIM from a
    /// later start than `start`, at the second command's moment: where a
    /// scan starts is the reclaimer's choice, not a guarantee's, and the
    /// entries it passes over are found by a later pass.
    AutoClaim {
        consumer: String,
        min_idle_ms: u64,
        start: EntryId,
        count: usize,
        now: Timestamp,
    } => {
        name: "autoclaim",
        clock: now,
        partition: Some(start.partition),
        model: |r| r.on(start.partition, |jobs| {
            autoclaim(jobs, consumer, *min_idle_ms, *start, *count, *now)
        }),
    }

    /// XCLAIM jobs group consumer 0 id JUSTID: the heartbeat's idle reset.
    Touch {
        consumer: String,
        id: EntryId,
        now: Timestamp,
    } => {
        name: "touch",
        clock: now,
        partition: Some(id.partition),
        model: |r| r.on(id.partition, |jobs| {
            jobs.xclaim(consumer, 0, &[id.local()], None, true, *now)
                .map(|got| StreamReply::Touched(!got.is_empty()))
        }),
    }

    /// XRANGE jobs id id + XPENDING jobs group id id 1 + XINFO GROUPS:
    /// what is at this ID now, is it pending, was it delivered?
    Locate { id: EntryId } => {
        name: "locate",
        partition: Some(id.partition),
        model: |r| r.on(id.partition, |jobs| Ok(locate(jobs, id.local()))),
    }

    /// Retention: XPENDING jobs group (summary) + XINFO GROUPS, then
    /// XTRIM jobs MINID cutoff, where the cutoff is the smallest of
    /// `before` (as an ID), the oldest pending ID and the first undelivered
    /// ID: only delivered, acknowledged entries older than `before` go.
    /// Nothing is trimmed without the group. Partition 0's also trims the
    /// dead-letter stream: XTRIM jobs:dead MINID `before` (its notices are
    /// kept as long as the job streams' entries; Postgres keeps the dead
    /// letters). The reply counts both.
    Retain {
        #[serde(default)]
        partition: Partition,
        before: Timestamp,
    } => {
        name: "retain",
        partition: Some(*partition),
        model: |r| r.retain_all(*partition, *before),
    }

    /// Housekeeping: in one script, XINFO CONSUMERS jobs group, then XGROUP
    /// DELCONSUMER jobs group `name` for each consumer idle at least
    /// `idle_ms` that holds no pending entry (a worker's that stopped, or
    /// restarted under a new id). Deleting a consumer deletes its pending
    /// entries, unacknowledged, so the check and the deletes are one
    /// atomic step; a live worker's consumer so deleted is created again
    /// by its next read or claim. Nothing without the group. The reply
    /// counts the consumers deleted.
    ForgetConsumers {
        #[serde(default)]
        partition: Partition,
        idle_ms: u64,
        now: Timestamp,
    } => {
        name: "forget_consumers",
        clock: now,
        partition: Some(*partition),
        forgets: yes,
        model: |r| r.on(*partition, |jobs| {
            Ok(StreamReply::Forgot(forget(jobs, *idle_ms, *now, false)))
        }),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `ForgetConsumers` (`ForgetHolders`): deletes idle
    /// consumers whatever they hold.
    DropConsumers {
        #[serde(default)]
        partition: Partition,
        idle_ms: u64,
        now: Timestamp,
    } => {
        name: "drop_consumers",
        clock: now,
        partition: Some(*partition),
        forgets: yes,
        model: |r| r.on(*partition, |jobs| {
            Ok(StreamReply::Forgot(forget(jobs, *idle_ms, *now, true)))
        }),
    }

    /// XLEN jobs + XLEN jobs:dead + XINFO GROUPS + XPENDING jobs group
    /// (summary) + XPENDING jobs group - + 1, for every partition: the
    /// queue's health, as `GET /queue`, the metrics and `pelican status`
    /// report it ([`QueueState::merge`](crate::protocol::QueueState::merge)).
    /// Read-only.
    Queue { now: Timestamp } => {
        name: "queue",
        clock: now,
        partition: None,
        model: |r| Ok(StreamReply::Queue(r.queue(*now))),
    }
}

impl StreamOp {
    /// The partition an `Ack` of `ids` goes to: its first ID's (one XACK
    /// acknowledges IDs of one partition).
    #[must_use]
    pub fn ack_partition(ids: &[EntryId]) -> Partition {
        ids.first().map_or(0, |id| id.partition)
    }
}
