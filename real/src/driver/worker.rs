//! The worker process: a reader, a reclaimer and a maintenance loop sharing
//! `in_flight_max` job slots, each delivery in its own task.

use super::{Config, DbClient, Io, Probe, RoleId, StreamClient};
use crate::jobs::Executor;
use pelican_model::ids::{Partition, WorkerId};
use pelican_model::protocol::{
    Command, Input, JobEntry, Maintenance, MaintenanceTask, PassReport, Reclaimer, ReclaimerEvent,
    StreamOp, StreamReply,
};
use pelican_model::stream::StreamError;
use pelican_model::time::Timestamp;
use pelican_model::world::Issuer;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// One worker process.
pub struct Worker<S, D, P, X> {
    io: Arc<Io<S, D, P>>,
    executor: Arc<X>,
    id: WorkerId,
    maintenance: bool,
}

impl<S, D, P, X> Worker<S, D, P, X>
where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    /// A worker named `id` (its consumer name is `id.consumer()`). With
    /// `maintenance`, it also runs the retry scheduler, the outbox and the
    /// sweeper (safe to run in every worker: each step is a conditional
    /// statement).
    pub fn new(io: Arc<Io<S, D, P>>, executor: Arc<X>, id: WorkerId, maintenance: bool) -> Self {
        Worker {
            io,
            executor,
            id,
            maintenance,
        }
    }

    /// Runs until `shutdown` completes, then stops reading and reclaiming,
    /// lets in-flight jobs finish within `shutdown_grace_ms` and returns how
    /// many were still running (their entries stay pending, to be reclaimed).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> usize {
        let config = &self.io.config;
        let slots = Arc::new(Semaphore::new(config.in_flight_max));
        let (stop_tx, stop_rx) = watch::channel(false);
        let count = Arc::new(AtomicU32::new(0));
        let reclaim = tokio::spawn(reclaim_loop(
            self.io.clone(),
            self.executor.clone(),
            self.id,
            slots.clone(),
            stop_rx.clone(),
            count.clone(),
        ));
        let maintain = self
            .maintenance
            .then(|| tokio::spawn(maintenance_loop(self.io.clone(), self.id, stop_rx.clone())));
        tokio::select! {
            biased;
            () = shutdown => {}
            _ = futures_util::future::join_all(config.policy.all_partitions().map(|p| {
                read_loop(&self.io, &self.executor, self.id, p, &slots, &count)
            })) => {}
        }
        // Stop taking work. The reclaimer and the maintenance pass stop where
        // they are: every step they take is a conditional statement or a
        // claim that a later pass repeats, and entries they claimed but did
        // not start stay pending for another worker.
        let _ = stop_tx.send(true);
        reclaim.abort();
        if let Some(m) = maintain {
            m.abort();
        }
        let all = u32::try_from(config.in_flight_max).expect("in_flight_max fits in u32");
        let grace = Duration::from_millis(config.shutdown_grace_ms);
        match tokio::time::timeout(grace, slots.acquire_many(all)).await {
            Ok(_) => 0,
            Err(_) => config.in_flight_max - slots.available_permits(),
        }
    }
}

/// Starts a delivery task holding one slot.
fn spawn_delivery<S, D, P, X>(
    io: &Arc<Io<S, D, P>>,
    executor: &Arc<X>,
    worker: WorkerId,
    entry: pelican_model::ids::EntryId,
    job: JobEntry,
    permit: OwnedSemaphorePermit,
    count: &AtomicU32,
) where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    let (io, executor) = (io.clone(), executor.clone());
    let nth = count.fetch_add(1, Ordering::Relaxed);
    // Boxed: the delivery's future (3 KB, most of it its pinned server
    // call) is written to the heap once, and the task moves a pointer
    // through its stages instead of copying the future at each (2,500
    // fewer instructions per delivery, `xtask/worker-instructions.sh`).
    tokio::spawn(Box::pin(async move {
        super::delivery::deliver(&io, &*executor, worker, entry, job, nth).await;
        drop(permit);
    }));
}

