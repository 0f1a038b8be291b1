// Over 600 lines: the job-author API (re-exported by pelican-sdk): the registry and the job
// context with its steps, limits and progress, which share the context's ledger.
//! Job handlers: the [`Executor`] the driver starts jobs with, a [`Registry`]
//! of handlers by job kind for library users, and the built-in kinds that
//! make the binary and the simulator useful on their own.
//!
//! Built-in kinds (input is JSON):
//!
//! | kind | input | does |
//! |---|---|---|
//! | `noop` | anything | succeeds at once |
//! | `sleep` | `{"ms": N}` | sleeps N ms, succeeds |
//! | `fail` | `{"class": "retryable"\|"terminal"\|"unknown", "times": N, "ms": M}` | after M ms, fails the first N attempts with that class, then succeeds |
//! | `panic` | `{"times": N}` | panics in the first N attempts, then succeeds |
//! | `effect` | `{"calls": K, "ms": M}` | performs K side effects through the tool service, M ms apart, each keyed by (run, call), reporting `{"done": n, "of": K}` after each |
//! | `echo` | `{"text": S}` | succeeds with S itself as its result text (not JSON-encoded): a handler's raw result, for tests of what Postgres stores |
//! | `steps` | `{"calls": K, "ms": M}` | as `effect`, each side effect in a durable step of its own (`call-0`, `call-1`, ...): a later attempt replays the recorded ones |
//! | `limited` | `{"provider": P, "ms": M}` | waits for provider P's limits ([`JobContext::limit`]), holds its permit M ms; its result is when (`started_ms`, `ended_ms`, the worker's clock) |
//!
//! Handlers run at least once per attempt that reaches them and may run
//! again after a crash: a handler's side effects must go through
//! [`JobContext::apply`], whose idempotency key makes them happen once (S5).
//! Work a later attempt should not redo goes in a durable step
//! ([`JobContext::step`]): its output is recorded in Postgres under the
//! attempt's fence and replayed by later attempts (S11).

pub use crate::driver::BoxFuture;
use crate::driver::{DbClient, Tools};
use crate::telemetry::RunTrace;
use pelican_model::db::{AnswerOf, Query, QueryError, query};
pub use pelican_model::ids::{Fence, RunId};
use pelican_model::protocol::{
    DbOp, DbReply, Execution, Ledger, Policy, ProgressError, StepError, StepPlan, Unavailable,
};
pub use pelican_model::protocol::{KindPolicy, ProviderLimit};
pub use pelican_model::status::{ErrorClass, JobOutcome};
use pelican_model::world::Issuer;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

mod builtins;

pub use builtins::{PANIC_ON_PURPOSE, effects_of};
use builtins::{echo, effect, fail, limited, noop, panic, sleep, steps};

/// How soon a call that found every slot of its provider held asks again:
/// at first, and at the most (the wait doubles in between).
const SLOT_POLL_MS: (u64, u64) = (10, 200);

/// Postgres as a job sees it: the statements of its run's execution
/// ledger ([`Ledger`]). Every [`DbClient`] that can be cloned is one.
pub trait LedgerStore: Send + Sync + 'static {
    /// Runs `op`, issued by `by` (see [`DbClient::call_as`]: a binding
    /// ignores `by`; the simulator's world checks the attempt's own fence).
    fn call(&self, op: DbOp, by: Issuer) -> BoxFuture<Result<DbReply, Unavailable>>;
}

impl<D: DbClient + Clone> LedgerStore for D {
    fn call(&self, op: DbOp, by: Issuer) -> BoxFuture<Result<DbReply, Unavailable>> {
        let db = self.clone();
        Box::pin(async move { DbClient::call_as(&db, op, by).await })
    }
}

/// A handler's own failure: its class decides what happens to the run.
/// Made by [`JobError::retryable`], [`JobError::unknown`] or
/// [`JobError::terminal`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct JobError {
    /// Retryable, terminal, ...
    pub class: ErrorClass,
    /// What went wrong, for people.
    pub message: String,
}

impl JobError {
    /// Worth another attempt after back-off.
    pub fn retryable(message: impl Into<String>) -> JobError {
        JobError {
            class: ErrorClass::Retryable,
            message: message.into(),
        }
    }

