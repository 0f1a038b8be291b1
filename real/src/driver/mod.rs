//! The driver: the clients it needs, its configuration, and the loops that
//! run the protocol's roles (see the crate docs).

pub use pelican_model::db::QueryError;
use pelican_model::db::{AnswerOf, Delay, Query};
use pelican_model::ids::{EntryId, Fence, Partition, RunId, WorkerId};
use pelican_model::protocol::{
    Command, DbOp, DbReply, Input, MaintenanceTask, Policy, StreamOp, StreamReply, Unavailable,
};
use pelican_model::stream::StreamError;
use pelican_model::time::Timestamp;
use pelican_model::world::Issuer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod batch;
mod delivery;
mod maintenance;
mod probe;
mod worker;

pub use batch::Batching;
pub use maintenance::{
    NewRun, Requeued, cancel, maintain, new_run_ids, requeue_dead, submit, submit_many,
};
pub use probe::{NoProbe, Probe};
pub use worker::Worker;

/// A boxed future, for trait objects.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A stream command's answer, or the server's error.
pub type StreamResult = Result<StreamReply, StreamError>;

/// Runs stream commands (one [`StreamOp`] each) on Redis or its model.
pub trait StreamClient: Send + Sync + 'static {
    /// Runs `op`. `Err(Unavailable)` when there is no answer: the caller
    /// cannot tell whether the command was applied.
    fn call(&self, op: StreamOp) -> impl Future<Output = Result<StreamResult, Unavailable>> + Send;

    /// Whether this client bounds the wait for `op`'s answer itself, so
    /// that the driver sets no deadline of its own (see
    /// [`Batching`]'s queues).
    fn bounds_wait(&self, op: &StreamOp) -> bool {
        let _ = op;
        false
    }

    /// Runs `ops` in order, each its own command (see [`Batching`]): all
    /// answers, or `Err(Unavailable)` when there is no answer, and then each
    /// command's sender knows as little as after a lost reply. The default
    /// runs them one by one; the bindings override it with one round trip.
    fn call_batch(
        &self,
        ops: Vec<StreamOp>,
    ) -> impl Future<Output = Result<Vec<StreamResult>, Unavailable>> + Send {
        one_by_one(ops, move |op| self.call(op))
    }
}

/// Runs SQL statements (one [`DbOp`] each) on Postgres or its model.
///
/// A binding implements [`DbClient::call`] (and, to send a batch as one
/// request, [`DbClient::call_batch`]): it gets the statement only. The
/// driver sends each command with who issued it ([`DbClient::call_as`]),
/// which a binding ignores (the defaults drop it); the simulator's client
/// overrides the `_as` methods to hand the issuer to the world, whose S3
/// check needs the issuing attempt's own fence.
pub trait DbClient: Send + Sync + 'static {
    /// Runs `op`. `Err(Unavailable)` when there is no answer.
    fn call(&self, op: DbOp) -> impl Future<Output = Result<DbReply, Unavailable>> + Send;

    /// Whether this client bounds the wait for `op`'s answer itself, so
    /// that the driver sets no deadline of its own (see
    /// [`Batching`]'s queues).
    fn bounds_wait(&self, op: &DbOp) -> bool {
        let _ = op;
        false
    }

    /// Runs the statement `q`: its typed answer.
    ///
    /// # Errors
    /// No answer ([`QueryError::Unavailable`]), or Postgres refused the
    /// values ([`QueryError::Unfit`]).
    fn query<Q: Query + Send>(
        &self,
        q: Q,
    ) -> impl Future<Output = Result<AnswerOf<Q>, QueryError>> + Send {
        let op: DbOp = q.into();
        let statement = op.statement();
        async move { Ok(Q::answer(statement, self.call(op).await?)?) }
    }

    /// Runs `ops` as a batch (what a batch means:
    /// [`pelican_model::Db::execute_batch`]): all answers, or
    /// `Err(Unavailable)` when there is no answer, and then each command's
    /// sender knows as little as after a lost reply. The default runs them
    /// one by one; the bindings send one request.
    fn call_batch(
        &self,
        ops: Vec<DbOp>,
    ) -> impl Future<Output = Result<Vec<DbReply>, Unavailable>> + Send {
        one_by_one(ops, move |op| self.call(op))
    }

    /// [`DbClient::call`], issued by `by` (see the trait's docs).
    fn call_as(
        &self,
        op: DbOp,
        by: Issuer,
    ) -> impl Future<Output = Result<DbReply, Unavailable>> + Send {
        let _ = by;
        self.call(op)
    }

    /// [`DbClient::call_batch`], each command with who issued it.
    fn call_batch_as(
        &self,
        ops: Vec<(DbOp, Issuer)>,
    ) -> impl Future<Output = Result<Vec<DbReply>, Unavailable>> + Send {
        self.call_batch(ops.into_iter().map(|(op, _)| op).collect())
    }
}

