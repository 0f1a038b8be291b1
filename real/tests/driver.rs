//! The driver on a real tokio runtime against in-memory servers (the model's
//! `World` behind a lock): the same loops the simulator and the live worker
//! run, here with wall-clock time.

#![cfg(not(madsim))]

use pelican_model::ids::{Fence, RunId, WorkerId};
use pelican_model::invariants;
use pelican_model::protocol::{DbOp, DbReply, Policy, StreamOp, SubmitterEnd, Unavailable};
use pelican_model::status::{ErrorClass, RunStatus};
use pelican_model::world::{Issuer, World};
use pelican_real::driver::BoxFuture;
use pelican_real::jobs::{Handler, JobContext, JobError, Registry, StepFailed, effects_of};
use pelican_real::{
    Config, DbClient, Entropy, Io, NewRun, NoProbe, StreamClient, StreamResult, Tools, Worker,
    submit,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Mem(Arc<Mutex<World>>);

impl Mem {
    /// The world, its servers' clock set to now.
    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        let mut w = self
            .0
            .lock()
            .expect("no test panics while holding the world");
        w.db.clock = pelican_real::now();
        w
    }
}

impl StreamClient for Mem {
    async fn call(&self, op: StreamOp) -> Result<StreamResult, Unavailable> {
        Ok(self.world().stream(&op, Issuer::default()))
    }
}

/// A checker's wrapper: each statement reaches the world with who issued
/// it (`call_as`), as the simulator's client does.
impl DbClient for Mem {
    async fn call(&self, op: DbOp) -> Result<DbReply, Unavailable> {
        self.call_as(op, Issuer::default()).await
    }

    async fn call_as(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        Ok(self.world().db(&op, by))
    }

    /// Back to back under one lock, as the simulator's server runs a batch.
    async fn call_batch_as(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        let mut w = self.world();
        Ok(ops.iter().map(|(op, by)| w.db(op, *by)).collect())
    }
}

impl Tools for Mem {
    fn apply(
        &self,
        run: RunId,
        call: u32,
        fence: Fence,
        key: String,
    ) -> BoxFuture<Result<bool, Unavailable>> {
        let mut w = self.world();
        w.step_ran(run, call, fence);
        let applied = w.db.apply_effect(&key) == 1;
        w.effect_applied(run, call, applied);
        Box::pin(async move { Ok(applied) })
    }
}

struct Counter(Mutex<u64>);
impl Entropy for Counter {
    fn next_u64(&self) -> u64 {
        let mut n = self.0.lock().expect("never poisoned");
        *n += 1;
        *n
    }
}

fn config() -> Config {
    Config {
        policy: Policy {
            lease_ms: 1_000,
            heartbeat_ms: 100,
            reclaim_min_idle_ms: 1_500,
            backoff_base_ms: 20,
            backoff_cap_ms: 100,
            attempts_max: 3,
            ..Policy::default()
        },
        in_flight_max: 4,
        read_count_max: 4,
        idle_poll_ms: 10,
        call_timeout_ms: 500,
        reclaim_every_ms: 100,
        maintenance_every_ms: 50,
        promote_every_ms: 10,
        shutdown_grace_ms: 100,
        job_timeout_ms: 10_000,
        retention_ms: 200,
        clock_offset_ms: 0,
    }
}

fn io(mem: &Mem) -> Arc<Io<Mem, Mem, NoProbe>> {
    io_with(mem, NoProbe)
}

fn io_with<P: pelican_real::Probe>(mem: &Mem, probe: P) -> Arc<Io<Mem, Mem, P>> {
    let config = config();
    config.validate().expect("the test's knobs are consistent");
    Arc::new(Io {
        stream: mem.clone(),
        db: mem.clone(),
        probe,
        entropy: Arc::new(Counter(Mutex::new(0))),
        config,
    })
}

