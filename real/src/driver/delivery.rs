//! Driving one [`Delivery`]: its server calls, its job and its heartbeat timer.

use super::{DbClient, Io, Probe, RoleId, StreamClient, maybe};
use crate::jobs::Executor;
use futures_util::FutureExt;
use futures_util::future::{Fuse, FusedFuture};
use pelican_model::ids::{EntryId, WorkerId};
use pelican_model::protocol::{
    Command, DbOp, Delivery, DeliveryEnd, Execution, Input, JobEntry, StreamOp, StreamReply,
};
use pelican_model::status::{ErrorClass, JobOutcome};
use pelican_model::time::Timestamp;
use pelican_model::world::Issuer;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// Handles `entry` (read or reclaimed by `worker`) to its end: claim, run the
/// job with heartbeats, write the outcome, acknowledge, exactly as the core's
/// [`Delivery`] decides.
pub(crate) async fn deliver<S, D, P, X>(
    io: &Io<S, D, P>,
    executor: &X,
    worker: WorkerId,
    entry: EntryId,
    job: JobEntry,
    nth: u32,
) -> DeliveryEnd
where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    let role = RoleId::Delivery(worker, entry, nth);
    let entropy = io.entropy.next_u64();
    let start = io.now();
    if io.probe.keeps_roles() {
        io.probe.started(&role, &begun(start, entry, &job, entropy));
    }
    let mut d = Delivery::new(start, &io.config.policy, worker, entry, job, entropy);
    // The outstanding server call, pinned here once: each call's future is
    // set into it in place (no allocation per call).
    let call = Fuse::terminated();
    tokio::pin!(call);
    // The running job's task, and when it started.
    let mut running: Option<(tokio::task::JoinHandle<JobOutcome>, Instant)> = None;
    // A job that ended at its first poll: its outcome, and when it started.
    let mut ended: Option<(JobOutcome, Instant)> = None;
    let mut timer = None;
    loop {
        while let Some(command) = d.poll() {
            match command {
                Command::Db(_) | Command::Stream(_) => {
                    debug_assert!(call.is_terminated(), "a role has one call outstanding");
                    before_call(&command);
                    let by = Issuer {
                        worker: Some(worker),
                        own_fence: d.own_fence(),
                    };
                    call.set(io.run_at(&role, command, by).fuse());
                }
                Command::Execute(execution) => {
                    if io.probe.keeps_roles() {
                        io.probe.sent(&role, &Command::Execute(execution.clone()));
                    }
                    io.probe.executing(&role, &execution, d.own_fence());
                    match start_job(io, executor, execution).await {
                        Started::Ended(outcome, at) => ended = Some((outcome, at)),
                        Started::Running(task, at) => running = Some((task, at)),
                    }
                }
                Command::Abort => {
                    io.probe.sent(&role, &Command::Abort);
                    if let Some((job, _)) = running.take() {
                        job.abort();
                    }
                }
                Command::SetTimer(at) => {
                    io.probe.sent(&role, &Command::SetTimer(at));
                    timer = Some(at);
                }
            }
        }
        if d.is_done() {
            let end = d.end().expect("done deliveries have ended");
            io.probe.delivery_end(worker, entry, end);
            return end;
        }
        // The heartbeat timer matters only while the job runs; a timer left
        // over from then must not reach a later phase.
        if !d.is_executing() {
            timer = None;
        }
        let (at, input) = if let Some((outcome, started)) = ended.take() {
            executed(io, &role, outcome, started)
        } else {
            tokio::select! {
                biased;
                (at, input) = call.as_mut(), if !call.is_terminated() => after_call(at, input),
                outcome = maybe(running.as_mut().map(|(job, _)| job)) => {
                    let (_, started) = running.take().expect("the branch ran a job");
                    executed(io, &role, joined(outcome), started)
                }
                () = io.sleep_until(timer.unwrap_or_default()), if timer.is_some() => {
                    timer = None;
                    let at = io.now();
                    io.probe.received(&role, at, &Input::Timer);
                    (at, Input::Timer)
                }
            }
        };
        d.handle(at, input);
    }
}

