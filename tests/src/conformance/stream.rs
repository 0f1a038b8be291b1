//! Stream conformance: random sequences of the [`StreamOp`]s the worker
//! sends, through the worker's own [`RedisStream`], against the model's
//! [`Redis`], op by op. Between them, faults the nemesis also injects:
//! an entry deleted (trimmed, as far as the group can tell) and Redis
//! wiped.
//!
//! Two partitions: the commands that name one run on either, and IDs keep
//! theirs (an XACK names the IDs of its first ID's partition).
//!
//! IDs: a publish runs on Redis first, and the model adds its entry at the
//! millisecond Redis chose, so both sides hold the same IDs. Idle times:
//! the model reads the wall clock Redis also runs on, and every idle
//! threshold is 0 or far above what a sequence can create.

use super::{Outcome, runner};
use pelican_model::ids::{Dispatch, EntryId, Partition, RunId};
use pelican_model::protocol::{DeadEntry, JobEntry, QueueState, StreamOp, StreamReply};
use pelican_model::status::ErrorClass;
use pelican_model::time::Timestamp;
use pelican_model::world::Redis;
use pelican_real::live::{RedisAddr, RedisStream, StreamNames};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The only non-zero idle threshold: far above any idle time a sequence
/// creates.
const THRESHOLD_MS: u64 = 500_000;

/// One step of a stream sequence. Entries are named by their index among
/// the job entries published so far; an index past them names an ID that
/// never existed.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub enum Step {
    Publish {
        partition: Partition,
        run: u64,
        dispatch: u32,
        malformed: bool,
    },
    PublishDead {
        run: u64,
    },
    EnsureGroup {
        partition: Partition,
    },
    Read {
        partition: Partition,
        consumer: u8,
        count: usize,
    },
    Ack {
        entries: Vec<usize>,
    },
    AutoClaim {
        partition: Partition,
        consumer: u8,
        long_idle: bool,
        start: usize,
        count: usize,
    },
    Touch {
        consumer: u8,
        entry: usize,
    },
    Locate {
        entry: usize,
    },
    Retain {
        partition: Partition,
        entry: usize,
        after: bool,
    },
    Queue,
    ForgetConsumers {
        partition: Partition,
        long_idle: bool,
    },
    /// Fault: XDEL of one entry.
    Delete {
        entry: usize,
    },
    /// Fault: Redis loses both streams.
    Wipe,
    /// Time passes for one pending entry alone: its holder re-claims it
    /// with `XCLAIM ... IDLE` (JUSTID), idle past the long threshold, so
    /// that a PEL holds idle entries beside fresh ones.
    Age {
        entry: usize,
    },
}

/// The partitions a sequence runs on.
const PARTITIONS: Partition = 2;

fn step() -> impl Strategy<Value = Step> {
    let entry = || 0usize..8;
    let consumer = || 0u8..3;
    let partition = || 0..PARTITIONS;
    prop_oneof![
        4 => (partition(), 1u64..=3, 1u32..=2, prop::bool::weighted(0.1)).prop_map(
            |(partition, run, dispatch, malformed)| Step::Publish { partition, run, dispatch, malformed }
        ),
        1 => (1u64..=3).prop_map(|run| Step::PublishDead { run }),
        1 => partition().prop_map(|partition| Step::EnsureGroup { partition }),
        3 => (partition(), consumer(), 1usize..4)
            .prop_map(|(partition, consumer, count)| Step::Read { partition, consumer, count }),
        2 => prop::collection::vec(entry(), 1..3).prop_map(|entries| Step::Ack { entries }),
        2 => (partition(), consumer(), any::<bool>(), entry(), 1usize..4).prop_map(
            |(partition, consumer, long_idle, start, count)| Step::AutoClaim {
                partition, consumer, long_idle, start, count
            }
        ),
        1 => (consumer(), entry()).prop_map(|(consumer, entry)| Step::Touch { consumer, entry }),
        1 => entry().prop_map(|entry| Step::Locate { entry }),
        1 => (partition(), entry(), any::<bool>())
            .prop_map(|(partition, entry, after)| Step::Retain { partition, entry, after }),
        1 => Just(Step::Queue),
        1 => (partition(), any::<bool>())
            .prop_map(|(partition, long_idle)| Step::ForgetConsumers { partition, long_idle }),
        2 => entry().prop_map(|entry| Step::Delete { entry }),
        1 => Just(Step::Wipe),
        3 => entry().prop_map(|entry| Step::Age { entry }),
    ]
}

