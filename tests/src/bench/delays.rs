//! Time: how late runs start after the time they were given.
//!
//! * Delayed runs: how long after its due time each delayed run's first
//!   attempt was claimed, both by Postgres's clock (`due_at` and the
//!   attempt's `claimed_at`), with runs submitted at a steady rate while
//!   the workers run. The bound it measures is the retry pass's period
//!   (`--promote-every-ms`) plus a read.
//! * Schedules' ticks: how long after its tick (in its run id) each tick's
//!   run was claimed, with schedules every second while the workers run:
//!   the scheduler's period and the retry pass's, plus reads.

use super::{Clients, clients, fresh_env, quantile};
use crate::Cluster;
use pelican_model::db::{Delay, query};
use pelican_model::protocol::SubmitterEnd;
use pelican_model::schedule::{Catchup, Overlap, tick_of};
use pelican_model::status::RunStatus;
use pelican_model::time::Timestamp;
use pelican_real::{NewRun, submit};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the run measured: its runs, and their lateness's p50, p99 and
/// maximum, in ms.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lateness {
    /// Delayed runs measured.
    pub runs: u64,
    /// Median lateness.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// The latest start.
    pub max_ms: f64,
}

/// Submits `rate` runs a second for `seconds`, each delayed `delay_ms`,
/// to the plan's workers, waits for them all to succeed, and measures how
/// late each started.
///
/// # Panics
/// A submission is refused, or the runs do not all succeed within a minute
/// of the last one's due time.
#[must_use]
pub fn lateness(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &super::BenchPlan,
    (rate, seconds, delay_ms): (u32, u32, u64),
) -> Lateness {
    let (env, _workers) = fresh_env(cluster, plan);
    let io = Arc::new(rt.block_on(clients(&env, 8)));
    let n = rate * seconds;
    eprintln!("bench: {n} runs delayed {delay_ms} ms, at {rate} runs/s");
    rt.block_on(submit_delayed(&io, n, rate, delay_ms));
    let deadline = Instant::now() + Duration::from_millis(delay_ms) + Duration::from_secs(60);
    loop {
        let counts = rt
            .block_on(io.db.query(query::CountLive {}))
            .expect("Postgres answers");
        if counts.iter().all(|(_, k)| *k == 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "delayed runs still live a minute after due: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let snapshot = env.db();
    let late: Vec<f64> = snapshot
        .runs
        .values()
        .map(|r| {
            assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
            let due = r.due_at.expect("every run was delayed");
            let first = first_claim(&snapshot, r.run_id);
            assert!(
                first >= due,
                "{} started before its due time (S15)",
                r.run_id
            );
            first.ms_since(due) as f64
        })
        .collect();
    assert_eq!(late.len(), n as usize, "every delayed run is measured");
    Lateness::of(late, "delayed runs", "their due time")
}

impl Lateness {
    /// The figures of `late` (ms), logged as `what` started after `when`.
    fn of(mut late: Vec<f64>, what: &str, when: &str) -> Lateness {
        let out = Lateness {
            runs: late.len() as u64,
            p50_ms: quantile(&mut late, 0.50),
            p99_ms: quantile(&mut late, 0.99),
            max_ms: quantile(&mut late, 1.0),
        };
        eprintln!(
            "bench: {} {what} started p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms after {when}",
            out.runs, out.p50_ms, out.p99_ms, out.max_ms
        );
        out
    }
}

/// When `run`'s first attempt was claimed, by Postgres's clock.
fn first_claim(snapshot: &pelican_model::Db, run: pelican_model::ids::RunId) -> Timestamp {
    snapshot
        .attempts
        .iter()
        .find(|((r, _), _)| *r == run)
        .and_then(|(_, a)| a.claimed_at)
        .expect("a succeeded run's first attempt says when it was claimed")
}

/// Submits `n` no-op runs delayed `delay_ms`, `rate` a second.
async fn submit_delayed(io: &Arc<Clients>, n: u32, rate: u32, delay_ms: u64) {
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let at = t0 + Duration::from_secs_f64(f64::from(i) / f64::from(rate));
        tokio::time::sleep_until(at.into()).await;
        let io = Arc::clone(io);
        tasks.spawn(async move {
            let run = io.db.query(query::NextRunId {}).await.expect("a run id");
            let new = NewRun {
                delay: Delay { delay_ms, at_ms: 0 },
                ..NewRun::new("noop", "{}")
            };
            let end = submit(&*io, run, &new).await;
            assert!(
                matches!(end, SubmitterEnd::Accepted { .. }),
                "{run}: {end:?}"
            );
        });
        while let Some(r) = tasks.try_join_next() {
            r.expect("a submission does not panic");
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a submission does not panic");
    }
}

/// Puts `schedules` schedules, each every second, on the plan's workers
/// for `seconds`, deletes them, waits for their runs to succeed, and
/// measures how late each tick's run started after its tick. Every second
/// each schedule saw is handled once (S16): as many runs as ticks fired,
/// none skipped.
///
/// # Panics
/// A statement fails, a tick is handled twice or skipped, or the runs do
/// not all succeed within a minute.
#[must_use]
pub fn tick_lateness(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &super::BenchPlan,
    (schedules, seconds): (u32, u32),
) -> Lateness {
    let (env, _workers) = fresh_env(cluster, plan);
    let io = rt.block_on(clients(&env, 8));
    eprintln!("bench: {schedules} schedules every second, for {seconds} s");
    let names: Vec<String> = (0..schedules)
        .map(|i| format!("every-second-{i}"))
        .collect();
    for name in &names {
        let put = query::PutSchedule {
            name: name.clone(),
            kind: "noop".into(),
            input: "{}".into(),
            cron: "* * * * * *".into(),
            tz: "UTC".into(),
            overlap: Overlap::Queue,
            catchup: Catchup::One,
        };
        rt.block_on(io.db.query(put)).expect("a schedule is put");
    }
    std::thread::sleep(Duration::from_secs(u64::from(seconds)));
    let kept = rt
        .block_on(io.db.query(query::ListSchedules {}))
        .expect("the schedules read");
    for name in names {
        rt.block_on(io.db.query(query::DeleteSchedule { name }))
            .expect("a schedule is deleted");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while rt
        .block_on(io.db.query(query::CountLive {}))
        .expect("Postgres answers")
        .iter()
        .any(|(_, k)| *k > 0)
    {
        assert!(
            Instant::now() < deadline,
            "tick runs still live a minute on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let snapshot = env.db();
    let fired: u64 = kept.iter().map(|(_, s)| s.fired).sum();
    let skipped: u64 = kept.iter().map(|(_, s)| s.skipped).sum();
    let late: Vec<f64> = snapshot
        .runs
        .values()
        .map(|r| {
            assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
            let (_, tick) = tick_of(r.run_id).expect("only schedules make runs here");
            first_claim(&snapshot, r.run_id).ms_since(tick) as f64
        })
        .collect();
    // The statement that deleted a schedule may have followed a tick's.
    assert!(
        fired <= late.len() as u64 && skipped == 0,
        "{fired} fired, {skipped} skipped, {} runs",
        late.len()
    );
    Lateness::of(late, "ticks' runs", "their tick")
}
