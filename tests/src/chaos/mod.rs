//! The chaos soak: a real API and real workers against a throwaway Redis
//! (AOF everysec) and a throwaway Postgres cluster, a mixed workload
//! submitted through the HTTP API, and a seeded nemesis that does
//! everything the fault model allows at once: kill -9 of workers (restarted
//! after a while), SIGSTOP past the lease, Redis restarts (AOF replay, up
//! to a second lost), one total Redis wipe, Postgres restarts (immediate
//! shutdown), trims and XDELs below pending IDs, duplicate publications, and
//! bad input of every kind — malformed stream entries and bad API requests.
//!
//! After the fault phase the nemesis heals (resumes paused workers,
//! restarts killed ones) and [`run`] waits for quiescence: every run row in
//! Postgres terminal, the PEL empty, every entry delivered. Then the
//! guarantees are checked on the live state ([`crate::Env::audit`]: S1–S10
//! and every process's protocol trace against the model), and every run's
//! outcome against what its job does.
//!
//! The schedule is a pure function of the [`Plan`] (seed included), printed
//! on failure so that the same faults can be thrown again; the exact
//! interleaving with real processes is, of course, not reproducible.
//!
//! Its parts: [`Plan`] (what to run), the nemesis (the schedule of faults
//! and how each is thrown, bad input among them), the workload (the jobs
//! and the submitters), and the [`Report`] with the final verdict.

use crate::{Cluster, Database, Env};
use pelican_model::ids::RunId;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod bad_input;
mod nemesis;
mod plan;
mod report;
mod workload;

pub use bad_input::BadInput;
pub use nemesis::{Fault, schedule};
pub use plan::{FaultCounts, Plan};
pub use report::Report;
pub use workload::{Job, designed_outcome, job};

use nemesis::{Slot, throw};
use report::verdict;
use workload::{Shared, agent, submitter};

/// The API's bearer token in the soak.
const TOKEN: &str = "chaos";

/// Progress reported while the soak runs.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// "faults" or "settling".
    pub phase: &'static str,
    /// Milliseconds into the phase.
    pub elapsed_ms: u64,
    /// Runs accepted so far.
    pub jobs: u64,
    /// Faults thrown so far.
    pub faults: u64,
    /// Runs not terminal yet (settling only).
    pub open: u64,
}

/// Starts worker `w` (numbered from 1). Worker clocks are off by five
/// leases: one in three runs ahead, one in three behind.
fn worker(env: &mut Env, w: u32) -> crate::Proc {
    let offset = ["0", "10000", "-10000"][(w % 3) as usize];
    env.worker(
        w,
        None,
        &["--in-flight-max", "32", "--clock-offset-ms", offset],
    )
}