/// A random stream sequence. It starts by creating the groups most of the
/// time, as a worker does, and then, half of those times, with a busy
/// worker's PEL: three entries published to each partition and read, so
/// that reclaims, acks, trims and ages find pending entries to act on.
pub fn stream_sequence() -> impl Strategy<Value = Vec<Step>> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(step(), 1..25),
    )
        .prop_map(|(create, busy, steps)| {
            let mut start = Vec::new();
            if create {
                start.extend((0..PARTITIONS).map(|partition| Step::EnsureGroup { partition }));
            }
            if create && busy {
                for partition in 0..PARTITIONS {
                    for run in 1..=3 {
                        start.push(Step::Publish {
                            partition,
                            run,
                            dispatch: 1,
                            malformed: false,
                        });
                    }
                    start.push(Step::Read {
                        partition,
                        consumer: 0,
                        count: 3,
                    });
                }
            }
            start.extend(steps);
            start
        })
}

fn wall_clock() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Timestamp(ms)
}

/// Idle times are read off two clocks (the model's sender's, Redis's own)
/// a few milliseconds apart: Redis's answer takes the model's idle time
/// when the two are within [`IDLE_SLACK_MS`]. For the same reason, of two
/// partitions whose oldest deliveries are idle within the slack of each
/// other, the two sides may name different ones the oldest over all:
/// Redis's takes the model's when the model's own reading of that
/// partition (`parts`) names it, idle within the slack.
fn same_idle(
    want: &Result<StreamReply, pelican_model::stream::StreamError>,
    mut got: Result<StreamReply, pelican_model::stream::StreamError>,
    parts: &[QueueState],
) -> Result<StreamReply, pelican_model::stream::StreamError> {
    if let (Ok(StreamReply::Queue(w)), Ok(StreamReply::Queue(g))) = (want, &mut got)
        && let (Some(w), Some(g)) = (&w.group, &mut g.group)
        && let (Some(a), Some(b)) = (w.oldest_idle_ms, g.oldest_idle_ms)
        && a.abs_diff(b) <= IDLE_SLACK_MS
    {
        let tied = parts.iter().filter_map(|p| p.group.as_ref()).any(|p| {
            p.oldest_pending == g.oldest_pending
                && p.oldest_idle_ms
                    .is_some_and(|c| a.abs_diff(c) <= IDLE_SLACK_MS)
        });
        if tied {
            g.oldest_pending = w.oldest_pending;
        }
        g.oldest_idle_ms = Some(a);
    }
    got
}

/// How far the two sides' idle times may differ.
const IDLE_SLACK_MS: u64 = 1_000;

/// Both sides of one sequence.
struct Sides<'a> {
    live: &'a RedisStream,
    raw: &'a mut redis::Connection,
    model: Redis,
    /// The job entries published, in order (the same IDs on both sides).
    ids: Vec<EntryId>,
}