/// Sends `ops` through `call` one after another, in order: every answer,
/// or `Err(Unavailable)` at the first command without one (the batch
/// fallback of [`StreamClient::call_batch`] and [`DbClient::call_batch`]).
pub(crate) async fn one_by_one<O, R, F, Fut>(ops: Vec<O>, call: F) -> Result<Vec<R>, Unavailable>
where
    F: Fn(O) -> Fut,
    Fut: Future<Output = Result<R, Unavailable>>,
{
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        replies.push(call(op).await?);
    }
    Ok(replies)
}

/// The external tool service that job handlers send side effects to. It
/// applies each idempotency key at most once (S5).
pub trait Tools: Send + Sync + 'static {
    /// Applies side effect `call` of `run`, sent by the attempt holding
    /// `fence`, under idempotency `key`; answers whether this request
    /// applied it (false: the key was applied before).
    fn apply(
        &self,
        run: RunId,
        call: u32,
        fence: Fence,
        key: String,
    ) -> BoxFuture<Result<bool, Unavailable>>;
}

/// The driver's source of randomness (retry jitter). The live worker draws
/// from the OS; the simulator from the seed.
pub trait Entropy: Send + Sync + 'static {
    /// One random draw.
    fn next_u64(&self) -> u64;
}

/// Which role instance a command or input belongs to (for probes and traces).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RoleId {
    /// A worker's reader of one partition (XREADGROUP, group creation).
    Reader(WorkerId, Partition),
    /// A worker handling one delivery: its `n`th since the worker started
    /// (the same entry can be delivered to the same worker again while an
    /// earlier delivery of it still runs).
    Delivery(WorkerId, EntryId, u32),
    /// A worker's reclaimer.
    Reclaimer(WorkerId),
    /// A maintenance pass (retries, outbox, sweep) of a worker.
    Maintenance(WorkerId),
    /// The API submitting a run.
    Submitter(RunId),
    /// The API cancelling a run.
    Cancel(RunId),
    /// A worker's stream retention pass (a driver chore, not a protocol role).
    Retention(WorkerId),
}

/// How a role instance started: what the driver passed to its constructor
/// or its `start`, so that a trace can rebuild it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Start {
    /// `Delivery::new(now, policy, worker, entry, job, entropy)`.
    Delivery {
        /// When.
        now: Timestamp,
        /// The entry.
        entry: EntryId,
        /// What it says.
        job: pelican_model::protocol::JobEntry,
        /// The jitter draw.
        entropy: u64,
    },
    /// `Reclaimer::start(now, free)` (the reclaimer lives as long as its
    /// worker).
    Reclaim {
        /// When.
        now: Timestamp,
        /// Free slots.
        free: usize,
    },
    /// `Maintenance::new` then `start(now, task)`.
    Maintenance {
        /// When.
        now: Timestamp,
        /// Which pass.
        task: MaintenanceTask,
    },
    /// `Submitter::new(policy, run, kind, input, key)`, `traced(trace)`
    /// when given, `delayed(delay)`.
    Submit {
        /// The run.
        run: RunId,
        /// Its kind.
        kind: String,
        /// Its input.
        input: String,
        /// The client's idempotency key, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// The caller's `traceparent`, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<String>,
        /// When it may start ([`Delay::NONE`]: at once).
        #[serde(default, skip_serializing_if = "Delay::is_none")]
        delay: Delay,
    },
}