    /// Not known to be worth retrying: retried up to the policy's cap
    /// (`--unknown-retries-max`), then the run fails.
    pub fn unknown(message: impl Into<String>) -> JobError {
        JobError {
            class: ErrorClass::Unknown,
            message: message.into(),
        }
    }

    /// Retrying cannot help: the run fails.
    pub fn terminal(message: impl Into<String>) -> JobError {
        JobError {
            class: ErrorClass::Terminal,
            message: message.into(),
        }
    }
}

impl From<JobError> for JobOutcome {
    fn from(e: JobError) -> JobOutcome {
        JobOutcome::Failed {
            class: e.class,
            message: e.message,
        }
    }
}

/// Why [`JobContext::step`] did not return the step's output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepFailed {
    /// The step's own work failed (nothing was recorded).
    #[error("{0}")]
    Body(#[from] JobError),
    /// The ledger refused: steps asked for out of order, an output too
    /// large, a record refused or unanswered.
    #[error(transparent)]
    Ledger(#[from] StepError),
    /// The output does not serialize, or a recorded output does not
    /// deserialize into the type asked for (the type changed since).
    #[error("step {name:?}: {error}")]
    Json {
        /// The step.
        name: String,
        /// serde_json's message.
        error: String,
    },
}

impl From<StepFailed> for JobOutcome {
    fn from(e: StepFailed) -> JobOutcome {
        match e {
            StepFailed::Body(e) => e.into(),
            StepFailed::Ledger(e) => e.outcome(),
            StepFailed::Json { .. } => JobOutcome::Failed {
                class: ErrorClass::Terminal,
                message: e.to_string(),
            },
        }
    }
}

/// Starts jobs for the driver.
pub trait Executor: Send + Sync + 'static {
    /// The job's future. The driver polls it once in place (a job that
    /// ends there needs no task), spawns it if it waits, turns a panic
    /// into a `Panic`-class failure and drops it on abort. Its first poll
    /// runs before the delivery's next heartbeat, so it must not block.
    fn execute(&self, execution: Execution) -> BoxFuture<JobOutcome>;
}

/// What a handler gets: the attempt, its input, and the tool service.
#[derive(Clone)]
pub struct JobContext {
    /// The run.
    pub run: RunId,
    /// This attempt's fence.
    pub fence: Fence,
    /// This attempt's number (1-based).
    pub attempt: u32,
    /// The job input (JSON text).
    pub input: String,
    trace: RunTrace,
    tools: Arc<dyn Tools>,
    store: Arc<dyn LedgerStore>,
    /// This attempt's ledger, read at its first step.
    ledger: Arc<tokio::sync::Mutex<Option<Ledger>>>,
    policy: Arc<Policy>,
    tool_timeout: Duration,
    hook: Option<Arc<dyn StepHook>>,
    limits: Arc<BTreeMap<String, ProviderLimit>>,
    permits: Arc<AtomicU32>,
}

/// Leave to call a limited provider ([`JobContext::limit`]): holds one of
/// its slots until dropped or [`Permit::release`]d.
#[must_use = "the slot is freed when the permit is dropped"]
pub struct Permit {
    held: Option<(Arc<dyn LedgerStore>, query::ReleaseSlot, Issuer)>,
}

impl Permit {
    /// Frees the slot now, and waits for Postgres to take it back (a drop
    /// frees it in the background).
    pub async fn release(mut self) {
        if let Some((store, op, by)) = self.held.take() {
            let _ = store.call(op.into(), by).await;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some((store, op, by)) = self.held.take() {
            tokio::spawn(async move {
                let _ = store.call(op.into(), by).await;
            });
        }
    }
}

/// Where a durable step is in its life, for a [`StepHook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepBoundary {
    /// The step is not recorded: its body is about to run.
    Starting,
    /// The body returned an output, not yet recorded.
    Ran,
    /// Postgres took the record.
    Recorded,
}

/// Sees every step of every job cross its boundaries: the simulator checks
/// S11 at [`StepBoundary::Starting`] and crashes workers at each boundary.
/// The step waits for the returned future.
pub trait StepHook: Send + Sync + 'static {
    /// Step `step` (`name`) of `run`'s attempt under `fence` is at `at`.
    fn at(
        &self,
        run: RunId,
        fence: Fence,
        step: u32,
        name: &str,
        at: StepBoundary,
    ) -> BoxFuture<()>;
}

/// Why a side effect could not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the tool service did not answer")]
pub struct ToolUnavailable;