const JOBS: [(&str, &str, RunStatus); 9] = [
    ("noop", "{}", RunStatus::Succeeded),
    ("sleep", r#"{"ms":250}"#, RunStatus::Succeeded),
    ("effect", r#"{"calls":3,"ms":10}"#, RunStatus::Succeeded),
    ("steps", r#"{"calls":2,"ms":10}"#, RunStatus::Succeeded),
    (
        "fail",
        r#"{"class":"retryable","times":1}"#,
        RunStatus::Succeeded,
    ),
    (
        "fail",
        r#"{"class":"retryable","times":9}"#,
        RunStatus::Dead,
    ),
    (
        "fail",
        r#"{"class":"terminal","times":1}"#,
        RunStatus::Failed,
    ),
    ("panic", r#"{"times":1}"#, RunStatus::Succeeded),
    ("sleep", r#"{"oops":1}"#, RunStatus::Failed),
];

#[tokio::test]
async fn a_worker_brings_every_run_to_its_outcome() {
    let mem = Mem(Arc::new(Mutex::new(World::new())));
    let io = io(&mem);
    for (n, (kind, input, _)) in JOBS.iter().enumerate() {
        let run = RunId(n as u64 + 1);
        let end = submit(&*io, run, &NewRun::new(kind, input)).await;
        assert_eq!(end, SubmitterEnd::Accepted { published: true });
        mem.world().accepted.insert(run);
    }
    let registry = Registry::with_builtins(
        Arc::new(mem.clone()),
        Arc::new(mem.clone()),
        &io.config.policy,
    );
    let worker = Worker::new(io.clone(), Arc::new(registry), WorkerId(0), true);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let settled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let w = mem.world();
            if w.redis.pel_len() == 0 && w.db.runs.values().all(|r| r.status.is_terminal()) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), settled)
        .await
        .expect("every run settles");
    let _ = stop.send(());
    assert_eq!(handle.await.expect("the worker returns"), 0);

    let w = mem.world();
    for (n, (kind, input, want)) in JOBS.iter().enumerate() {
        let row = &w.db.runs[&RunId(n as u64 + 1)];
        assert_eq!(row.status, *want, "{kind} {input}: {row:?}");
    }
    let effects = |run: RunId| {
        let (kind, input, _) = JOBS[usize::try_from(run.0 - 1).expect("small")];
        effects_of(kind, input)
    };
    assert_eq!(invariants::state(&w, &io.config.policy), vec![]);
    assert_eq!(invariants::quiescent(&w, &effects), vec![]);
}

#[tokio::test]
async fn shutdown_leaves_a_long_job_pending_for_another_worker() {
    let mem = Mem(Arc::new(Mutex::new(World::new())));
    let io = io(&mem);
    let end = submit(&*io, RunId(1), &NewRun::new("sleep", r#"{"ms":60000}"#)).await;
    assert_eq!(end, SubmitterEnd::Accepted { published: true });
    let registry = Registry::with_builtins(
        Arc::new(mem.clone()),
        Arc::new(mem.clone()),
        &io.config.policy,
    );
    let worker = Worker::new(io.clone(), Arc::new(registry), WorkerId(0), false);
    let left = worker
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await;
    assert_eq!(left, 1, "the job outlives the grace period");
    let w = mem.world();
    assert_eq!(w.redis.pel_len(), 1, "its entry stays pending");
    assert_eq!(w.db.runs[&RunId(1)].status, RunStatus::Running);
}

#[test]
fn inconsistent_knobs_are_rejected() {
    let mut c = config();
    c.policy.heartbeat_ms = c.policy.lease_ms;
    assert!(c.validate().unwrap_err().contains("heartbeat_ms"));
    let mut c = config();
    c.call_timeout_ms = c.policy.lease_ms;
    assert!(c.validate().unwrap_err().contains("call_timeout_ms"));
    let mut c = config();
    c.in_flight_max = 0;
    assert!(c.validate().is_err());
}

/// A worker's trace replays through the protocol; a tampered one is
/// rejected at the tampered line, with the role's events before it.
#[tokio::test]
async fn traces_conform_and_tampering_is_caught() {
    use pelican_real::trace::{TraceProbe, check, check_file};
    let mem = Mem(Arc::new(Mutex::new(World::new())));
    let path = std::env::temp_dir().join(format!("pelican-trace-{}.jsonl", std::process::id()));
    let probe = TraceProbe::create(&path, &config().policy, 0).expect("a temp file");
    let io = io_with(&mem, probe);
    for (n, (kind, input, _)) in JOBS.iter().enumerate() {
        let end = submit(&*io, RunId(n as u64 + 1), &NewRun::new(kind, input)).await;
        assert!(matches!(end, SubmitterEnd::Accepted { .. }));
    }
    let registry = Registry::with_builtins(
        Arc::new(mem.clone()),
        Arc::new(mem.clone()),
        &io.config.policy,
    );
    let worker = Worker::new(io.clone(), Arc::new(registry), WorkerId(0), true);
    worker.run(tokio::time::sleep(Duration::from_secs(3))).await;
    let events = check_file(&path).expect("the trace conforms");
    assert!(events > 50, "{events} events");
    let lines: Vec<String> = std::fs::read_to_string(&path)
        .expect("readable")
        .lines()
        .map(str::to_owned)
        .collect();
    // A delivery's completion, rewritten to carry another fence.
    let at = lines
        .iter()
        .position(|l| l.contains("\"Complete\""))
        .expect("a completion");
    let mut tampered = lines.clone();
    tampered[at] = tampered[at].replace("\"fence\":1", "\"fence\":7");
    let r = check(tampered).expect_err("a write with a foreign fence");
    assert_eq!(r.line, at + 1);
    assert!(r.reason.contains("but the protocol sends"), "{r}");
    assert!(!r.before.is_empty());
    let _ = std::fs::remove_file(&path);
}

/// Runs one run of `kind` with `handler` registered on a worker until it
/// is terminal, and answers its row.
async fn one_run(kind: &'static str, handler: impl Handler) -> pelican_model::db::RunRow {
    let mem = Mem(Arc::new(Mutex::new(World::new())));
    let io = io(&mem);
    let end = submit(&*io, RunId(1), &NewRun::new(kind, "{}")).await;
    assert_eq!(end, SubmitterEnd::Accepted { published: true });
    let mut registry = Registry::new(
        Arc::new(mem.clone()),
        Arc::new(mem.clone()),
        &io.config.policy,
    );
    registry.register(kind, handler);
    let worker = Worker::new(io.clone(), Arc::new(registry), WorkerId(0), true);
    let done = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if mem.world().db.runs[&RunId(1)].status.is_terminal() {
                return;
            }
        }
    };
    let left = worker
        .run(async {
            tokio::time::timeout(Duration::from_secs(20), done)
                .await
                .expect("the run ends");
        })
        .await;
    assert_eq!(left, 0);
    let w = mem.world();
    assert_eq!(w.violations, Default::default());
    w.db.runs[&RunId(1)].clone()
}

/// A step recorded by the first attempt is replayed by the second: its body
/// runs once, and the second attempt gets its output.
#[tokio::test]
async fn a_later_attempt_replays_a_recorded_step() {
    static BODIES: AtomicU32 = AtomicU32::new(0);
    let row = one_run("twice", |ctx: JobContext| async move {
        let n: u32 = ctx
            .step("count", async {
                Ok(BODIES.fetch_add(1, Ordering::SeqCst) + 7)
            })
            .await?;
        if ctx.attempt == 1 {
            return Err(StepFailed::Body(JobError::retryable("once more")));
        }
        Ok(n)
    })
    .await;
    assert_eq!(row.status, RunStatus::Succeeded, "{row:?}");
    assert_eq!(row.result.as_deref(), Some("7"));
    assert_eq!(row.attempts, 2);
    assert_eq!(BODIES.load(Ordering::SeqCst), 1, "the step ran once");
}

/// A retry that asks for its steps in another order fails the run, with a
/// message that says so.
#[tokio::test]
async fn steps_asked_in_another_order_fail_the_run() {
    let row = one_run("fickle", |ctx: JobContext| async move {
        let name = if ctx.attempt == 1 { "a" } else { "b" };
        ctx.step(name, async { Ok(1) }).await?;
        if ctx.attempt == 1 {
            return Err(StepFailed::Body(JobError::retryable("once more")));
        }
        Ok(())
    })
    .await;
    assert_eq!(row.status, RunStatus::Failed, "{row:?}");
    let (class, message) = row.error.expect("an error");
    assert_eq!(class, ErrorClass::Terminal);
    assert!(message.contains("same order"), "{message}");
}

/// A step whose output exceeds `value_bytes_max` fails the run as
/// unstorable, with a message naming the step, and records nothing.
#[tokio::test]
async fn a_step_output_over_the_limit_fails_the_run() {
    let max = config().policy.value_bytes_max;
    let row = one_run("huge", move |ctx: JobContext| async move {
        ctx.step("big", async move { Ok("x".repeat(max)) }).await
    })
    .await;
    assert_eq!(row.status, RunStatus::Failed, "{row:?}");
    let (class, message) = row.error.expect("an error");
    assert_eq!(class, ErrorClass::Unstorable);
    assert!(message.contains("\"big\""), "{message}");
}

/// A step whose name Postgres refuses (a NUL byte) fails the run as
/// unstorable on its first attempt, instead of being retried.
#[tokio::test]
async fn a_step_name_postgres_refuses_fails_the_run() {
    let row = one_run("nul", |ctx: JobContext| async move {
        ctx.step("bad\0name", async { Ok(1) }).await
    })
    .await;
    assert_eq!(row.status, RunStatus::Failed, "{row:?}");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.error.map(|e| e.0), Some(ErrorClass::Unstorable));
}
