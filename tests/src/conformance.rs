//! Differential tests of the reference models against the live servers.
//!
//! The simulator and the model checker are only as true as
//! `pelican_model::Stream` and `pelican_model::Db` are to Redis and
//! Postgres. Here proptest draws random sequences of commands; each
//! sequence runs against the model and against a live server from the same
//! empty state, and every reply, plus the PEL (IDs, consumers, delivery
//! counts) after every stream command and the final rows after every
//! database sequence, must be identical. A failing sequence is shrunk and
//! printed as a numbered list of commands that reproduces it.
//!
//! Idle times: the model's clock stands still during a sequence, Redis's
//! does not; every idle threshold in the generated commands (0 or 500 s) is
//! far from every idle time a sequence can create (a few ms, or the 1000 s
//! that `XCLAIM ... IDLE` sets), and idle times are compared in those two
//! buckets.

use pelican_model::db::Db;
use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
use pelican_model::protocol::DbOp;
use pelican_model::status::ErrorClass;
use pelican_model::stream::{AddId, Stream, StreamError, Trim};
use pelican_model::time::Timestamp;
use pelican_real::live::PgDb;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use redis::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// The model's frozen clock during a stream sequence.
const NOW: Timestamp = Timestamp(10_000_000_000);
/// What `XCLAIM ... IDLE` sets.
const LONG_IDLE_MS: u64 = 1_000_000;
/// The only non-zero idle threshold.
const THRESHOLD_MS: u64 = 500_000;
const GROUP: &str = "g";

/// One stream command of a generated sequence. IDs come from a small grid
/// (`ms` 1..=12, `seq` 0..=1) so that commands hit existing entries often.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub enum SOp {
    Add {
        id: (u64, u64),
    },
    Read {
        consumer: u8,
        count: usize,
    },
    Ack {
        ids: Vec<(u64, u64)>,
    },
    Claim {
        consumer: u8,
        min_idle: bool,
        ids: Vec<(u64, u64)>,
        set_idle: bool,
        justid: bool,
    },
    AutoClaim {
        consumer: u8,
        min_idle: bool,
        start: (u64, u64),
        count: usize,
        justid: bool,
    },
    PendingSummary,
    PendingRange {
        min_idle: Option<bool>,
        start: (u64, u64),
        end: (u64, u64),
        count: usize,
        consumer: Option<u8>,
    },
    Range {
        start: (u64, u64),
        end: (u64, u64),
        count: usize,
    },
    TrimMaxLen {
        keep: u64,
    },
    TrimMinId {
        id: (u64, u64),
    },
    Del {
        ids: Vec<(u64, u64)>,
    },
    InfoGroups,
    GroupCreate {
        from_zero: bool,
        mkstream: bool,
    },
    GroupDestroy,
}

fn eid((ms, seq): (u64, u64)) -> EntryId {
    EntryId::new(ms, seq)
}

fn idle(long: bool) -> u64 {
    if long { THRESHOLD_MS } else { 0 }
}

fn consumer(c: u8) -> String {
    format!("c{c}")
}

fn grid_id() -> impl Strategy<Value = (u64, u64)> {
    (1u64..=12, 0u64..=1)
}

fn sop() -> impl Strategy<Value = SOp> {
    let ids = || prop::collection::vec(grid_id(), 1..4);
    prop_oneof![
        4 => grid_id().prop_map(|id| SOp::Add { id }),
        3 => (0u8..3, 1usize..4).prop_map(|(consumer, count)| SOp::Read { consumer, count }),
        2 => ids().prop_map(|ids| SOp::Ack { ids }),
        2 => (0u8..3, any::<bool>(), ids(), any::<bool>(), any::<bool>()).prop_map(
            |(consumer, min_idle, ids, set_idle, justid)| SOp::Claim { consumer, min_idle, ids, set_idle, justid }
        ),
        2 => (0u8..3, any::<bool>(), grid_id(), 1usize..4, any::<bool>()).prop_map(
            |(consumer, min_idle, start, count, justid)| SOp::AutoClaim { consumer, min_idle, start, count, justid }
        ),
        1 => Just(SOp::PendingSummary),
        1 => (prop::option::of(any::<bool>()), grid_id(), grid_id(), 1usize..5, prop::option::of(0u8..3)).prop_map(
            |(min_idle, start, end, count, consumer)| SOp::PendingRange { min_idle, start, end, count, consumer }
        ),
        1 => (grid_id(), grid_id(), 1usize..5).prop_map(|(start, end, count)| SOp::Range { start, end, count }),
        1 => (0u64..4).prop_map(|keep| SOp::TrimMaxLen { keep }),
        1 => grid_id().prop_map(|id| SOp::TrimMinId { id }),
        1 => ids().prop_map(|ids| SOp::Del { ids }),
        1 => Just(SOp::InfoGroups),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(from_zero, mkstream)| SOp::GroupCreate { from_zero, mkstream }),
        1 => Just(SOp::GroupDestroy),
    ]
}