impl JobContext {
    /// The W3C `traceparent` of this attempt's span: send it as the
    /// [`TRACEPARENT`](crate::telemetry::TRACEPARENT) header of the
    /// requests the job makes, and the services it calls join the run's
    /// trace under this attempt.
    #[must_use]
    pub fn traceparent(&self) -> String {
        self.trace.attempt_parent(self.fence)
    }

    /// The run's trace: which, and the ids of this run's spans.
    #[must_use]
    pub fn trace(&self) -> RunTrace {
        self.trace
    }

    /// Performs side effect `call` (0, 1, ...) of this run through the tool
    /// service, under the idempotency key `(run, call)`: a later attempt
    /// sending the same call is not applied twice. Answers whether this
    /// request applied it.
    ///
    /// # Errors
    /// The tool service did not answer: the effect may or may not be applied;
    /// fail the attempt retryably and the retry sends the same key.
    pub async fn apply(&self, call: u32) -> Result<bool, ToolUnavailable> {
        let key = self.policy.idempotency_key(self.run, call, self.fence);
        let sent = self.tools.apply(self.run, call, self.fence, key);
        match tokio::time::timeout(self.tool_timeout, sent).await {
            Ok(Ok(applied)) => {
                crate::crash_point!("after_effect");
                Ok(applied)
            }
            _ => Err(ToolUnavailable),
        }
    }
}

impl JobContext {
    /// Runs `body` as the durable step `name`, or replays it.
    ///
    /// The first time an attempt of this run asks for step `name` at this
    /// point of the job (steps are numbered in the order they are asked
    /// for), `body` runs and its output is recorded in Postgres under this
    /// attempt's fence before it is returned. A later attempt asking for
    /// the same step gets the recorded output without running `body`.
    /// Steps are taken one at a time; a job must ask for them in the same
    /// order on every attempt. What `body` does outside Pelican must carry
    /// [`JobContext::idempotency_key`]: an attempt can die between the
    /// work and its record, and the next attempt then runs `body` again.
    ///
    /// # Errors
    /// `body`'s own error (nothing recorded); steps asked for in another
    /// order than before, an output larger than the policy's
    /// `value_bytes_max` (the run fails); a record refused because a later
    /// attempt holds the run, or not answered (the attempt fails
    /// retryably). `JobOutcome::from` turns each into the right outcome.
    ///
    /// ```
    /// use pelican_real::jobs::{JobContext, JobError, Registry, StepFailed};
    /// # async fn call_model(input: &str) -> Result<String, JobError> { Ok(input.into()) }
    /// # async fn send_mail(plan: &str, key: &str) -> Result<(), JobError> { Ok(()) }
    /// async fn agent(ctx: JobContext) -> Result<bool, StepFailed> {
    ///     let plan: String = ctx.step("plan", call_model(&ctx.input)).await?;
    ///     let key = ctx.idempotency_key("send");
    ///     ctx.step("send", send_mail(&plan, &key)).await?;
    ///     Ok(true)
    /// }
    /// fn register(registry: &mut Registry) {
    ///     registry.register("agent", agent);
    /// }
    /// ```
    pub async fn step<T, Fut>(&self, name: &str, body: Fut) -> Result<T, StepFailed>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, JobError>>,
    {
        let json = |error: serde_json::Error| StepFailed::Json {
            name: name.to_owned(),
            error: error.to_string(),
        };
        let by = Issuer {
            worker: None,
            own_fence: Some(self.fence),
        };
        let mut slot = self.ledger.lock().await;
        if slot.is_none() {
            let Ok(recorded) = self.ledger_query(Ledger::read(self.run), by).await else {
                let name = name.to_owned();
                return Err(StepError::Unavailable { name }.into());
            };
            *slot = Some(Ledger::new(&self.policy, self.run, self.fence, recorded));
        }
        let ledger = slot.as_mut().expect("read above");
        match ledger.plan(name)? {
            StepPlan::Replay(output) => serde_json::from_str(&output).map_err(json),
            StepPlan::Run(index) => {
                self.at(index, name, StepBoundary::Starting).await;
                let value = body.await?;
                self.at(index, name, StepBoundary::Ran).await;
                let output = serde_json::to_string(&value).map_err(json)?;
                let record = ledger.record(index, name, output)?;
                let recorded = ledger.recorded(name, self.ledger_query(record, by).await);
                if recorded.is_ok() {
                    crate::crash_point!("after_step_record");
                    self.at(index, name, StepBoundary::Recorded).await;
                }
                recorded?;
                Ok(value)
            }
        }
    }

