//! An agent run on Pelican: one model call and two tool calls, each a
//! durable step, the tool calls under idempotency keys.
//!
//! A crash anywhere in a run costs the least that it can: a later attempt
//! replays the recorded steps (the model is not asked twice for an answer
//! it gave and Pelican recorded) and runs only the steps that were not
//! recorded. A tool call that reached the provider before the attempt died
//! is sent again under the same key, and the provider applies it once.
//!
//! The handler talks to its provider through [`Provider`]: in production an
//! HTTP client, in tests the simulator's external service
//! (`tests/sim.rs`), in the example binary a [`CountingProvider`].

use pelican_sdk::{
    BoxFuture, JobContext, JobError, KindPolicy, ProviderLimit, Registry, RunId, StepFailed,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What an agent run talks to: a model and its tools.
pub trait Provider: Send + Sync + 'static {
    /// Asks the model about `prompt` for `run` (no side effect).
    fn complete(&self, run: RunId, prompt: String) -> BoxFuture<Result<String, JobError>>;

    /// Calls tool `tool` with `args` for `run`, under the idempotency key
    /// `key`: the provider applies a key once and answers a repeat with
    /// its first answer.
    fn call_tool(
        &self,
        run: RunId,
        tool: &str,
        key: Option<String>,
        args: String,
    ) -> BoxFuture<Result<String, JobError>>;
}

/// An agent run's input.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// What the user asked.
    pub question: String,
}

/// An agent run's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The model's plan.
    pub plan: String,
    /// What the search tool found.
    pub found: String,
    /// The notification tool's receipt.
    pub receipt: String,
}

/// The tool calls an agent run makes: each is applied once when the run
/// succeeds.
pub const TOOLS: [&str; 2] = ["search", "notify"];

/// One attempt of an agent run: plan with the model, search, notify.
///
/// # Errors
/// A bad input fails the run; a provider that does not answer fails the
/// attempt, to be retried; the ledger's errors (steps asked for in another
/// order than before) fail the run.
pub async fn agent(ctx: JobContext, provider: Arc<dyn Provider>) -> Result<Answer, StepFailed> {
    let input: Question = serde_json::from_str(&ctx.input)
        .map_err(|e| JobError::terminal(format!("bad agent input: {e}")))?;
    // The model provider's limits hold across every worker; a replayed
    // step asks for no permit.
    let plan: String = ctx
        .step("model", async {
            let permit = ctx.limit("model").await?;
            let plan = provider.complete(ctx.run, input.question).await;
            permit.release().await;
            plan
        })
        .await?;
    let [search, notify] = TOOLS;
    let key = ctx.idempotency_key(search);
    let found: String = ctx
        .step(
            search,
            provider.call_tool(ctx.run, search, Some(key), plan.clone()),
        )
        .await?;
    let key = ctx.idempotency_key(notify);
    let receipt: String = ctx
        .step(
            notify,
            provider.call_tool(ctx.run, notify, Some(key), found.clone()),
        )
        .await?;
    Ok(Answer {
        plan,
        found,
        receipt,
    })
}

/// How agent runs are retried: a few attempts, a slow back-off (model
/// providers rate-limit), a minute per attempt, ten minutes in all.
#[must_use]
pub fn policy() -> KindPolicy {
    KindPolicy::default()
        .attempts_max(6)
        .backoff_ms(2_000, 30_000)
        .attempt_timeout_ms(60_000)
        .budget_ms(10 * 60_000)
}

/// The model provider's limits: 4 calls at once and 20 a second, across
/// every worker; a dead worker's slot is free again after 30 s.
#[must_use]
pub fn model_limit() -> ProviderLimit {
    ProviderLimit::default()
        .concurrent(4)
        .per_second(20)
        .burst(4)
        .hold_ms(30_000)
}

/// Registers the `agent` kind, calling `provider`, under [`policy`], and
/// the model's limits.
pub fn register(registry: &mut Registry, provider: Arc<dyn Provider>) {
    registry.register_with("agent", move |ctx| agent(ctx, provider.clone()), policy());
    registry.limit("model", model_limit());
}

/// A provider that answers at once and counts: model requests, tool
/// requests, and tool calls applied (once per key). The example binary's
/// stand-in for a real model API.
#[derive(Debug, Default)]
pub struct CountingProvider {
    counts: Mutex<Counts>,
}

/// What a [`CountingProvider`] has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Model requests.
    pub completions: u64,
    /// Tool requests, repeats included.
    pub tool_requests: u64,
    /// The first answer to each key: the tool calls applied.
    pub applied: BTreeMap<String, String>,
}

impl CountingProvider {
    /// What it has seen so far.
    #[must_use]
    pub fn counts(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Provider for CountingProvider {
    fn complete(&self, run: RunId, prompt: String) -> BoxFuture<Result<String, JobError>> {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.completions += 1;
        let answer = format!("plan #{} for {run}: look up {prompt:?}", c.completions);
        Box::pin(std::future::ready(Ok(answer)))
    }

    fn call_tool(
        &self,
        run: RunId,
        tool: &str,
        key: Option<String>,
        args: String,
    ) -> BoxFuture<Result<String, JobError>> {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.tool_requests += 1;
        let fresh = format!(
            "{tool} #{} for {run} ({} bytes)",
            c.tool_requests,
            args.len()
        );
        let answer = match key {
            Some(key) => c.applied.entry(key).or_insert(fresh).clone(),
            None => fresh,
        };
        Box::pin(std::future::ready(Ok(answer)))
    }
}