/// A random stream sequence (it starts by creating the group most of the time).
pub fn stream_sequence() -> impl Strategy<Value = Vec<SOp>> {
    (any::<bool>(), prop::collection::vec(sop(), 1..25)).prop_map(|(create, mut ops)| {
        if create {
            ops.insert(
                0,
                SOp::GroupCreate {
                    from_zero: true,
                    mkstream: true,
                },
            );
        }
        ops
    })
}

/// XINFO GROUPS, one group: name, consumers, pending, last delivered,
/// entries-read, lag.
pub type GroupRow = (String, u64, u64, EntryId, Option<u64>, Option<u64>);

/// A reply, as both sides are reduced to it for comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SReply {
    /// An error, by its code.
    Error(String),
    /// An integer.
    Int(u64),
    /// OK.
    Ok,
    /// IDs with their payloads (`None` for JUSTID).
    Entries(Vec<(EntryId, Option<u64>)>),
    /// XAUTOCLAIM.
    AutoClaim(EntryId, Vec<(EntryId, Option<u64>)>, Vec<EntryId>),
    /// XPENDING summary: count, range, per-consumer counts.
    Summary(u64, Option<(EntryId, EntryId)>, Vec<(String, u64)>),
    /// XPENDING extended: id, consumer, idle bucket (long?), delivery count.
    Rows(Vec<(EntryId, String, bool, u64)>),
    /// XINFO GROUPS: name, consumers, pending, last delivered, entries-read, lag.
    Groups(Vec<GroupRow>),
}

fn code(e: StreamError) -> String {
    match e {
        StreamError::NoGroup => "NOGROUP",
        StreamError::BusyGroup => "BUSYGROUP",
        StreamError::IdTooSmall | StreamError::NoKey => "ERR",
    }
    .to_owned()
}