    /// Waits for leave to call `provider` under its limits (registered
    /// with [`Registry::limit`], or `--provider-limit`): a free slot of
    /// its concurrency limit, then a token of its rate limit. Hold the
    /// permit while the call is in flight. A provider without limits
    /// answers at once.
    ///
    /// # Errors
    /// Postgres did not answer: a retryable error.
    ///
    /// ```
    /// use pelican_real::jobs::{JobContext, JobError};
    /// # async fn call_model(input: &str) -> Result<String, JobError> { Ok(input.into()) }
    /// async fn ask(ctx: &JobContext) -> Result<String, JobError> {
    ///     let permit = ctx.limit("model-provider").await?;
    ///     let answer = call_model(&ctx.input).await;
    ///     permit.release().await;
    ///     answer
    /// }
    /// ```
    pub async fn limit(&self, provider: &str) -> Result<Permit, JobError> {
        let mut permit = Permit { held: None };
        let Some(limit) = self.limits.get(provider).copied() else {
            return Ok(permit);
        };
        let by = Issuer {
            worker: None,
            own_fence: Some(self.fence),
        };
        let unanswered = || {
            JobError::retryable(format!(
                "the limits of provider {provider:?} could not be checked: Postgres did not answer"
            ))
        };
        let n = self.permits.fetch_add(1, Ordering::Relaxed);
        let holder = ProviderLimit::holder(self.run, self.fence, n);
        if let Some(acquire) = limit.acquire(&self.policy, provider, &holder) {
            let (mut ensured, mut poll_ms) = (false, SLOT_POLL_MS.0);
            loop {
                match self.ledger_query(acquire.clone(), by).await {
                    Ok(1) => break,
                    Ok(_) if !ensured => {
                        let ensure = limit.ensure(provider).expect("a concurrency limit");
                        self.ledger_query(ensure, by)
                            .await
                            .map_err(|_| unanswered())?;
                        ensured = true;
                    }
                    Ok(_) => {
                        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
                        poll_ms = (poll_ms * 2).min(SLOT_POLL_MS.1);
                    }
                    Err(_) => return Err(unanswered()),
                }
            }
            crate::crash_point!("after_permit");
            let release = ProviderLimit::release(provider, &holder);
            permit.held = Some((self.store.clone(), release, by));
        }
        if let (Some(take), Some(interval_ns)) = (limit.take_token(provider), limit.interval_ns()) {
            loop {
                match self.ledger_query(take.clone(), by).await {
                    Ok(1) => break,
                    Ok(_) => tokio::time::sleep(Duration::from_nanos(interval_ns)).await,
                    Err(_) => return Err(unanswered()),
                }
            }
        }
        Ok(permit)
    }

    /// Reports progress: `value`, as JSON, becomes the run's next event
    /// (`GET /runs/{id}/events`, `pelican watch`), written under this
    /// attempt's fence. Once a later attempt holds the run, or this one
    /// has ended, its progress is refused.
    ///
    /// # Errors
    /// Refused (this attempt no longer holds the run) or unanswered: a
    /// retryable error, though the attempt's outcome will be refused too
    /// if it was refused; larger than the policy's `value_bytes_max`, or
    /// not serializable: an error of class `unstorable`.
    ///
    /// ```
    /// use pelican_real::jobs::{JobContext, JobError};
    /// async fn index(ctx: JobContext) -> Result<u32, JobError> {
    ///     for page in 0..3 {
    ///         ctx.progress(&serde_json::json!({"page": page, "of": 3})).await?;
    ///     }
    ///     Ok(3)
    /// }
    /// ```
    pub async fn progress<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), JobError> {
        let unstorable = |message: String| JobError {
            class: ErrorClass::Unstorable,
            message,
        };
        let data = serde_json::to_string(value)
            .map_err(|e| unstorable(format!("a progress event does not serialize: {e}")))?;
        let event = pelican_model::protocol::progress(&self.policy, self.run, self.fence, data)
            .map_err(|e| unstorable(e.to_string()))?;
        let by = Issuer {
            worker: None,
            own_fence: Some(self.fence),
        };
        let answer = self.ledger_query(event, by).await;
        pelican_model::protocol::progressed(answer).map_err(|e| match e {
            ProgressError::TooLarge { .. } => unstorable(e.to_string()),
            ProgressError::Refused | ProgressError::Unavailable => {
                JobError::retryable(e.to_string())
            }
        })
    }

    /// A ledger statement's typed answer: unavailable when Postgres does
    /// not answer within the call timeout.
    async fn ledger_query<Q: Query>(&self, q: Q, by: Issuer) -> Result<AnswerOf<Q>, QueryError> {
        let op: DbOp = q.into();
        let statement = op.statement();
        let call = self.store.call(op, by);
        let reply = tokio::time::timeout(self.tool_timeout, call)
            .await
            .map_err(|_| Unavailable)??;
        Ok(Q::answer(statement, reply)?)
    }

    async fn at(&self, step: u32, name: &str, at: StepBoundary) {
        if let Some(hook) = &self.hook {
            hook.at(self.run, self.fence, step, name, at).await;
        }
    }

    /// The idempotency key for what step `name` sends outside Pelican: the
    /// same on every attempt of this run.
    #[must_use]
    pub fn idempotency_key(&self, name: &str) -> String {
        self.policy.step_key(self.run, name)
    }
}

