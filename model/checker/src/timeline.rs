//! Counterexamples as numbered, readable timelines: who did what, then the
//! runs, the stream and the PEL after each step.

use crate::state::{Action, Fate, Source, State};
use pelican_model::ids::EntryId;
use pelican_model::protocol::{Command, JobEntry, StreamOp};
use std::fmt::Write as _;

fn id(e: EntryId) -> String {
    // Every entry is added at the same abstract instant: the sequence tells
    // them apart (after the partition, outside partition 0).
    match e.partition {
        0 => format!("#{}", e.seq),
        p => format!("#{p}:{}", e.seq),
    }
}

/// One command, briefly.
#[must_use]
pub fn command(c: &Command) -> String {
    match c {
        Command::Db(op) => op.describe(),
        Command::Stream(op) => match op {
            StreamOp::Publish {
                entry: JobEntry::Job { run, dispatch },
                ..
            } => format!("XADD {run} {dispatch}"),
            StreamOp::Publish {
                entry: JobEntry::Malformed { .. },
                ..
            } => "XADD <malformed>".into(),
            StreamOp::PublishDead { .. } => "XADD to the dead-letter stream".into(),
            StreamOp::EnsureGroup { partition } => {
                format!("XGROUP CREATE (MKSTREAM) in partition {partition}")
            }
            StreamOp::Read { partition, .. } => format!("XREADGROUP > in partition {partition}"),
            StreamOp::Ack { ids } => format!(
                "XACK {}",
                ids.iter().map(|i| id(*i)).collect::<Vec<_>>().join(" ")
            ),
            StreamOp::AutoClaim { start, .. } => format!("XAUTOCLAIM from {}", id(*start)),
            StreamOp::Touch { id: e, .. } => format!("XCLAIM {} JUSTID (idle reset)", id(*e)),
            StreamOp::Locate { id: e } => format!("locate {}", id(*e)),
            StreamOp::Retain { .. } => "XTRIM MINID (retention)".into(),
            StreamOp::ForgetConsumers { .. } => {
                "XGROUP DELCONSUMER of idle consumers holding nothing".into()
            }
            #[cfg(feature = "mutants")]
            StreamOp::DropConsumers { .. } => "XGROUP DELCONSUMER of idle consumers".into(),
            StreamOp::Queue { .. } => "queue health (XINFO GROUPS, XPENDING)".into(),
        },
        other => format!("{other:?}"),
    }
}

fn fate(f: Fate) -> &'static str {
    match f {
        Fate::Reply => "",
        Fate::LostReply => "  ⚡ applied, reply lost",
        Fate::LostRequest => "  ⚡ request lost",
        Fate::Duplicated => "  ⚡ applied twice (reply lost, publisher retried)",
    }
}

/// What `action` does in `state`, in words.
#[must_use]
pub fn describe(s: &State, action: Action) -> String {
    let run = |n: u8| format!("run-{}", u32::from(n) + 1);
    match action {
        Action::Submit(n, f) => format!(
            "api: POST /runs {}: INSERT, XADD{}, mark published",
            run(n),
            fate(f)
        ),
        Action::Resubmit(n) => format!("api: POST /runs again under {}'s key", run(n)),
        Action::Cancel(n) => format!("api: POST /runs/{}/cancel", run(n)),
        Action::Fetch(w, p, f) => format!("w{w}: XREADGROUP > in partition {p}{}", fate(f)),
        Action::Reclaim(w, f) => format!("w{w}: reclaim round{}", fate(f)),
        Action::Step(w, src, f) => {
            let c = s.workers[usize::from(w)]
                .outstanding
                .iter()
                .find(|(s, _)| *s == src)
                .map_or_else(|| "?".into(), |(_, c)| command(c));
            let who = match src {
                Source::Fetch => "reader",
                Source::Delivery => "delivery",
                Source::Reclaimer => "reclaimer",
            };
            format!("w{w} {who}: {c}{}", fate(f))
        }
        Action::Effect(w) => format!("w{w}: job performs its side effect"),
        Action::Record(w) => format!("w{w}: job reports progress and records its step"),
        Action::Finish(w, o) => format!("w{w}: job ends: {o:?}"),
        Action::Maintain(t, f) => format!("maintenance: {t:?} pass{}", fate(f)),
        Action::Schedule(w, f) => {
            let next = s.workers[usize::from(w)].scheduler.clone().poll();
            let c = next.map_or_else(|| "reads the due schedules".into(), |c| command(&c));
            format!("w{w} scheduler: {c}{}", fate(f))
        }
        Action::Crash(w) => format!("⚡ w{w} killed (restarts empty)"),
        Action::Pause(w) => format!("⚡ w{w} paused"),
        Action::Resume(w) => format!("w{w} resumes"),
        Action::Tick(0) => {
            "⏱ a long time passes (leases, retries, idle times expire; live workers heartbeat)"
                .into()
        }
        Action::Tick(k) => format!(
            "⏱ a long time passes (leases, retries, idle times expire; live workers heartbeat, in order {k})"
        ),
        Action::RedisWipe => "⚡ Redis restarts empty".into(),
        Action::RedisLoseNewest(p) => {
            format!("⚡ Redis restarts, newest write to partition {p} lost")
        }
        Action::Trim(p) => format!("⚡ XTRIM partition {p} below its oldest pending ID"),
    }
}

/// The runs, the stream and the PEL, on one or two lines.
#[must_use]
pub fn summary(s: &State) -> String {
    let mut out = String::new();
    for r in s.world.db.runs.values() {
        let _ = write!(
            out,
            "{}: {} fence {} attempts {} dispatch {}; ",
            r.run_id, r.status, r.active_fence.0, r.attempts, r.dispatch.0
        );
    }
    if s.world.db.runs.is_empty() {
        out.push_str("no runs; ");
    }
    for (p, jobs) in s.world.redis.jobs.iter().enumerate() {
        let p = pelican_model::ids::partition_at(p);
        let entries: Vec<String> = jobs
            .entries
            .iter()
            .map(|(i, e)| (i.in_partition(p), e))
            .map(|(i, e)| match e {
                JobEntry::Job { run, dispatch } => format!("{} {run}/d{}", id(i), dispatch.0),
                JobEntry::Malformed { .. } => format!("{} <malformed>", id(i)),
            })
            .collect();
        let pel: Vec<String> = jobs.group.as_ref().map_or_else(
            || vec!["(no group)".into()],
            |g| {
                g.pel
                    .iter()
                    .map(|(i, d)| {
                        let i = i.in_partition(p);
                        format!("{}→{} x{}", id(i), d.consumer, d.delivery_count)
                    })
                    .collect()
            },
        );
        let _ = write!(
            out,
            "\n        stream [{}]  PEL [{}]",
            entries.join(", "),
            pel.join(", ")
        );
    }
    out
}

/// A whole path, numbered.
#[must_use]
pub fn render(states: &[State], actions: &[Action]) -> String {
    let mut out = String::new();
    for (i, (before, action)) in states.iter().zip(actions).enumerate() {
        let after = &states[i + 1];
        let _ = writeln!(out, "{:>3}. {}", i + 1, describe(before, *action));
        let _ = writeln!(out, "        {}", summary(after));
    }
    out
}
