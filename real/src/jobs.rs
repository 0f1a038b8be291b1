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
//! | `fail` | `{"class": "retryable"\|"terminal", "times": N, "ms": M}` | after M ms, fails the first N attempts with that class, then succeeds |
//! | `panic` | `{"times": N}` | panics in the first N attempts, then succeeds |
//! | `effect` | `{"calls": K, "ms": M}` | performs K side effects through the tool service, M ms apart, each keyed by (run, call) |
//! | `echo` | `{"text": S}` | succeeds with S itself as its result text (not JSON-encoded): a handler's raw result, for tests of what Postgres stores |
//!
//! Handlers run at least once per attempt that reaches them and may run
//! again after a crash: a handler's side effects must go through
//! [`JobContext::apply`], whose idempotency key makes them happen once (S5).

use crate::driver::{BoxFuture, Tools};
use pelican_model::ids::{Fence, RunId};
use pelican_model::protocol::{Execution, Policy};
use pelican_model::status::{ErrorClass, JobOutcome};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Starts jobs for the driver.
pub trait Executor: Send + Sync + 'static {
    /// The job's future; the driver spawns it, turns a panic into a
    /// `Panic`-class failure and drops it on abort.
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
    tools: Arc<dyn Tools>,
    policy: Arc<Policy>,
    tool_timeout: Duration,
}

/// Why a side effect could not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the tool service did not answer")]
pub struct ToolUnavailable;

impl JobContext {
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
        match tokio::time::timeout(self.tool_timeout, self.tools.apply(self.run, call, key)).await {
            Ok(Ok(applied)) => {
                crate::crash_point!("after_effect");
                Ok(applied)
            }
            _ => Err(ToolUnavailable),
        }
    }
}

/// A job handler.
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt.
    fn run(&self, ctx: JobContext) -> BoxFuture<JobOutcome>;
}

impl<F, Fut> Handler for F
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobOutcome> + Send + 'static,
{
    fn run(&self, ctx: JobContext) -> BoxFuture<JobOutcome> {
        Box::pin(self(ctx))
    }
}

/// Handlers by job kind.
#[derive(Clone)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    tools: Arc<dyn Tools>,
    policy: Arc<Policy>,
    tool_timeout: Duration,
}

impl Registry {
    /// An empty registry whose handlers send side effects to `tools`.
    pub fn new(tools: Arc<dyn Tools>, policy: &Policy) -> Registry {
        Registry {
            handlers: BTreeMap::new(),
            tools,
            policy: Arc::new(policy.clone()),
            tool_timeout: Duration::from_secs(5),
        }
    }

    /// How long a side effect may wait for the tool service before the
    /// attempt fails retryably (default 5 s).
    #[must_use]
    pub fn with_tool_timeout(mut self, timeout: Duration) -> Registry {
        self.tool_timeout = timeout;
        self
    }

    /// The registry with the built-in kinds.
    pub fn with_builtins(tools: Arc<dyn Tools>, policy: &Policy) -> Registry {
        let mut r = Registry::new(tools, policy);
        r.register("noop", noop);
        r.register("sleep", sleep);
        r.register("fail", fail);
        r.register("panic", panic);
        r.register("effect", effect);
        r.register("echo", echo);
        r
    }

    /// Registers (or replaces) the handler of `kind`.
    pub fn register(&mut self, kind: &str, handler: impl Handler) {
        self.handlers.insert(kind.to_owned(), Arc::new(handler));
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
            input: e.input,
            tools: self.tools.clone(),
            policy: self.policy.clone(),
            tool_timeout: self.tool_timeout,
        })
    }
}

fn succeeded(result: impl Into<String>) -> JobOutcome {
    JobOutcome::Succeeded {
        result: result.into(),
    }
}

fn bad_input(kind: &str, e: &serde_json::Error) -> JobOutcome {
    JobOutcome::Failed {
        class: ErrorClass::Terminal,
        message: format!("bad {kind} input: {e}"),
    }
}

async fn pause(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

async fn noop(_: JobContext) -> JobOutcome {
    succeeded("null")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoInput {
    text: String,
}

async fn echo(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<EchoInput>(&ctx.input) {
        Ok(i) => succeeded(i.text),
        Err(e) => bad_input("echo", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SleepInput {
    ms: u64,
}

async fn sleep(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<SleepInput>(&ctx.input) {
        Ok(i) => {
            pause(i.ms).await;
            succeeded(format!(
                "{{\"slept_ms\":{},\"attempt\":{}}}",
                i.ms, ctx.attempt
            ))
        }
        Err(e) => bad_input("sleep", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailInput {
    class: FailClass,
    times: u32,
    #[serde(default)]
    ms: u64,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailClass {
    Retryable,
    Terminal,
}

async fn fail(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<FailInput>(&ctx.input) {
        Ok(i) => {
            pause(i.ms).await;
            if ctx.attempt > i.times {
                return succeeded(format!("{{\"failed_times\":{}}}", i.times));
            }
            let class = match i.class {
                FailClass::Retryable => ErrorClass::Retryable,
                FailClass::Terminal => ErrorClass::Terminal,
            };
            JobOutcome::Failed {
                class,
                message: format!("failing on purpose, attempt {} of {}", ctx.attempt, i.times),
            }
        }
        Err(e) => bad_input("fail", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PanicInput {
    times: u32,
}

async fn panic(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<PanicInput>(&ctx.input) {
        Ok(i) if ctx.attempt <= i.times => {
            panic!("{PANIC_ON_PURPOSE}, attempt {}", ctx.attempt)
        }
        Ok(i) => succeeded(format!("{{\"panicked_times\":{}}}", i.times)),
        Err(e) => bad_input("panic", &e),
    }
}

/// The message of the `panic` kind's panics (a panic hook may silence them).
pub const PANIC_ON_PURPOSE: &str = "job panicking on purpose";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EffectInput {
    calls: u32,
    #[serde(default)]
    ms: u64,
}

async fn effect(ctx: JobContext) -> JobOutcome {
    let i = match serde_json::from_str::<EffectInput>(&ctx.input) {
        Ok(i) => i,
        Err(e) => return bad_input("effect", &e),
    };
    let mut applied = 0;
    for call in 0..i.calls {
        pause(i.ms).await;
        match ctx.apply(call).await {
            Ok(true) => applied += 1,
            Ok(false) => {}
            Err(e) => {
                return JobOutcome::Failed {
                    class: ErrorClass::Retryable,
                    message: format!("side effect {call}: {e}"),
                };
            }
        }
    }
    succeeded(format!(
        "{{\"calls\":{},\"applied_now\":{applied}}}",
        i.calls
    ))
}

/// The number of side effects a built-in job of `kind` with `input` makes
/// when it succeeds (for checking S5 at the end of a test).
#[must_use]
pub fn effects_of(kind: &str, input: &str) -> u32 {
    if kind != "effect" {
        return 0;
    }
    serde_json::from_str::<EffectInput>(input).map_or(0, |i| i.calls)
}