/// XREADGROUP as many entries of `partition` as there are free slots,
/// forever. A worker runs one per partition: on a Redis Cluster, one read
/// cannot name keys of two slots.
///
/// The reader holds no slot while XREADGROUP blocks: it waits for one slot
/// to be free, reads up to the number free, and only then takes a slot per
/// entry it got (waiting, if the reclaimer took some meanwhile). A reader
/// that held its slots through a blocking read would leave the reclaimer no
/// room on an idle worker, exactly when reclaiming is its only work. Readers
/// of several partitions may each read into the same free slots; what one
/// got beyond them waits for slots, pending as a paused worker's would be.
async fn read_loop<S, D, P, X>(
    io: &Arc<Io<S, D, P>>,
    executor: &Arc<X>,
    worker: WorkerId,
    partition: Partition,
    slots: &Arc<Semaphore>,
    count: &AtomicU32,
) where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    let role = RoleId::Reader(worker, partition);
    let by = Issuer::worker(worker);
    let idle = Duration::from_millis(io.config.idle_poll_ms);
    loop {
        let room = match slots.acquire().await {
            Ok(_one) => 1 + slots.available_permits(),
            Err(_) => return,
        };
        let read = Command::Stream(StreamOp::Read {
            partition,
            consumer: worker.consumer(),
            count: room.min(io.config.read_count_max),
            now: io.now(),
        });
        match io.run(&role, read, by).await {
            Input::Stream(Ok(StreamReply::Entries(got))) => {
                let empty = got.is_empty();
                if !empty {
                    crate::crash_point!("after_receive");
                }
                for (id, job) in got {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    spawn_delivery(io, executor, worker, id, job, permit, count);
                }
                if empty {
                    tokio::time::sleep(idle).await;
                }
            }
            Input::Stream(Err(StreamError::NoGroup)) => {
                // Redis lost the stream or the group: recreate it; the
                // sweeper re-publishes from Postgres.
                let _ = io
                    .run(
                        &role,
                        Command::Stream(StreamOp::EnsureGroup { partition }),
                        by,
                    )
                    .await;
            }
            _ => tokio::time::sleep(idle).await,
        }
    }
}

/// Every `reclaim_every_ms`: XAUTOCLAIM stale deliveries into free slots and
/// recover the runs of deleted pending IDs.
async fn reclaim_loop<S, D, P, X>(
    io: Arc<Io<S, D, P>>,
    executor: Arc<X>,
    worker: WorkerId,
    slots: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
    count: Arc<AtomicU32>,
) where
    S: StreamClient,
    D: DbClient,
    P: Probe,
    X: Executor,
{
    let role = RoleId::Reclaimer(worker);
    let by = Issuer::worker(worker);
    let every = Duration::from_millis(io.config.reclaim_every_ms);
    let mut r = Reclaimer::new(&io.config.policy, worker);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(every) => {}
        }
        let (start, free) = (io.now(), slots.available_permits());
        io.probe
            .started(&role, &super::Start::Reclaim { now: start, free });
        r.start(start, free);
        while let Some(command) = r.poll() {
            let (at, input) = io.run_at(&role, command, by).await;
            r.handle(at, input);
            while let Some(event) = r.poll_event() {
                match event {
                    ReclaimerEvent::Deliver(id, job) => {
                        // XAUTOCLAIM made these ours: wait for a slot.
                        let Ok(permit) = slots.clone().acquire_owned().await else {
                            return;
                        };
                        spawn_delivery(&io, &executor, worker, id, job, permit, &count);
                    }
                    ReclaimerEvent::Trimmed(_) => {}
                }
            }
            let held: BTreeSet<_> = r.unrecovered().collect();
            io.probe.reclaimer_holds(worker, &held);
        }
    }
}