/// The driver's knobs, with units in their names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// The protocol's own knobs.
    pub policy: Policy,
    /// Jobs a worker runs at once (its reader and reclaimer share the slots).
    pub in_flight_max: usize,
    /// Entries one XREADGROUP asks for at most.
    pub read_count_max: usize,
    /// Pause after an empty read or an unavailable server.
    pub idle_poll_ms: u64,
    /// A call without an answer after this long is `Unavailable`.
    pub call_timeout_ms: u64,
    /// Reclaimer period.
    pub reclaim_every_ms: u64,
    /// Maintenance period (retry promotion, outbox, orphan sweep,
    /// retention); also the longest a task's passes run back to back
    /// while they come back full, before the other tasks get their turn.
    pub maintenance_every_ms: u64,
    /// Between maintenance rounds, the retry pass alone runs this often:
    /// the longest a due retry or delayed run waits to be queued (each
    /// pass is one indexed statement). At or above `maintenance_every_ms`,
    /// only the rounds run it.
    #[serde(default = "promote_every_ms")]
    pub promote_every_ms: u64,
    /// On shutdown, how long in-flight jobs may take to finish; the rest stay
    /// pending and are reclaimed by other workers.
    pub shutdown_grace_ms: u64,
    /// A job running longer than this is stopped and its attempt fails
    /// retryably (a hung handler would otherwise hold its run forever,
    /// heartbeating).
    pub job_timeout_ms: u64,
    /// Stream retention: each maintenance pass trims delivered, acknowledged
    /// entries older than this (0: keep every entry).
    pub retention_ms: u64,
    /// Shifts this process's clock (ms, may be negative): for tests of
    /// skewed clocks. Leases are Postgres's to judge, so a shifted worker
    /// takes no live lease.
    #[serde(default)]
    pub clock_offset_ms: i64,
}

fn promote_every_ms() -> u64 {
    100
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            in_flight_max: 16,
            read_count_max: 16,
            idle_poll_ms: 100,
            call_timeout_ms: 5_000,
            reclaim_every_ms: 5_000,
            maintenance_every_ms: 1_000,
            promote_every_ms: promote_every_ms(),
            shutdown_grace_ms: 30_000,
            job_timeout_ms: 3_600_000,
            retention_ms: 86_400_000,
            clock_offset_ms: 0,
        }
    }
}

/// What every loop of the driver shares: the clients, the probe, the entropy
/// source and the configuration.
pub struct Io<S, D, P> {
    /// The stream client.
    pub stream: S,
    /// The database client.
    pub db: D,
    /// The observer.
    pub probe: P,
    /// Randomness.
    pub entropy: Arc<dyn Entropy>,
    /// Knobs.
    pub config: Config,
}

impl<S: StreamClient, D: DbClient, P: Probe> Io<S, D, P> {
    /// This process's clock: [`now`], shifted by
    /// [`Config::clock_offset_ms`].
    #[must_use]
    pub fn now(&self) -> Timestamp {
        Timestamp(now().0.saturating_add_signed(self.config.clock_offset_ms))
    }

    /// Sleeps until `at` on [`Io::now`]'s clock (at once if it has passed).
    pub async fn sleep_until(&self, at: Timestamp) {
        let left = at.0.saturating_sub(self.now().0);
        tokio::time::sleep(Duration::from_millis(left)).await;
    }

    /// Runs the statement `q` as `role`'s command ([`Io::run`]): its typed
    /// answer.
    ///
    /// # Errors
    /// As [`DbClient::query`].
    pub async fn query<Q: Query>(
        &self,
        role: &RoleId,
        q: Q,
        by: Issuer,
    ) -> Result<AnswerOf<Q>, QueryError> {
        let op: DbOp = q.into();
        let statement = op.statement();
        match self.run(role, Command::Db(op), by).await {
            Input::Db(reply) => Ok(Q::answer(statement, reply)?),
            _ => Err(QueryError::Unavailable(Unavailable)),
        }
    }

    /// Runs one server command of `role` and turns its answer into the
    /// role's next input. Any other command is the caller's to run.
    ///
    /// # Panics
    /// On a command that is not `Db` or `Stream`.
    pub async fn run(&self, role: &RoleId, command: Command, by: Issuer) -> Input {
        self.run_at(role, command, by).await.1
    }