impl Sides<'_> {
    fn id(&self, entry: usize) -> EntryId {
        self.ids.get(entry).copied().unwrap_or(EntryId::new(1, 0))
    }

    fn op(&self, step: &Step, now: Timestamp) -> Option<StreamOp> {
        let consumer = |c: &u8| format!("c{c}");
        Some(match step {
            Step::Publish {
                partition,
                run,
                dispatch,
                malformed,
            } => StreamOp::Publish {
                partition: *partition,
                entry: if *malformed {
                    // What the binding decodes a `malformed` field to.
                    JobEntry::Malformed {
                        reason: "unexpected field \"malformed\"".into(),
                    }
                } else {
                    JobEntry::Job {
                        run: RunId(*run),
                        dispatch: Dispatch(*dispatch),
                    }
                },
                now,
            },
            Step::PublishDead { run } => StreamOp::PublishDead {
                entry: DeadEntry::Run {
                    run: RunId(*run),
                    source: self.id(0),
                    class: ErrorClass::Exhausted,
                },
                now,
            },
            Step::EnsureGroup { partition } => StreamOp::EnsureGroup {
                partition: *partition,
            },
            Step::Read {
                partition,
                consumer: c,
                count,
            } => StreamOp::Read {
                partition: *partition,
                consumer: consumer(c),
                count: *count,
                now,
            },
            Step::Ack { entries } => {
                let ids: Vec<EntryId> = entries.iter().map(|e| self.id(*e)).collect();
                let partition = ids[0].partition;
                StreamOp::Ack {
                    ids: ids
                        .into_iter()
                        .filter(|id| id.partition == partition)
                        .collect(),
                }
            }
            Step::AutoClaim {
                partition,
                consumer: c,
                long_idle,
                start,
                count,
            } => StreamOp::AutoClaim {
                consumer: consumer(c),
                min_idle_ms: if *long_idle { THRESHOLD_MS } else { 0 },
                start: if *start == 0 {
                    EntryId::ZERO
                } else {
                    self.id(*start)
                }
                .in_partition(*partition),
                count: *count,
                now,
            },
            Step::Touch { consumer: c, entry } => StreamOp::Touch {
                consumer: consumer(c),
                id: self.id(*entry),
                now,
            },
            Step::Locate { entry } => StreamOp::Locate {
                id: self.id(*entry),
            },
            Step::Retain {
                partition,
                entry,
                after,
            } => StreamOp::Retain {
                partition: *partition,
                before: Timestamp(self.id(*entry).ms + u64::from(*after)),
            },
            Step::Queue => StreamOp::Queue { now },
            Step::ForgetConsumers {
                partition,
                long_idle,
            } => StreamOp::ForgetConsumers {
                partition: *partition,
                idle_ms: if *long_idle { THRESHOLD_MS } else { 0 },
                now,
            },
            Step::Delete { .. } | Step::Wipe | Step::Age { .. } => return None,
        })
    }

    /// Runs one step on both sides; `Err` says how they differ.
    async fn step(&mut self, step: &Step) -> Result<(), String> {
        let Some(op) = self.op(step, wall_clock()) else {
            return self.fault(step);
        };
        let got = self
            .live
            .execute(op.clone())
            .await
            .map_err(|e| format!("{op:?}: Redis did not answer: {e}"))?;
        // The model adds a published entry at the millisecond Redis chose.
        let op = match (&op, &got) {
            (
                StreamOp::Publish {
                    partition, entry, ..
                },
                Ok(StreamReply::Added(id)),
            ) => {
                self.ids.push(*id);
                StreamOp::Publish {
                    partition: *partition,
                    entry: entry.clone(),
                    now: Timestamp(id.ms),
                }
            }
            (StreamOp::PublishDead { entry, .. }, Ok(StreamReply::Added(id))) => {
                StreamOp::PublishDead {
                    entry: entry.clone(),
                    now: Timestamp(id.ms),
                }
            }
            _ => op,
        };
        let want = self.model.execute(&op);
        let parts: Vec<QueueState> = match op {
            StreamOp::Queue { now } => self.model.queue_parts(now).collect(),
            _ => Vec::new(),
        };
        let got = same_idle(&want, got, &parts);
        if want != got {
            return Err(format!("{op:?}: model {want:?}, Redis {got:?}"));
        }
        Ok(())
    }

    fn fault(&mut self, step: &Step) -> Result<(), String> {
        let names = self.live.names().clone();
        match step {
            Step::Delete { entry } => {
                let id = self.id(*entry);
                self.model.part_mut(id.partition).xdel(&[id.local()]);
                redis::cmd("XDEL")
                    .arg(
                        names
                            .key(id.partition)
                            .expect("a partition of the sequence"),
                    )
                    .arg(id.local().to_string())
                    .query::<u64>(self.raw)
                    .map_err(|e| format!("XDEL: {e}"))?;
            }
            Step::Wipe => {
                self.model = Redis::partitioned(PARTITIONS);
                redis::cmd("DEL")
                    .arg(&names.partitions)
                    .arg(&names.dead)
                    .query::<u64>(self.raw)
                    .map_err(|e| format!("DEL: {e}"))?;
            }
            Step::Age { entry } => {
                let id = self.id(*entry);
                let part = self.model.part_mut(id.partition);
                let Some(holder) = part.pending(id.local()).map(|p| p.consumer.clone()) else {
                    return Ok(());
                };
                part.xclaim(
                    &holder,
                    0,
                    &[id.local()],
                    Some(THRESHOLD_MS),
                    true,
                    wall_clock(),
                )
                .map_err(|e| format!("the model's XCLAIM: {e:?}"))?;
                redis::cmd("XCLAIM")
                    .arg(
                        names
                            .key(id.partition)
                            .expect("a partition of the sequence"),
                    )
                    .arg(&names.group)
                    .arg(&holder)
                    .arg(0)
                    .arg(id.local().to_string())
                    .arg("IDLE")
                    .arg(THRESHOLD_MS)
                    .arg("JUSTID")
                    .query::<redis::Value>(self.raw)
                    .map_err(|e| format!("XCLAIM: {e}"))?;
            }
            other => unreachable!("{other:?} is not a fault"),
        }
        Ok(())
    }

    /// Every known entry, and one that never existed, located on both
    /// sides: the entry, whether pending, whether delivered. The locates
    /// read only, so they go out together, pipelined on the multiplexed
    /// connection: one at a time, their round trips were most of the suite.
    /// They go again as one batch (the sweeper's pipeline), which must
    /// answer the same.
    async fn compare_state(&mut self) -> Result<(), String> {
        use pelican_real::StreamClient;
        let ops: Vec<StreamOp> = (0..=self.ids.len())
            .map(|entry| StreamOp::Locate { id: self.id(entry) })
            .collect();
        let live = self.live;
        let answers =
            futures_util::future::join_all(ops.iter().map(|op| live.execute(op.clone()))).await;
        let batched = live
            .call_batch(ops.clone())
            .await
            .map_err(|e| format!("the locates as one batch: {e}"))?;
        for ((op, got), in_batch) in ops.iter().zip(answers).zip(batched) {
            let got = got.map_err(|e| format!("{op:?}: {e}"))?;
            let want = self.model.execute(op);
            if want != got {
                return Err(format!("then {op:?}: model {want:?}, Redis {got:?}"));
            }
            if want != in_batch {
                return Err(format!(
                    "then {op:?} in a batch: model {want:?}, Redis {in_batch:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Runs one stream sequence on the model and on Redis (through `live`,
/// from empty streams; `raw` deletes entries and wipes). `Err` names the
/// first difference.
///
/// # Errors
/// The first step whose answer, or the state after it, differs.
pub async fn stream_case(
    live: &RedisStream,
    raw: &mut redis::Connection,
    steps: &[Step],
) -> Result<(), String> {
    let names = live.names().clone();
    redis::cmd("DEL")
        .arg(&names.partitions)
        .arg(&names.dead)
        .query::<u64>(raw)
        .map_err(|e| format!("reset: {e}"))?;
    let mut sides = Sides {
        live,
        raw,
        model: Redis::partitioned(PARTITIONS),
        ids: Vec::new(),
    };
    for (i, step) in steps.iter().enumerate() {
        let at = |e: String| format!("step {} {step:?}: {e}", i + 1);
        sides.step(step).await.map_err(at)?;
        sides.compare_state().await.map_err(at)?;
    }
    Ok(())
}

/// Runs `cases` random stream sequences against Redis at `url`, a server of
/// the suite's own: its clock is set to tick 100 times a second
/// (`CONFIG SET hz`). An `XREADGROUP` that finds nothing returns when its
/// `BLOCK` times out, which Redis checks once a tick: at the default of 10,
/// every empty read took 100 ms, most of the suite's time.
///
/// # Panics
/// When Redis cannot be reached or refuses the setting.
#[must_use]
pub fn run_stream(url: &str, cases: u32, seed: u64) -> Outcome {
    let prefix = crate::unique("conformance");
    let live = crate::rt()
        .block_on(RedisStream::connect(
            &RedisAddr::Server(url.to_owned()),
            StreamNames::partitioned(&prefix, "g", PARTITIONS).expect("a prefix without braces"),
            1,
            Duration::from_secs(5),
        ))
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"));
    let mut raw = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"));
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg(100)
        .query::<()>(&mut raw)
        .unwrap_or_else(|e| panic!("Redis at {url} refuses CONFIG SET hz: {e}"));
    let raw = std::cell::RefCell::new(raw);
    let mut runner = runner(cases, seed);
    let result = runner.run(&stream_sequence(), |steps| {
        crate::rt()
            .block_on(stream_case(&live, &mut raw.borrow_mut(), &steps))
            .map_err(TestCaseError::fail)
    });
    let names = live.names();
    let _: Result<u64, _> = redis::cmd("DEL")
        .arg(&names.partitions)
        .arg(&names.dead)
        .query(&mut *raw.borrow_mut());
    Outcome::of(cases, "commands", result)
}