/// Every `maintenance_every_ms`, a round: promote due retries, publish the
/// outbox, delete runs past their keep, and every [`sweep_every_passes`]
/// rounds sweep for orphaned runs; then trim the streams. Between rounds,
/// the scheduler's and the retry pass every `promote_every_ms`
/// ([`promote_until`]).
///
/// A task whose pass came back full ([`PassReport::full`]) runs its next
/// pass at once, for up to `maintenance_every_ms`; one still behind after
/// that slice is due again in the next round, which then starts without
/// the pause. So a backlog (a Redis wipe's, a burst of finished runs) is
/// worked off at the pace of the servers, and no task starves the others.
async fn maintenance_loop<S, D, P>(
    io: Arc<Io<S, D, P>>,
    worker: WorkerId,
    mut stop: watch::Receiver<bool>,
) where
    S: StreamClient,
    D: DbClient,
    P: Probe,
{
    let every = Duration::from_millis(io.config.maintenance_every_ms);
    let sweep_every = sweep_every_passes(&io.config);
    // One loop for the worker's life: the sweeper's cursor lives in it.
    let mut m = Maintenance::new(&io.config.policy);
    let mut behind: BTreeSet<MaintenanceTask> = BTreeSet::new();
    // The next tick a schedules pass planned, to wake for.
    let mut tick: Option<tokio::time::Instant> = None;
    for round in 1_u64.. {
        if behind.is_empty() {
            let end = tokio::time::Instant::now() + every;
            if !promote_until(&io, worker, (&mut m, &mut tick), &mut stop, end).await {
                return;
            }
        }
        let sweep = round % sweep_every == 0 || behind.contains(&MaintenanceTask::Sweep);
        behind.clear();
        for task in MaintenanceTask::ALL {
            // The consumers' housekeeping looks at idle times far longer
            // than a round: it keeps the sweep's pace.
            if matches!(task, MaintenanceTask::Sweep | MaintenanceTask::Consumers) && !sweep {
                continue;
            }
            let slice = tokio::time::Instant::now() + every;
            while pass(&io, worker, &mut m, task, &mut tick).await.full {
                if tokio::time::Instant::now() >= slice {
                    behind.insert(task);
                    break;
                }
            }
        }
        if io.config.retention_ms > 0 {
            let before = Timestamp(io.now().0.saturating_sub(io.config.retention_ms));
            let by = Issuer::worker(worker);
            for partition in io.config.policy.all_partitions() {
                let retain = Command::Stream(StreamOp::Retain { partition, before });
                let _ = io.run(&RoleId::Retention(worker), retain, by).await;
            }
        }
    }
}

/// Until `end`, the scheduler's pass and then the retry pass every
/// `promote_every_ms` (on maintenance loop `m`), so that a schedule's due
/// tick makes its run, and a due retry, delayed run or tick's run is
/// queued, within that, not within a round; passes that come back full go
/// on at once. A schedules pass that planned a next tick sooner than the
/// period wakes the loop as it falls ([`PassReport::next_tick_in_ms`]):
/// a steady schedule's ticks are handled as they fall. `false`: the
/// worker is stopping.
async fn promote_until<S, D, P>(
    io: &Io<S, D, P>,
    worker: WorkerId,
    (m, tick): (&mut Maintenance, &mut Option<tokio::time::Instant>),
    stop: &mut watch::Receiver<bool>,
    end: tokio::time::Instant,
) -> bool
where
    S: StreamClient,
    D: DbClient,
    P: Probe,
{
    let period = Duration::from_millis(io.config.promote_every_ms.max(1));
    loop {
        let now = tokio::time::Instant::now();
        let next = tick.map_or(now + period, |t| t.min(now + period)).min(end);
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return false,
            () = tokio::time::sleep_until(next) => {}
        }
        if next >= end {
            return true;
        }
        // A tick this wake was for is handled now; a later one is kept.
        *tick = tick.filter(|t| *t > tokio::time::Instant::now());
        for task in [MaintenanceTask::Schedules, MaintenanceTask::Retries] {
            while pass(io, worker, m, task, tick).await.full && tokio::time::Instant::now() < end {}
        }
    }
}