    /// As [`Io::run`], with the time the answer arrived: the role must
    /// handle it at that time (traces record it).
    ///
    /// # Panics
    /// On a command that is not `Db` or `Stream`.
    pub async fn run_at(&self, role: &RoleId, command: Command, by: Issuer) -> (Timestamp, Input) {
        self.probe.sent(role, &command);
        let timeout = Duration::from_millis(self.config.call_timeout_ms);
        let input = match command {
            Command::Db(op) => {
                let statement = op.name();
                // Heartbeats lost on the way (armed as `lose_heartbeat=return`):
                // the lease runs out while the job goes on, a zombie's life.
                #[cfg(feature = "failpoints")]
                let lost = matches!(op, DbOp::Heartbeat { .. })
                    && fail::eval("lose_heartbeat", |_| ()).is_some();
                #[cfg(not(feature = "failpoints"))]
                let lost = false;

                let input = if lost {
                    Input::Unavailable
                } else {
                    let bounded = self.db.bounds_wait(&op);
                    match within(timeout, bounded, self.db.call_as(op, by)).await {
                        Ok(reply) => Input::Db(reply),
                        Err(Unavailable) => Input::Unavailable,
                    }
                };
                self.probe.db_answered(role, statement, &input);
                input
            }
            Command::Stream(op) => {
                let bounded = self.stream.bounds_wait(&op);
                match within(timeout, bounded, self.stream.call(op)).await {
                    Ok(reply) => Input::Stream(reply),
                    Err(Unavailable) => Input::Unavailable,
                }
            }
            other => panic!("not a server command: {other:?}"),
        };
        let at = self.now();
        self.probe.received(role, at, &input);
        (at, input)
    }

    /// Runs the commands of many roles at once, each role's own command
    /// answered to it as [`Io::run_at`] answers one: the database commands
    /// of one statement as one batch ([`DbClient::call_batch`]: one fused
    /// statement where it has a batched form), the stream commands as one
    /// pipeline. A batch without an answer is a lost request or reply for
    /// each of its commands.
    pub async fn run_each(
        &self,
        commands: Vec<(RoleId, Command, Issuer)>,
    ) -> Vec<(Timestamp, Input)> {
        let timeout = Duration::from_millis(self.config.call_timeout_ms);
        let mut inputs = vec![Input::Unavailable; commands.len()];
        let mut db: BTreeMap<&'static str, Vec<(usize, DbOp, Issuer)>> = BTreeMap::new();
        let mut stream: Vec<(usize, StreamOp)> = Vec::new();
        for (i, (role, command, by)) in commands.iter().enumerate() {
            self.probe.sent(role, command);
            match command {
                Command::Db(op) => db.entry(op.name()).or_default().push((i, op.clone(), *by)),
                Command::Stream(op) => stream.push((i, op.clone())),
                other => panic!("not a server command: {other:?}"),
            }
        }
        for (statement, group) in db {
            // A scheduler slow between its read and its ticks' statements
            // (armed as `before_fire_tick=sleep(N)`): its plans are stale
            // when they land, and the compare-and-set must refuse them.
            #[cfg(feature = "failpoints")]
            if group.iter().any(|(_, op, _)| op.class().ticks.is_some()) {
                fail::fail_point!("before_fire_tick");
            }
            let (at, ops): (Vec<usize>, Vec<(DbOp, Issuer)>) =
                group.into_iter().map(|(i, op, by)| (i, (op, by))).unzip();
            if let Ok(Ok(replies)) = tokio::time::timeout(timeout, self.db.call_batch_as(ops)).await
            {
                for (i, reply) in at.iter().zip(replies) {
                    inputs[*i] = Input::Db(reply);
                }
            }
            for i in at {
                self.probe
                    .db_answered(&commands[i].0, statement, &inputs[i]);
            }
        }
        if !stream.is_empty() {
            let (at, ops): (Vec<usize>, Vec<StreamOp>) = stream.into_iter().unzip();
            if let Ok(Ok(replies)) =
                tokio::time::timeout(timeout, self.stream.call_batch(ops)).await
            {
                for (i, reply) in at.into_iter().zip(replies) {
                    inputs[i] = Input::Stream(reply);
                }
            }
        }
        let at = self.now();
        commands
            .iter()
            .zip(inputs)
            .map(|((role, _, _), input)| {
                self.probe.received(role, at, &input);
                (at, input)
            })
            .collect()
    }
}

/// The current time, from the system clock (madsim's clock under
/// `--cfg madsim`), in milliseconds since the Unix epoch.
#[must_use]
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Awaits `call`, given up after `timeout` unless the client bounds it
/// already (`bounded`: one timer fewer per call on the hot path).
async fn within<R>(
    timeout: Duration,
    bounded: bool,
    call: impl Future<Output = Result<R, Unavailable>>,
) -> Result<R, Unavailable> {
    if bounded {
        call.await
    } else {
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(Unavailable))
    }
}

/// Awaits the future if there is one, else never completes: for `select!`
/// over optional branches.
async fn maybe<F: Future + Unpin>(f: Option<&mut F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
