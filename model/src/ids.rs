//! Identifiers: runs, stream entries, fences, dispatches, attempts, workers.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A run: one job a user asked for, from `POST /runs` to its terminal state.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct RunId(pub u64);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run-{}", self.0)
    }
}

/// The fencing token of an attempt. Each new attempt of a run gets a fence
/// greater than every earlier fence of that run (S3); `Fence(0)` means "no
/// attempt yet".
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {}", self.0)
    }
}

/// The publication number of a run. A run is published once per dispatch:
/// at submission, after each scheduled retry and after each recovery. A stream
/// entry carries the dispatch it announces, so an entry whose dispatch is
/// older than the run's is stale and can be acknowledged without work.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Dispatch(pub u32);

impl fmt::Display for Dispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dispatch {}", self.0)
    }
}

/// The 1-based number of an attempt of one run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct AttemptNo(pub u32);

impl fmt::Display for AttemptNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {}", self.0)
    }
}

/// A worker process, and so a consumer of the group. Its consumer name is
/// [`WorkerId::consumer`].
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// The consumer name this worker uses in the consumer group.
    #[must_use]
    pub fn consumer(self) -> String {
        format!("w{}", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// A job stream partition: one of the `--partitions` stream keys, each
/// with its own consumer group. Partition 0 is the only one by default.
pub type Partition = u16;

/// The partition at `index` of a list of every partition.
///
/// # Panics
/// Past the partitions' type (more than 65,536 of them).
#[must_use]
pub fn partition_at(index: usize) -> Partition {
    Partition::try_from(index).expect("partitions fit their type")
}

/// A stream entry's address: the partition whose stream holds it and its
/// ID there, `<ms>-<seq>`. IDs are ordered as Redis orders them within a
/// partition (and by partition first, which no Redis command compares).
///
/// Written `<ms>-<seq>` in partition 0 (as Redis writes IDs, and as rows
/// from before partitions hold them) and `<partition>:<ms>-<seq>` in the
/// others: one text per address, so Postgres compares them as the model does.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct EntryId {
    /// The partition (0 when there is one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub partition: Partition,
    /// Milliseconds part.
    pub ms: u64,
    /// Sequence part.
    pub seq: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(p: &Partition) -> bool {
    *p == 0
}

impl EntryId {
    /// `0-0`, the smallest ID; Redis uses it as "no ID" in several replies.
    pub const ZERO: EntryId = EntryId::new(0, 0);
    /// The largest ID.
    pub const MAX: EntryId = EntryId::new(u64::MAX, u64::MAX);

    /// An ID of partition 0 from its two parts.
    #[must_use]
    pub const fn new(ms: u64, seq: u64) -> EntryId {
        EntryId {
            partition: 0,
            ms,
            seq,
        }
    }

    /// The same ID in partition `partition`.
    #[must_use]
    pub const fn in_partition(self, partition: Partition) -> EntryId {
        EntryId { partition, ..self }
    }

    /// The ID within its stream, as Redis knows it (partition 0's form).
    #[must_use]
    pub const fn local(self) -> EntryId {
        self.in_partition(0)
    }

    /// The next ID after `self` in its partition (used for exclusive
    /// ranges), or `None` at the end.
    #[must_use]
    pub fn successor(self) -> Option<EntryId> {
        let next = if self.seq < u64::MAX {
            EntryId::new(self.ms, self.seq + 1)
        } else if self.ms < u64::MAX {
            EntryId::new(self.ms + 1, 0)
        } else {
            return None;
        };
        Some(next.in_partition(self.partition))
    }
}

impl fmt::Display for EntryId {
    /// `[partition:]ms-seq`, written into one buffer and handed over at
    /// once: a worker formats each delivery's ID twice (its statements'
    /// parameter, its XACK), and `write!` of its parts cost each delivery
    /// 700 instructions more than this (`xtask/worker-instructions.sh`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // "65535:" and two u64s of 20 digits around a '-'.
        let mut buf = [0_u8; 6 + 20 + 1 + 20];
        let end = buf.len();
        let mut at = digits(&mut buf, end, self.seq);
        at -= 1;
        buf[at] = b'-';
        at = digits(&mut buf, at, self.ms);
        if self.partition != 0 {
            at -= 1;
            buf[at] = b':';
            at = digits(&mut buf, at, u64::from(self.partition));
        }
        f.pad(std::str::from_utf8(&buf[at..]).map_err(|_| fmt::Error)?)
    }
}

/// Writes `n`'s decimal digits into `buf`, ending before `end`; answers
/// where they begin.
fn digits(buf: &mut [u8], end: usize, mut n: u64) -> usize {
    let mut at = end;
    loop {
        at -= 1;
        buf[at] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            return at;
        }
    }
}