fn model_apply(s: &mut Stream<u64>, op: &SOp, n: u64) -> SReply {
    let err = |e: StreamError| SReply::Error(code(e));
    let rows = |v: Vec<(EntryId, Option<u64>)>| SReply::Entries(v);
    match op {
        SOp::Add { id } => match s.xadd(AddId::Explicit(eid(*id)), n, NOW) {
            Ok(_) => SReply::Ok,
            Err(e) => err(e),
        },
        SOp::Read { consumer: c, count } => match s.xreadgroup(&consumer(*c), *count, NOW) {
            Ok(v) => rows(v.into_iter().map(|(id, p)| (id, Some(p))).collect()),
            Err(e) => err(e),
        },
        SOp::Ack { ids } => match s.xack(&ids.iter().copied().map(eid).collect::<Vec<_>>()) {
            Ok(n) => SReply::Int(n),
            Err(e) => err(e),
        },
        SOp::Claim {
            consumer: c,
            min_idle,
            ids,
            set_idle,
            justid,
        } => {
            let ids: Vec<EntryId> = ids.iter().copied().map(eid).collect();
            let set = set_idle.then_some(LONG_IDLE_MS);
            match s.xclaim(&consumer(*c), idle(*min_idle), &ids, set, *justid, NOW) {
                Ok(v) => rows(v),
                Err(e) => err(e),
            }
        }
        SOp::AutoClaim {
            consumer: c,
            min_idle,
            start,
            count,
            justid,
        } => {
            match s.xautoclaim(
                &consumer(*c),
                idle(*min_idle),
                eid(*start),
                *count,
                *justid,
                NOW,
            ) {
                Ok(r) => SReply::AutoClaim(r.next, r.claimed, r.deleted),
                Err(e) => err(e),
            }
        }
        SOp::PendingSummary => match s.xpending_summary() {
            Ok(p) => SReply::Summary(p.count, p.range, p.consumers),
            Err(e) => err(e),
        },
        SOp::PendingRange {
            min_idle,
            start,
            end,
            count,
            consumer: c,
        } => {
            let min = min_idle.map(idle);
            let who = c.map(consumer);
            match s.xpending_range(min, eid(*start), eid(*end), *count, who.as_deref(), NOW) {
                Ok(v) => SReply::Rows(
                    v.into_iter()
                        .map(|r| {
                            (
                                r.id,
                                r.consumer,
                                r.idle_ms >= THRESHOLD_MS,
                                r.delivery_count,
                            )
                        })
                        .collect(),
                ),
                Err(e) => err(e),
            }
        }
        SOp::Range { start, end, count } => rows(
            s.xrange(eid(*start), eid(*end), *count)
                .into_iter()
                .map(|(id, p)| (id, Some(p)))
                .collect(),
        ),
        SOp::TrimMaxLen { keep } => SReply::Int(s.xtrim(Trim::MaxLen(*keep))),
        SOp::TrimMinId { id } => SReply::Int(s.xtrim(Trim::MinId(eid(*id)))),
        SOp::Del { ids } => SReply::Int(s.xdel(&ids.iter().copied().map(eid).collect::<Vec<_>>())),
        SOp::InfoGroups => match s.xinfo_groups() {
            Ok(gs) => SReply::Groups(
                gs.into_iter()
                    .map(|g| {
                        (
                            g.name,
                            g.consumers,
                            g.pending,
                            g.last_delivered,
                            g.entries_read,
                            g.lag,
                        )
                    })
                    .collect(),
            ),
            Err(e) => err(e),
        },
        SOp::GroupCreate {
            from_zero,
            mkstream,
        } => match s.xgroup_create(GROUP, from_zero.then_some(EntryId::ZERO), *mkstream) {
            Ok(()) => SReply::Ok,
            Err(e) => err(e),
        },
        SOp::GroupDestroy => match s.xgroup_destroy(GROUP) {
            Ok(n) => SReply::Int(n),
            Err(e) => err(e),
        },
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn id_of(v: &Value) -> EntryId {
    text(v).and_then(|s| s.parse().ok()).unwrap_or(EntryId::MAX)
}

fn int_of(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::Nil => None,
        other => text(other)?.parse().ok(),
    }
}

fn entries(v: &Value) -> Vec<(EntryId, Option<u64>)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .map(|e| match e {
            Value::Array(parts) => {
                let id = id_of(&parts[0]);
                let payload = match parts.get(1) {
                    Some(Value::Array(f)) => f.get(1).and_then(int_of),
                    _ => None,
                };
                (id, payload)
            }
            other => (id_of(other), None),
        })
        .collect()
}

fn kv(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|p| Some((text(&p[0])?, p.get(1)?.clone())))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v.clone())))
            .collect(),
        _ => Vec::new(),
    }
}