/// The crash points before a delivery's call: before an XACK, and a
/// stall right before an outcome write (armed as `before_write=sleep(MS)`:
/// the delivery's thread blocks, its lease runs out, another worker takes
/// the run, then the late write goes out).
fn before_call(command: &Command) {
    if matches!(command, Command::Stream(StreamOp::Ack { .. })) {
        crate::crash_point!("before_ack");
    }
    if let Command::Db(op) = command
        && op.fenced_write().is_some()
        && !matches!(op, DbOp::Heartbeat { .. })
    {
        #[cfg(feature = "failpoints")]
        fail::fail_point!("before_write");
    }
}

/// The crash point after an XACK's answer, then the answer.
fn after_call(at: Timestamp, input: Input) -> (Timestamp, Input) {
    if matches!(input, Input::Stream(Ok(StreamReply::Acked(_)))) {
        crate::crash_point!("after_ack");
    }
    (at, input)
}

/// A delivery's start, as a probe that keeps roles records it.
fn begun(now: Timestamp, entry: EntryId, job: &JobEntry, entropy: u64) -> super::Start {
    super::Start::Delivery {
        now,
        entry,
        job: job.clone(),
        entropy,
    }
}

/// A job's task's outcome, or a panic's if the task ended abnormally.
fn joined(outcome: Result<JobOutcome, tokio::task::JoinError>) -> JobOutcome {
    outcome.unwrap_or_else(|e| JobOutcome::Failed {
        class: ErrorClass::Panic,
        message: format!("job task ended abnormally: {e}"),
    })
}

/// A job just started, and when.
enum Started {
    /// It ended at its first poll, with this outcome.
    Ended(JobOutcome, Instant),
    /// It waits, on a task of its own.
    Running(tokio::task::JoinHandle<JobOutcome>, Instant),
}

/// Starts `execution`'s job. The first poll runs here: a job that ends at
/// once (a no-op, an answer from its ledger) costs no task and no timer.
/// One that waits moves to a task of its own, so that it runs beside its
/// delivery's heartbeats, bounded by the kind's attempt timeout or the
/// run's budget when shorter than the driver's job timeout.
async fn start_job<S, D, P, X>(io: &Io<S, D, P>, executor: &X, execution: Execution) -> Started
where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    let (ms, class) = match execution.limit {
        Some(l) if l.ms < io.config.job_timeout_ms => (l.ms, l.class),
        _ => (io.config.job_timeout_ms, ErrorClass::Retryable),
    };
    let started = Instant::now();
    let mut job = AssertUnwindSafe(executor.execute(execution)).catch_unwind();
    match std::future::poll_fn(|cx| Poll::Ready(job.poll_unpin(cx))).await {
        Poll::Ready(result) => Started::Ended(settled(result), started),
        Poll::Pending => {
            // The limit counts from the first poll.
            let left = Duration::from_millis(ms).saturating_sub(started.elapsed());
            let task = tokio::spawn(async move {
                match tokio::time::timeout(left, job).await {
                    Ok(result) => settled(result),
                    Err(_) => timed_out(class, ms),
                }
            });
            Started::Running(task, started)
        }
    }
}

/// A job's outcome, reported and turned into its delivery's input.
fn executed<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    role: &RoleId,
    outcome: JobOutcome,
    started: Instant,
) -> (Timestamp, Input) {
    io.probe.job_ended(role, &outcome, started.elapsed());
    let input = Input::Executed(outcome);
    let at = io.now();
    io.probe.received(role, at, &input);
    (at, input)
}

/// A job's outcome, a panic being a `Panic`-class failure.
fn settled(result: std::thread::Result<JobOutcome>) -> JobOutcome {
    result.unwrap_or_else(|panic| JobOutcome::Failed {
        class: ErrorClass::Panic,
        message: panic_message(&panic),
    })
}

/// The outcome of a job stopped at its limit of `ms`: `class` is the
/// run's budget's or the attempt's.
fn timed_out(class: ErrorClass, ms: u64) -> JobOutcome {
    let message = if class == ErrorClass::BudgetExhausted {
        format!("the run's elapsed budget ran out {ms} ms into this attempt")
    } else {
        format!("job timed out after {ms} ms")
    };
    JobOutcome::Failed { class, message }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    format!("job panicked: {text}")
}