/// Why a string is not a stream entry ID.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid stream ID {0:?}: expected <ms>-<seq> with two unsigned integers, \
     after <partition>: outside partition 0"
)]
pub struct ParseEntryIdError(pub String);

impl FromStr for EntryId {
    type Err = ParseEntryIdError;

    /// Parses the strict `<ms>-<seq>` form Redis replies with (a bare `<ms>`
    /// means `<ms>-0`, as Redis accepts in commands), after `<partition>:`
    /// for partitions other than 0 (never `0:`: one text per address).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseEntryIdError(s.to_owned());
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let (partition, id) = match s.split_once(':') {
            Some((p, id)) if digits(p) => match p.parse::<Partition>() {
                Ok(p) if p > 0 => (p, id),
                _ => return Err(err()),
            },
            Some(_) => return Err(err()),
            None => (0, s),
        };
        let (ms, seq) = match id.split_once('-') {
            Some((ms, seq)) => (ms, seq),
            None => (id, "0"),
        };
        if !digits(ms) || !digits(seq) {
            return Err(err());
        }
        Ok(EntryId::new(
            ms.parse().map_err(|_| err())?,
            seq.parse().map_err(|_| err())?,
        )
        .in_partition(partition))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_order_and_print() {
        let a: EntryId = "5-1".parse().unwrap();
        assert_eq!(a, EntryId::new(5, 1));
        assert_eq!("7".parse::<EntryId>().unwrap(), EntryId::new(7, 0));
        assert!(EntryId::new(5, 2) > a && EntryId::new(6, 0) > EntryId::new(5, u64::MAX));
        assert_eq!(a.to_string(), "5-1");
        for bad in ["", "-", "1-", "-1", "a-1", "1-2-3", "1--2", "+1-2"] {
            assert!(bad.parse::<EntryId>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            EntryId::new(1, u64::MAX).successor(),
            Some(EntryId::new(2, 0))
        );
        assert_eq!(EntryId::MAX.successor(), None);
        let b: EntryId = "3:5-1".parse().unwrap();
        assert_eq!(b, a.in_partition(3));
        assert_eq!(b.to_string(), "3:5-1");
        assert_eq!(b.local(), a);
        assert_eq!(
            b.successor(),
            Some(EntryId::new(5, 2).in_partition(3)),
            "a successor stays in its partition"
        );
        for bad in ["0:5-1", ":5-1", "x:5-1", "1:", "1:2:3-4", "70000:1-0"] {
            assert!(bad.parse::<EntryId>().is_err(), "{bad:?} parsed");
        }
    }

    /// The hand-written formatting prints what `write!` of the parts would,
    /// at the edges of each part, and honours a width.
    #[test]
    fn entry_ids_print_as_their_parts() {
        let parts = [
            0,
            1,
            9,
            10,
            99,
            100,
            1_700_000_000_123,
            u64::MAX - 1,
            u64::MAX,
        ];
        for ms in parts {
            for seq in parts {
                for partition in [0, 1, 10, Partition::MAX] {
                    let id = EntryId::new(ms, seq).in_partition(partition);
                    let want = if partition == 0 {
                        format!("{ms}-{seq}")
                    } else {
                        format!("{partition}:{ms}-{seq}")
                    };
                    assert_eq!(id.to_string(), want);
                    assert_eq!(id.to_string().parse::<EntryId>(), Ok(id));
                }
            }
        }
        assert_eq!(
            format!("{:>6}|{:<6}|", EntryId::new(5, 1), EntryId::ZERO),
            "   5-1|0-0   |"
        );
    }
}