/// One maintenance pass of `task` ([`super::maintain`]); a schedules pass
/// that planned a next tick keeps the earliest in `tick`, to wake for.
async fn pass<S, D, P>(
    io: &Io<S, D, P>,
    worker: WorkerId,
    m: &mut Maintenance,
    task: MaintenanceTask,
    tick: &mut Option<tokio::time::Instant>,
) -> PassReport
where
    S: StreamClient,
    D: DbClient,
    P: Probe,
{
    // The pass's read is its first statement: its clock is about the
    // pass's start. The wake comes a few ms after the tick: one before it
    // finds the tick not yet due, and the next is a period away.
    let started = tokio::time::Instant::now() + TICK_MARGIN;
    let report = super::maintain(io, worker, m, task).await;
    if let Some(ms) = report.next_tick_in_ms {
        // At least a millisecond on (no pass twice at once), at most an
        // hour (a schedule with no tick left plans one at the end of time).
        let at = started + Duration::from_millis(ms.clamp(1, 3_600_000));
        *tick = Some(tick.map_or(at, |t| t.min(at)));
    }
    report
}

/// How long after a planned tick the scheduler wakes for it
/// ([`promote_until`]): past the gap between the pass's start and its read,
/// so that the tick is due by Postgres's clock when the pass reads.
const TICK_MARGIN: Duration = Duration::from_millis(3);

/// How many maintenance passes apart the sweeps run: about a quarter of the
/// sweep grace, and at least every pass.
///
/// The sweeper looks for runs published, or left with an expired lease, more
/// than `sweep_grace_ms` ago; its query reads the live runs (`runs_live`),
/// a batch at a time from its cursor, and it calls Redis for each
/// batch of candidates. Running it every quarter of the grace delays a
/// recovery by at most that quarter, and the sweeper is the last resort
/// anyway (the reclaimer and the outbox recover the common cases); a sweep
/// that found a full batch goes on in the next round. Retention runs
/// every round. The model lets maintenance tasks run in any order and as
/// often as they like, so sweeping less often, or again at once, is one of
/// the behaviours it checks.
fn sweep_every_passes(config: &Config) -> u64 {
    (config.policy.sweep_grace_ms / 4 / config.maintenance_every_ms.max(1)).max(1)
}

impl Config {
    /// Checks the knobs against each other.
    ///
    /// # Errors
    /// A text saying which knob is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let p = &self.policy;
        if self.in_flight_max == 0 || self.read_count_max == 0 {
            return Err("in_flight_max and read_count_max must be at least 1".into());
        }
        if p.heartbeat_ms == 0 || p.heartbeat_ms >= p.lease_ms {
            return Err(format!(
                "heartbeat_ms ({}) must be positive and below lease_ms ({})",
                p.heartbeat_ms, p.lease_ms
            ));
        }
        if self.call_timeout_ms >= p.lease_ms {
            return Err(format!(
                "call_timeout_ms ({}) must be below lease_ms ({}) so a renewal can answer in time",
                self.call_timeout_ms, p.lease_ms
            ));
        }
        if p.attempts_max == 0 {
            return Err("attempts_max must be at least 1".into());
        }
        if p.backoff_base_ms > p.backoff_cap_ms {
            return Err("backoff_base_ms must not exceed backoff_cap_ms".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, sweep_every_passes};

    fn passes(grace_ms: u64, every_ms: u64) -> u64 {
        let mut c = Config {
            maintenance_every_ms: every_ms,
            ..Config::default()
        };
        c.policy.sweep_grace_ms = grace_ms;
        sweep_every_passes(&c)
    }

    #[test]
    fn sweeps_about_every_quarter_of_the_grace() {
        assert_eq!(passes(120_000, 1_000), 30, "the defaults: every 30 s");
        assert_eq!(passes(4_000, 1_000), 1, "the simulator's: every pass");
        assert_eq!(passes(3_000, 300), 2, "the live tests': every 600 ms");
        assert_eq!(passes(100, 1_000), 1, "never less than every pass");
        assert_eq!(passes(120_000, 0), 30_000, "no division by zero");
    }
}