/// What a handler may return: a [`JobOutcome`], or a `Result` whose
/// value is the run's result (as JSON) and whose error says how it failed
/// (so that handlers can use `?` on steps).
pub trait IntoOutcome {
    /// The attempt's outcome.
    fn into_outcome(self) -> JobOutcome;
}

impl IntoOutcome for JobOutcome {
    fn into_outcome(self) -> JobOutcome {
        self
    }
}

impl<T: Serialize, E: Into<JobOutcome>> IntoOutcome for Result<T, E> {
    fn into_outcome(self) -> JobOutcome {
        match self.map(|value| serde_json::to_string(&value)) {
            Ok(Ok(result)) => JobOutcome::Succeeded { result },
            Ok(Err(e)) => JobOutcome::Failed {
                class: ErrorClass::Terminal,
                message: format!("the result does not serialize: {e}"),
            },
            Err(e) => e.into(),
        }
    }
}

/// A job handler: any `async fn(JobContext) -> O` where `O` is a
/// [`JobOutcome`] or a `Result` ([`IntoOutcome`]).
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt.
    fn run(&self, ctx: JobContext) -> BoxFuture<JobOutcome>;
}

impl<F, Fut> Handler for F
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn run(&self, ctx: JobContext) -> BoxFuture<JobOutcome> {
        let job = self(ctx);
        Box::pin(async move { job.await.into_outcome() })
    }
}

/// Handlers by job kind.
#[derive(Clone)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    tools: Arc<dyn Tools>,
    store: Arc<dyn LedgerStore>,
    policy: Arc<Policy>,
    tool_timeout: Duration,
    hook: Option<Arc<dyn StepHook>>,
    policies: BTreeMap<String, KindPolicy>,
    limits: Arc<BTreeMap<String, ProviderLimit>>,
}

/// Neither tools nor a ledger: the registry [`Registry::policies_of`]
/// builds only to read the policies, and never runs.
struct Detached;

impl Tools for Detached {
    fn apply(&self, _: RunId, _: u32, _: Fence, _: String) -> BoxFuture<Result<bool, Unavailable>> {
        Box::pin(std::future::ready(Err(Unavailable)))
    }
}

impl LedgerStore for Detached {
    fn call(&self, _: DbOp, _: Issuer) -> BoxFuture<Result<DbReply, Unavailable>> {
        Box::pin(std::future::ready(Err(Unavailable)))
    }
}

impl Registry {
    /// An empty registry whose handlers send side effects to `tools` and
    /// keep their steps in `store` (Postgres).
    pub fn new(tools: Arc<dyn Tools>, store: Arc<dyn LedgerStore>, policy: &Policy) -> Registry {
        Registry {
            handlers: BTreeMap::new(),
            tools,
            store,
            policy: Arc::new(policy.clone()),
            tool_timeout: Duration::from_secs(5),
            hook: None,
            policies: BTreeMap::new(),
            limits: Arc::default(),
        }
    }