fn redis_apply(c: &mut redis::Connection, key: &str, op: &SOp, n: u64) -> SReply {
    let mut cmd;
    match op {
        SOp::Add { id } => {
            cmd = redis::cmd("XADD");
            cmd.arg(key).arg(eid(*id).to_string()).arg("v").arg(n);
        }
        SOp::Read {
            consumer: who,
            count,
        } => {
            cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(GROUP)
                .arg(consumer(*who))
                .arg("COUNT")
                .arg(*count)
                .arg("STREAMS")
                .arg(key)
                .arg(">");
        }
        SOp::Ack { ids } => {
            cmd = redis::cmd("XACK");
            cmd.arg(key).arg(GROUP);
            for id in ids {
                cmd.arg(eid(*id).to_string());
            }
        }
        SOp::Claim {
            consumer: who,
            min_idle,
            ids,
            set_idle,
            justid,
        } => {
            cmd = redis::cmd("XCLAIM");
            cmd.arg(key)
                .arg(GROUP)
                .arg(consumer(*who))
                .arg(idle(*min_idle));
            for id in ids {
                cmd.arg(eid(*id).to_string());
            }
            if *set_idle {
                cmd.arg("IDLE").arg(LONG_IDLE_MS);
            }
            if *justid {
                cmd.arg("JUSTID");
            }
        }
        SOp::AutoClaim {
            consumer: who,
            min_idle,
            start,
            count,
            justid,
        } => {
            cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(key)
                .arg(GROUP)
                .arg(consumer(*who))
                .arg(idle(*min_idle))
                .arg(eid(*start).to_string())
                .arg("COUNT")
                .arg(*count);
            if *justid {
                cmd.arg("JUSTID");
            }
        }
        SOp::PendingSummary => {
            cmd = redis::cmd("XPENDING");
            cmd.arg(key).arg(GROUP);
        }
        SOp::PendingRange {
            min_idle,
            start,
            end,
            count,
            consumer: who,
        } => {
            cmd = redis::cmd("XPENDING");
            cmd.arg(key).arg(GROUP);
            if let Some(m) = min_idle {
                cmd.arg("IDLE").arg(idle(*m));
            }
            cmd.arg(eid(*start).to_string())
                .arg(eid(*end).to_string())
                .arg(*count);
            if let Some(w) = who {
                cmd.arg(consumer(*w));
            }
        }
        SOp::Range { start, end, count } => {
            cmd = redis::cmd("XRANGE");
            cmd.arg(key)
                .arg(eid(*start).to_string())
                .arg(eid(*end).to_string())
                .arg("COUNT")
                .arg(*count);
        }
        SOp::TrimMaxLen { keep } => {
            cmd = redis::cmd("XTRIM");
            cmd.arg(key).arg("MAXLEN").arg(*keep);
        }
        SOp::TrimMinId { id } => {
            cmd = redis::cmd("XTRIM");
            cmd.arg(key).arg("MINID").arg(eid(*id).to_string());
        }
        SOp::Del { ids } => {
            cmd = redis::cmd("XDEL");
            cmd.arg(key);
            for id in ids {
                cmd.arg(eid(*id).to_string());
            }
        }
        SOp::InfoGroups => {
            cmd = redis::cmd("XINFO");
            cmd.arg("GROUPS").arg(key);
        }
        SOp::GroupCreate {
            from_zero,
            mkstream,
        } => {
            cmd = redis::cmd("XGROUP");
            cmd.arg("CREATE")
                .arg(key)
                .arg(GROUP)
                .arg(if *from_zero { "0" } else { "$" });
            if *mkstream {
                cmd.arg("MKSTREAM");
            }
        }
        SOp::GroupDestroy => {
            cmd = redis::cmd("XGROUP");
            cmd.arg("DESTROY").arg(key).arg(GROUP);
        }
    }
    let v: Value = match cmd.query(c) {
        Ok(v) => v,
        Err(e) => {
            let code = e.code().unwrap_or("ERR");
            // Redis answers XINFO on a missing key with a plain ERR.
            return SReply::Error(
                if code == "NOGROUP" || code == "BUSYGROUP" {
                    code
                } else {
                    "ERR"
                }
                .to_owned(),
            );
        }
    };
    match op {
        SOp::Add { .. } | SOp::GroupCreate { .. } => SReply::Ok,
        SOp::Read { .. } => match &v {
            Value::Array(streams) => match streams.first() {
                Some(Value::Array(kv)) => SReply::Entries(entries(&kv[1])),
                _ => SReply::Entries(Vec::new()),
            },
            Value::Map(pairs) => {
                SReply::Entries(pairs.first().map(|(_, e)| entries(e)).unwrap_or_default())
            }
            _ => SReply::Entries(Vec::new()),
        },
        SOp::Ack { .. }
        | SOp::TrimMaxLen { .. }
        | SOp::TrimMinId { .. }
        | SOp::Del { .. }
        | SOp::GroupDestroy => SReply::Int(int_of(&v).unwrap_or(0)),
        SOp::Claim { .. } | SOp::Range { .. } => SReply::Entries(entries(&v)),
        SOp::AutoClaim { .. } => {
            let Value::Array(parts) = &v else {
                return SReply::Error("shape".into());
            };
            let deleted = match parts.get(2) {
                Some(Value::Array(ids)) => ids.iter().map(id_of).collect(),
                _ => Vec::new(),
            };
            SReply::AutoClaim(id_of(&parts[0]), entries(&parts[1]), deleted)
        }
        SOp::PendingSummary => {
            let Value::Array(parts) = &v else {
                return SReply::Error("shape".into());
            };
            let count = int_of(&parts[0]).unwrap_or(0);
            let range = match (&parts[1], &parts[2]) {
                (Value::Nil, _) | (_, Value::Nil) => None,
                (a, b) => Some((id_of(a), id_of(b))),
            };
            let consumers = match parts.get(3) {
                Some(Value::Array(cs)) => cs
                    .iter()
                    .filter_map(|c| match c {
                        Value::Array(p) => Some((text(&p[0])?, int_of(&p[1])?)),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            SReply::Summary(count, range, consumers)
        }
        SOp::PendingRange { .. } => {
            let Value::Array(rows) = &v else {
                return SReply::Rows(Vec::new());
            };
            SReply::Rows(
                rows.iter()
                    .filter_map(|r| match r {
                        Value::Array(p) => Some((
                            id_of(&p[0]),
                            text(&p[1])?,
                            int_of(&p[2])? >= THRESHOLD_MS,
                            int_of(&p[3])?,
                        )),
                        _ => None,
                    })
                    .collect(),
            )
        }
        SOp::InfoGroups => {
            let Value::Array(groups) = &v else {
                return SReply::Groups(Vec::new());
            };
            SReply::Groups(
                groups
                    .iter()
                    .map(|g| {
                        let f = kv(g);
                        let get = |k: &str| {
                            f.iter()
                                .find(|(n, _)| n == k)
                                .map(|(_, v)| v.clone())
                                .unwrap_or(Value::Nil)
                        };
                        (
                            text(&get("name")).unwrap_or_default(),
                            int_of(&get("consumers")).unwrap_or(0),
                            int_of(&get("pending")).unwrap_or(0),
                            id_of(&get("last-delivered-id")),
                            int_of(&get("entries-read")),
                            int_of(&get("lag")),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// The PEL as both sides see it: (id, consumer, delivery count).
fn model_pel(s: &Stream<u64>) -> Vec<(EntryId, String, u64)> {
    s.group
        .as_ref()
        .map(|g| {
            g.pel
                .iter()
                .map(|(id, p)| (*id, p.consumer.clone(), p.delivery_count))
                .collect()
        })
        .unwrap_or_default()
}

fn redis_pel(c: &mut redis::Connection, key: &str) -> Vec<(EntryId, String, u64)> {
    let v: Value = redis::cmd("XPENDING")
        .arg(key)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(1000)
        .query(c)
        .unwrap_or(Value::Nil);
    let Value::Array(rows) = v else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|r| match r {
            Value::Array(p) => Some((id_of(&p[0]), text(&p[1])?, int_of(&p[3])?)),
            _ => None,
        })
        .collect()
}

fn describe_stream(ops: &[SOp]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        let _ = writeln!(out, "  {:>2}. {op:?}", i + 1);
    }
    out
}

/// Runs one stream sequence on the model and on Redis key `key` (deleted
/// first). `Err` names the first difference.
///
/// # Errors
/// The first command whose reply or PEL differs.
pub fn stream_case(c: &mut redis::Connection, key: &str, ops: &[SOp]) -> Result<(), String> {
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query(c)
        .map_err(|e| format!("DEL: {e}"))?;
    let mut model = Stream::<u64>::new();
    for (i, op) in ops.iter().enumerate() {
        let n = i as u64;
        let want = model_apply(&mut model, op, n);
        let got = redis_apply(c, key, op, n);
        if want != got {
            return Err(format!(
                "command {} {op:?}: model {want:?}, Redis {got:?}",
                i + 1
            ));
        }
        let (mp, rp) = (model_pel(&model), redis_pel(c, key));
        if mp != rp {
            return Err(format!(
                "after command {} {op:?}: PEL model {mp:?}, Redis {rp:?}",
                i + 1
            ));
        }
    }
    Ok(())
}

/// What a conformance run found.
#[derive(Debug)]
pub struct Outcome {
    /// Sequences run.
    pub cases: u32,
    /// The shrunk failing sequence, readable, if any.
    pub mismatch: Option<String>,
}

/// Runs `cases` random stream sequences against Redis at `url`.
///
/// # Panics
/// When Redis cannot be reached.
#[must_use]
pub fn run_stream(url: &str, cases: u32, seed: u64) -> Outcome {
    let conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"));
    let conn = std::cell::RefCell::new(conn);
    let key = crate::unique("conformance");
    let mut runner = runner(cases, seed);
    let result = runner.run(&stream_sequence(), |ops| {
        stream_case(&mut conn.borrow_mut(), &key, &ops).map_err(TestCaseError::fail)
    });
    let _: Result<(), _> = redis::cmd("DEL").arg(&key).query(&mut *conn.borrow_mut());
    Outcome {
        cases,
        mismatch: match result {
            Ok(()) => None,
            Err(TestError::Fail(why, ops)) => Some(format!(
                "{why}\nshrunk sequence ({} commands, from an empty key):\n{}",
                ops.len(),
                describe_stream(&ops)
            )),
            Err(TestError::Abort(why)) => Some(format!("aborted: {why}")),
        },
    }
}

fn runner(cases: u32, seed: u64) -> TestRunner {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::ChaCha,
            &seed_bytes,
        ),
    )
}

// ------------------------------------------------------------------ db

fn now(t: u8) -> Timestamp {
    Timestamp(1_000 * u64::from(t) + 1_000)
}

fn class() -> impl Strategy<Value = ErrorClass> {
    prop_oneof![
        Just(ErrorClass::Retryable),
        Just(ErrorClass::Terminal),
        Just(ErrorClass::Panic),
        Just(ErrorClass::Exhausted),
    ]
}

fn dbop() -> impl Strategy<Value = DbOp> {
    let run = (1u64..=4).prop_map(RunId);
    let fence = (0u64..=4).prop_map(Fence);
    let dispatch = (1u32..=3).prop_map(Dispatch);
    let entry = (1u64..=6).prop_map(|ms| EntryId::new(ms, 0));
    let t = (0u8..=12).prop_map(now);
    let msg = prop_oneof![Just("boom".to_owned()), Just("timeout".to_owned())];
    prop_oneof![
        3 => (run.clone(), 1u32..=3).prop_map(|(run, attempts_max)| DbOp::InsertRun {
            run, kind: "noop".into(), input: "{}".into(), attempts_max,
        }),
        2 => (run.clone(), dispatch.clone(), entry.clone(), t.clone()).prop_map(|(run, dispatch, entry, now)| {
            DbOp::MarkPublished { run, dispatch, entry, now }
        }),
        3 => (run.clone(), dispatch.clone(), entry.clone(), 0u8..3, t.clone()).prop_map(
            |(run, dispatch, entry, w, now)| DbOp::Claim {
                run, dispatch, entry, worker: format!("w{w}"), now, lease_ms: 2_000,
            }
        ),
        1 => run.clone().prop_map(|run| DbOp::ReadRun { run }),
        2 => (run.clone(), fence.clone(), t.clone()).prop_map(|(run, fence, now)| DbOp::Heartbeat {
            run, fence, now, lease_ms: 2_000,
        }),
        2 => (run.clone(), fence.clone()).prop_map(|(run, fence)| DbOp::Complete {
            run, fence, result: format!("\"r{}\"", fence.0),
        }),
        1 => (run.clone(), fence.clone(), class(), msg.clone()).prop_map(|(run, fence, class, message)| {
            DbOp::Fail { run, fence, class, message }
        }),
        2 => (run.clone(), fence.clone(), class(), msg.clone(), t.clone()).prop_map(
            |(run, fence, class, message, retry_at)| DbOp::ScheduleRetry { run, fence, class, message, retry_at }
        ),
        1 => (run.clone(), fence.clone(), class(), msg).prop_map(|(run, fence, class, message)| {
            DbOp::DeadLetter { run, fence, class, message }
        }),
        1 => (run.clone(), dispatch.clone(), t.clone()).prop_map(|(run, dispatch, now)| {
            DbOp::DeadLetterExhausted { run, dispatch, now }
        }),
        1 => run.clone().prop_map(|run| DbOp::Cancel { run }),
        1 => (t.clone(), 1usize..4).prop_map(|(now, limit)| DbOp::PromoteRetries { now, limit }),
        1 => (1usize..4).prop_map(|limit| DbOp::Unpublished { limit }),
        1 => (t.clone(), 0u64..=3_000, 1usize..4).prop_map(|(now, grace_ms, limit)| DbOp::OrphanCandidates {
            now, grace_ms, limit,
        }),
        1 => (run.clone(), dispatch, t.clone()).prop_map(|(run, dispatch, now)| DbOp::RequeueRun { run, dispatch, now }),
        1 => (entry, t).prop_map(|(entry, now)| DbOp::RequeueEntry { entry, now }),
        1 => (0u8..3).prop_map(|k| DbOp::ApplyEffect { key: format!("run-1/{k}") }),
        1 => (run.clone(), 1u32..3).prop_map(|(run, extra_attempts)| DbOp::DlqRequeue { run, extra_attempts }),
        1 => run.prop_map(|run| DbOp::ReadAttempts { run }),
        1 => Just(DbOp::CountRuns),
        1 => (1usize..4).prop_map(|limit| DbOp::ListDeadLetters { limit }),
        1 => Just(DbOp::NextRunId),
    ]
}

/// One step of a database sequence: a statement, or a batch the batching
/// driver sends as one statement (claims, or completions, on distinct
/// runs: `CLAIM_MANY`, `COMPLETE_MANY`; reads: `READ_RUN_MANY`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbStep {
    /// One statement.
    One(DbOp),
    /// A batch.
    Batch(Vec<DbOp>),
}

fn batch() -> impl Strategy<Value = DbStep> {
    let runs = prop::sample::subsequence(vec![1u64, 2, 3, 4], 2..=4);
    let claim = (1u32..=3, 1u64..=6, 0u8..3, 0u8..=12);
    let claims = (runs.clone(), prop::collection::vec(claim, 4)).prop_map(|(runs, args)| {
        let ops = runs
            .into_iter()
            .zip(args)
            .map(|(run, (dispatch, entry, w, t))| DbOp::Claim {
                run: RunId(run),
                dispatch: Dispatch(dispatch),
                entry: EntryId::new(entry, 0),
                worker: format!("w{w}"),
                now: now(t),
                lease_ms: 2_000,
            })
            .collect();
        DbStep::Batch(ops)
    });
    let reads = prop::collection::vec(1u64..=5, 1..=4).prop_map(|runs| {
        // Runs may repeat (reads of one run may share a batch); run 5 is
        // never inserted.
        DbStep::Batch(
            runs.into_iter()
                .map(|r| DbOp::ReadRun { run: RunId(r) })
                .collect(),
        )
    });
    let completions = (runs, prop::collection::vec(0u64..=4, 4)).prop_map(|(runs, fences)| {
        let ops = runs
            .into_iter()
            .zip(fences)
            .map(|(run, fence)| DbOp::Complete {
                run: RunId(run),
                fence: Fence(fence),
                result: format!("\"r{fence}\""),
            })
            .collect();
        DbStep::Batch(ops)
    });
    prop_oneof![claims, completions, reads]
}

/// A random database sequence.
///
/// Built with the `mutants` feature, sequences also hold the mutants'
/// statements and the benchmarks' baseline's (unfenced results, alone and
/// batched): every statement Pelican can send has its twin checked.
pub fn db_sequence() -> impl Strategy<Value = Vec<DbStep>> {
    let step = prop_oneof![9 => dbop().prop_map(DbStep::One), 2 => batch()];
    #[cfg(feature = "mutants")]
    let step = prop_oneof![11 => step, 3 => mutant_step()];
    prop::collection::vec(step, 1..30)
}

/// The mutants' statements, and the baseline's unfenced results alone and
/// as one `COMPLETE_UNFENCED_MANY`.
#[cfg(feature = "mutants")]
fn mutant_step() -> impl Strategy<Value = DbStep> {
    let run = (1u64..=4).prop_map(RunId);
    let fence = (0u64..=4).prop_map(Fence);
    let one = prop_oneof![
        (run.clone(), 1u32..=3, 1u64..=6, 0u8..3, 0u8..=12).prop_map(
            |(run, dispatch, entry, w, t)| DbOp::ClaimReviving {
                run,
                dispatch: Dispatch(dispatch),
                entry: EntryId::new(entry, 0),
                worker: format!("w{w}"),
                now: now(t),
                lease_ms: 2_000,
            }
        ),
        (run.clone(), fence, class()).prop_map(|(run, fence, class)| {
            DbOp::RecordFailureOnly {
                run,
                fence,
                class,
                message: "boom".into(),
            }
        }),
        run.clone().prop_map(|run| DbOp::CompleteUnfenced {
            run,
            result: format!("\"u{}\"", run.0),
        }),
        (run, class()).prop_map(|(run, class)| DbOp::FailUnfenced {
            run,
            class,
            message: "boom".into(),
        }),
    ];
    let unfenced = prop::sample::subsequence(vec![1u64, 2, 3, 4], 2..=4).prop_map(|runs| {
        DbStep::Batch(
            runs.into_iter()
                .map(|r| DbOp::CompleteUnfenced {
                    run: RunId(r),
                    result: format!("\"u{r}\""),
                })
                .collect(),
        )
    });
    prop_oneof![3 => one.prop_map(DbStep::One), 1 => unfenced]
}

/// Empties every table and restarts the run id sequence.
async fn reset(db: &PgDb) -> Result<(), String> {
    pelican_real::live::pg::raw_execute(
        db,
        "TRUNCATE runs, attempts, dead_letters, effects; ALTER SEQUENCE run_ids RESTART WITH 1",
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("reset: {e}"))
}

/// Runs one database sequence on the model and on Postgres (emptied
/// first). `Err` names the first difference.
///
/// # Errors
/// The first statement whose answer differs, or the final rows.
pub async fn db_case(db: &PgDb, steps: &[DbStep]) -> Result<(), String> {
    reset(db).await?;
    let mut model = Db::new();
    for (i, step) in steps.iter().enumerate() {
        let (want, got) = match step {
            DbStep::One(op) => (
                vec![model.execute(op)],
                db.execute(op).await.map(|r| vec![r]),
            ),
            DbStep::Batch(ops) => (model.execute_batch(ops), db.execute_batch(ops).await),
        };
        let got =
            got.map_err(|e| format!("statement {} {step:?} failed on Postgres: {e}", i + 1))?;
        if want != got {
            return Err(format!(
                "statement {} {step:?}: model {want:?}, Postgres {got:?}",
                i + 1
            ));
        }
    }
    let live = db.snapshot().await.map_err(|e| format!("snapshot: {e}"))?;
    // The sequence is Postgres state too; the snapshot takes the largest id.
    model.run_ids = model.runs.keys().map(|r| r.0).max().unwrap_or(0);
    if model.runs != live.runs {
        return Err(format!(
            "final runs differ:\n model    {:?}\n Postgres {:?}",
            model.runs, live.runs
        ));
    }
    if model.attempts != live.attempts {
        return Err(format!(
            "final attempts differ:\n model    {:?}\n Postgres {:?}",
            model.attempts, live.attempts
        ));
    }
    if model.dead_letters != live.dead_letters {
        return Err(format!(
            "final dead letters differ:\n model    {:?}\n Postgres {:?}",
            model.dead_letters, live.dead_letters
        ));
    }
    if model.effects != live.effects {
        return Err(format!(
            "final effects differ:\n model    {:?}\n Postgres {:?}",
            model.effects, live.effects
        ));
    }
    Ok(())
}

/// A connection to the database at `url`, migrated: where [`db_case`]
/// runs its sequences.
///
/// # Panics
/// When Postgres cannot be reached or a migration fails.
#[must_use]
pub fn migrated(url: &str) -> PgDb {
    crate::rt().block_on(async {
        let db = PgDb::connect(url, 2, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("cannot reach Postgres at {url}: {e}"));
        db.migrate().await.expect("migrations apply");
        db
    })
}

/// Runs `cases` random database sequences against the database at `url`
/// (migrated first).
///
/// # Panics
/// When Postgres cannot be reached.
#[must_use]
pub fn run_db(url: &str, cases: u32, seed: u64) -> Outcome {
    let db = migrated(url);
    let mut runner = runner(cases, seed);
    let result = runner.run(&db_sequence(), |ops| {
        crate::rt()
            .block_on(db_case(&db, &ops))
            .map_err(TestCaseError::fail)
    });
    Outcome {
        cases,
        mismatch: match result {
            Ok(()) => None,
            Err(TestError::Fail(why, ops)) => {
                let mut listed = String::new();
                for (i, op) in ops.iter().enumerate() {
                    let _ = writeln!(listed, "  {:>2}. {op:?}", i + 1);
                }
                Some(format!(
                    "{why}\nshrunk sequence ({} statements, from empty tables):\n{listed}",
                    ops.len()
                ))
            }
            Err(TestError::Abort(why)) => Some(format!("aborted: {why}")),
        },
    }
}