/// Runs the soak described by `plan`, reporting progress to `progress`.
///
/// # Panics
/// When a service cannot be started at all (no `redis-server`, no
/// `initdb`, no `PELICAN_BIN`): the report is for the system under test.
pub fn run(plan: &Plan, progress: &dyn Fn(&Progress)) -> Report {
    let started = Instant::now();
    let cluster = Cluster::start();
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let redis = if plan.redis_cluster {
        crate::Redis::cluster()
    } else {
        crate::Redis::start()
    };
    let mut env = Env::with_services(url, Some(db), redis, plan.mutant.as_deref());
    env.settle_timeout = Duration::from_secs(u64::from(plan.settle_seconds));
    let (_api, base) = env.api_with(TOKEN, plan.attempts_max);
    let mut slots: Vec<Slot> = (0..plan.workers)
        .map(|w| Slot {
            proc: Some(worker(&mut env, w + 1)),
            paused_until: None,
            restart_at: None,
        })
        .collect();
    let shared = Arc::new(Shared::default());
    let phase_start = Instant::now();
    let lanes = 3;
    let submitters: Vec<_> = (0..lanes)
        .map(|lane| {
            let (plan, base, shared) = (plan.clone(), base.clone(), Arc::clone(&shared));
            std::thread::spawn(move || submitter(&plan, &base, lane, lanes, &shared, phase_start))
        })
        .collect();

    let mut report = Report {
        plan: plan.clone(),
        logs: env.logs.display().to_string(),
        ..Report::default()
    };
    let mut bad_kinds = BTreeSet::new();
    let mut malformed = Vec::new();
    let agent = agent();
    let faults = schedule(plan);
    let mut next = 0;
    let span = Duration::from_secs(u64::from(plan.seconds));
    let mut thrown = 0u64;
    loop {
        let now = Instant::now();
        let t = now.duration_since(phase_start);
        // Resumes and restarts that are due.
        for (w, slot) in slots.iter_mut().enumerate() {
            if slot.paused_until.is_some_and(|u| u <= now) {
                slot.paused_until = None;
                if let Some(p) = &slot.proc {
                    p.cont();
                }
            }
            if slot.restart_at.is_some_and(|u| u <= now) {
                slot.restart_at = None;
                slot.proc = Some(worker(&mut env, w as u32 + 1));
            }
        }
        while next < faults.len() && Duration::from_millis(faults[next].0) <= t {
            let fault = faults[next].1.clone();
            next += 1;
            thrown += 1;
            throw(
                &fault,
                &mut env,
                &cluster,
                &mut slots,
                &agent,
                &base,
                &mut report,
                &mut bad_kinds,
                &mut malformed,
            );
        }
        let submitting = submitters.iter().any(|s| !s.is_finished());
        if t >= span && next >= faults.len() && !submitting {
            break;
        }
        if t >= span + Duration::from_secs(600) {
            report
                .failures
                .push("submissions did not finish within 10 minutes of the fault phase".into());
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        progress(&Progress {
            phase: "faults",
            elapsed_ms: t.as_millis() as u64,
            jobs: shared.accepted_n.load(Ordering::Relaxed),
            faults: thrown,
            open: 0,
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in submitters {
        let _ = s.join();
    }
    report.fault_seconds = phase_start.elapsed().as_secs_f64();
    // Heal: every worker running and resumed.
    for (w, slot) in slots.iter_mut().enumerate() {
        if slot.paused_until.take().is_some()
            && let Some(p) = &slot.proc
        {
            p.cont();
        }
        if slot.proc.is_none() {
            slot.restart_at = None;
            slot.proc = Some(worker(&mut env, w as u32 + 1));
        }
    }
    let mut accepted: Vec<RunId> = shared.accepted.lock().expect("not poisoned").clone();
    accepted.extend(report.wipe_probes.iter().copied());
    let cancel_requested = shared
        .cancel_requested
        .lock()
        .expect("not poisoned")
        .clone();
    report.jobs = accepted.len() as u64;
    report.cancels = cancel_requested.len() as u64;
    report.submit_errors = shared.submit_errors.load(Ordering::Relaxed);
    report.bad_input_kinds = bad_kinds.len() as u32;

    // Settle: every row terminal, the PEL empty, every entry delivered.
    let settle_start = Instant::now();
    let settle_timeout = Duration::from_secs(u64::from(plan.settle_seconds));
    let mut last_open;
    loop {
        let db = env.db();
        last_open = db.runs.values().filter(|r| !r.status.is_terminal()).count() as u64;
        let done = last_open == 0 && env.stream_drained();
        if done || settle_start.elapsed() > settle_timeout {
            break;
        }
        progress(&Progress {
            phase: "settling",
            elapsed_ms: settle_start.elapsed().as_millis() as u64,
            jobs: report.jobs,
            faults: thrown,
            open: last_open,
        });
        std::thread::sleep(Duration::from_millis(250));
    }
    report.settle_seconds = settle_start.elapsed().as_secs_f64();
    if last_open > 0 {
        report.failures.push(format!(
            "not quiescent within {} s: {last_open} runs not terminal",
            plan.settle_seconds
        ));
    }

    // The final check.
    verdict(
        &mut env,
        &mut report,
        &accepted,
        &cancel_requested,
        &malformed,
    );
    report.seconds = started.elapsed().as_secs_f64();
    if !report.passed() {
        env.keep_logs = true;
    }
    drop(slots);
    drop(env);
    drop(cluster);
    report
}

/// Runs the soak and prints what it did; `Err` with the report when it
/// failed (after printing the seed and the schedule).
///
/// # Errors
/// When any loss counter is not 0 or any other check failed.
pub fn run_and_print(plan: &Plan, quiet: bool) -> Result<Report, Box<Report>> {
    use indicatif::{ProgressBar, ProgressStyle};
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(u64::from(plan.seconds) * 1000)
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:30}] {elapsed:>4} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let n = plan.fault_counts();
    eprintln!(
        "chaos: seed {}, {} jobs, {} workers, {} s of faults{}: {} kills, {} pauses, {} Redis restarts, {} wipe, {} master failovers, {} Postgres restarts, {} trims, {} bad inputs, {} duplicate publishes",
        plan.seed,
        plan.jobs,
        plan.workers,
        plan.seconds,
        if plan.redis_cluster {
            " on a Redis Cluster"
        } else {
            ""
        },
        n.kills,
        n.pauses,
        n.redis_restarts,
        n.redis_wipes,
        n.failovers,
        n.pg_restarts,
        n.trims,
        n.bad_inputs,
        n.duplicate_publishes
    );
    let report = run(plan, &|p| {
        bar.set_prefix(p.phase);
        if p.phase == "faults" {
            bar.set_position(p.elapsed_ms);
            bar.set_message(format!("{} jobs accepted, {} faults", p.jobs, p.faults));
        } else {
            bar.set_message(format!("{} runs still open", p.open));
        }
    });
    bar.finish_and_clear();
    eprint!("{}", report.table());
    for n in &report.notes {
        eprintln!("  note: {n}");
    }
    if report.passed() {
        eprintln!("chaos: PASSED (seed {})", plan.seed);
        Ok(report)
    } else {
        eprintln!("chaos: FAILED (seed {})", plan.seed);
        for f in &report.failures {
            eprintln!("  {f}");
        }
        eprintln!(
            "the schedule of seed {} (milliseconds into the fault phase):",
            plan.seed
        );
        for (t, fault) in schedule(plan) {
            eprintln!("  {t:>7} {fault}");
        }
        eprintln!(
            "re-run: cargo xtask chaos --jobs {} --workers {} --seconds {} --seed {}{}{}",
            plan.jobs,
            plan.workers,
            plan.seconds,
            plan.seed,
            if plan.redis_cluster {
                " --redis-cluster"
            } else {
                ""
            },
            plan.mutant
                .as_deref()
                .map(|m| format!(" --mutant {m}"))
                .unwrap_or_default()
        );
        eprintln!("process logs and traces: {}", report.logs);
        Err(Box::new(report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_model::status::RunStatus;

    #[test]
    fn the_schedule_is_a_function_of_the_plan_and_has_the_counts() {
        for plan in [Plan::default(), Plan::short(), Plan::short_cluster()] {
            let s = schedule(&plan);
            assert_eq!(s, schedule(&plan));
            let n = plan.fault_counts();
            let count = |p: fn(&Fault) -> bool| s.iter().filter(|(_, f)| p(f)).count() as u32;
            assert_eq!(count(|f| matches!(f, Fault::Kill { .. })), n.kills);
            assert_eq!(
                count(|f| matches!(f, Fault::RedisRestart)),
                n.redis_restarts
            );
            assert_eq!(count(|f| matches!(f, Fault::RedisWipe)), n.redis_wipes);
            assert_eq!(count(|f| matches!(f, Fault::Failover { .. })), n.failovers);
            assert_eq!(n.failovers > 0, plan.redis_cluster);
            assert_eq!(n.redis_wipes + n.redis_restarts > 0, !plan.redis_cluster);
            assert_eq!(count(|f| matches!(f, Fault::PgRestart)), n.pg_restarts);
            let kinds: BTreeSet<_> = s
                .iter()
                .filter_map(|(_, f)| match f {
                    Fault::Bad(b) => Some(*b),
                    _ => None,
                })
                .collect();
            assert_eq!(kinds.len(), BadInput::ALL.len());
            assert!(s.iter().all(|(t, _)| *t < u64::from(plan.seconds) * 1000));
            assert_ne!(
                schedule(&Plan {
                    seed: 2,
                    ..plan.clone()
                }),
                s
            );
        }
        let d = Plan::default().fault_counts();
        assert!(d.kills >= 100 && d.redis_restarts >= 3, "{d:?}");
        let s = Plan::short().fault_counts();
        assert!(
            s.kills >= 20 && s.redis_restarts >= 1 && s.pg_restarts >= 1,
            "{s:?}"
        );
    }

    #[test]
    fn designed_outcomes() {
        assert_eq!(designed_outcome("noop", "{}", 5), RunStatus::Succeeded);
        let fail = |class: &str, times: u32| format!(r#"{{"class":"{class}","times":{times}}}"#);
        assert_eq!(
            designed_outcome("fail", &fail("retryable", 2), 5),
            RunStatus::Succeeded
        );
        assert_eq!(
            designed_outcome("fail", &fail("retryable", 99), 5),
            RunStatus::Dead
        );
        assert_eq!(
            designed_outcome("fail", &fail("terminal", 99), 5),
            RunStatus::Failed
        );
        assert_eq!(
            designed_outcome("panic", r#"{"times":99}"#, 5),
            RunStatus::Dead
        );
        assert_eq!(
            designed_outcome("panic", r#"{"times":1}"#, 5),
            RunStatus::Succeeded
        );
        assert_eq!(
            designed_outcome("echo", r#"{"text":"poison\u0000"}"#, 5),
            RunStatus::Failed
        );
        // Every job of the workload is one of these.
        let plan = Plan::short();
        let kinds: BTreeSet<&str> = (0..plan.jobs).map(|i| job(&plan, i).kind).collect();
        assert_eq!(
            kinds,
            ["echo", "effect", "fail", "noop", "panic", "sleep"]
                .into_iter()
                .collect()
        );
        assert!((0..plan.jobs).any(|i| job(&plan, i).cancel_after_ms.is_some()));
    }

    #[test]
    fn every_bad_input_is_an_entry_or_a_request() {
        for b in BadInput::ALL {
            assert!(b.entry().is_some() != b.request().is_some(), "{b:?}");
        }
    }
}