    /// Sets (or replaces) the limits of `provider`, which handlers wait for
    /// with [`JobContext::limit`]. Give every worker the same limits.
    ///
    /// # Panics
    /// The limit cannot be enforced as stated ([`ProviderLimit::validate`]).
    pub fn limit(&mut self, provider: &str, limit: ProviderLimit) {
        if let Err(e) = limit.validate() {
            panic!("the limits of provider {provider:?}: {e}");
        }
        Arc::make_mut(&mut self.limits).insert(provider.to_owned(), limit);
    }

    /// The kinds' policies `handlers` registers (for the API and the
    /// `submit` command, which run no job).
    #[must_use]
    pub fn policies_of(handlers: fn(&mut Registry)) -> BTreeMap<String, KindPolicy> {
        let mut r = Registry::new(Arc::new(Detached), Arc::new(Detached), &Policy::default());
        handlers(&mut r);
        r.policies
    }

    /// The policies registered with the handlers.
    #[must_use]
    pub fn policies(&self) -> &BTreeMap<String, KindPolicy> {
        &self.policies
    }

    /// Shows every step's boundaries to `hook` (the simulator's).
    #[must_use]
    pub fn with_step_hook(mut self, hook: Arc<dyn StepHook>) -> Registry {
        self.hook = Some(hook);
        self
    }

    /// How long a side effect may wait for the tool service, or a step's
    /// ledger statement for Postgres, before the attempt fails retryably
    /// (default 5 s; the worker passes its `--call-timeout-ms`).
    #[must_use]
    pub fn with_tool_timeout(mut self, timeout: Duration) -> Registry {
        self.tool_timeout = timeout;
        self
    }

    /// The registry with the built-in kinds.
    pub fn with_builtins(
        tools: Arc<dyn Tools>,
        store: Arc<dyn LedgerStore>,
        policy: &Policy,
    ) -> Registry {
        let mut r = Registry::new(tools, store, policy);
        r.register_builtins();
        r
    }

    /// Registers the built-in kinds (see the module's documentation).
    pub fn register_builtins(&mut self) {
        self.register("noop", noop);
        self.register("sleep", sleep);
        self.register("fail", fail);
        self.register("panic", panic);
        self.register("effect", effect);
        self.register("echo", echo);
        self.register("steps", steps);
        self.register("limited", limited);
    }

    /// Registers (or replaces) the handler of `kind`, under the worker's
    /// policy.
    pub fn register(&mut self, kind: &str, handler: impl Handler) {
        self.register_with(kind, handler, KindPolicy::default());
    }

    /// Registers (or replaces) the handler of `kind`, whose runs follow
    /// `policy` where it sets a field: attempts, back-off, attempt timeout,
    /// elapsed budget.
    ///
    /// ```
    /// use pelican_real::jobs::{JobContext, JobError, KindPolicy, Registry};
    /// async fn charge(ctx: JobContext) -> Result<(), JobError> { Ok(()) }
    /// fn handlers(registry: &mut Registry) {
    ///     let policy = KindPolicy::default()
    ///         .attempts_max(8)
    ///         .backoff_ms(500, 10_000)
    ///         .attempt_timeout_ms(30_000)
    ///         .budget_ms(15 * 60_000);
    ///     registry.register_with("charge", charge, policy);
    /// }
    /// ```
    pub fn register_with(&mut self, kind: &str, handler: impl Handler, policy: KindPolicy) {
        self.handlers.insert(kind.to_owned(), Arc::new(handler));
        if policy == KindPolicy::default() {
            self.policies.remove(kind);
        } else {
            self.policies.insert(kind.to_owned(), policy);
        }
    }

    /// The registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }
}

impl Executor for Registry {
    fn execute(&self, e: Execution) -> BoxFuture<JobOutcome> {
        let Some(handler) = self.handlers.get(&e.kind).cloned() else {
            let message = format!("unknown job kind {:?}", e.kind);
            return Box::pin(async move {
                JobOutcome::Failed {
                    class: ErrorClass::Terminal,
                    message,
                }
            });
        };
        handler.run(JobContext {
            run: e.run,
            fence: e.fence,
            attempt: e.attempt,
            trace: RunTrace::of(e.run, e.trace.as_deref()),
            input: e.input,
            tools: self.tools.clone(),
            store: self.store.clone(),
            ledger: Arc::default(),
            policy: self.policy.clone(),
            tool_timeout: self.tool_timeout,
            hook: self.hook.clone(),
            limits: self.limits.clone(),
            permits: Arc::default(),
        })
    }
}
