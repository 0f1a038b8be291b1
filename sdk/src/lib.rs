//! # pelican-sdk: write jobs for Pelican
//!
//! A job is an async handler of one run's input. Register it under a kind
//! in a [`Registry`], and start the worker with `main_with` (feature
//! `worker`): the `pelican` command line (`worker`, `api`, `migrate`, ...)
//! with those kinds beside the built-in ones.
//!
//! ```
//! use pelican_sdk::{JobContext, JobError, KindPolicy, Registry, StepFailed};
//!
//! async fn send_invoice(ctx: JobContext) -> Result<String, StepFailed> {
//!     // A durable step: recorded under this attempt's fence, replayed
//!     // (not run again) by every later attempt of the run.
//!     let total: u64 = ctx.step("total", async { Ok::<_, JobError>(42) }).await?;
//!     // The same key on every attempt: the mail service sends it once.
//!     let key = ctx.idempotency_key("mail");
//!     ctx.step("mail", async move {
//!         let _ = (total, key); // call the mail service with the key here
//!         Ok::<_, JobError>(())
//!     })
//!     .await?;
//!     Ok(format!("sent {total}"))
//! }
//!
//! fn handlers(registry: &mut Registry) {
//!     registry.register_builtins();
//!     let policy = KindPolicy::default().attempts_max(5).budget_ms(600_000);
//!     registry.register_with("invoice", send_invoice, policy);
//! }
//! # let _ = handlers;
//! ```
//!
//! What a run may count on, and what a handler must do for it:
//!
//! * A run is executed **at least once** and finished **at most once**:
//!   an attempt whose worker died is run again; only the current attempt's
//!   outcome is written (its fence).
//! * Side effects outside Pelican take an idempotency key
//!   ([`JobContext::idempotency_key`]), so that a repeat applies once.
//! * Work a later attempt should not redo goes in a durable step
//!   ([`JobContext::step`]).
//! * A call to a provider with limits waits for a permit
//!   ([`JobContext::limit`], [`Registry::limit`]).
//! * Progress a watcher sees is written under the attempt's fence
//!   ([`JobContext::progress`]).
//!
//! With the feature `testing`, in a build under `--cfg madsim`, the
//! simulator's harness (`JobSim`, `External`) runs a crate's handlers
//! under crashes, pauses, partitions and lost replies, checking every
//! guarantee.

#![warn(missing_docs)]

pub use pelican_real::jobs::{
    BoxFuture, ErrorClass, Fence, Handler, IntoOutcome, JobContext, JobError, JobOutcome,
    KindPolicy, Permit, ProviderLimit, Registry, RunId, StepFailed,
};
pub use pelican_real::telemetry::{RunTrace, TRACEPARENT, TraceParent};

/// The `pelican` command line with the kinds `handlers` registers: call it
/// from a worker binary's `main`.
///
/// ```no_run
/// fn handlers(registry: &mut pelican_sdk::Registry) {
///     registry.register_builtins();
/// }
///
/// fn main() -> std::process::ExitCode {
///     pelican_sdk::main_with(handlers)
/// }
/// ```
#[cfg(feature = "worker")]
pub use pelican_real::cli::main_with;

#[cfg(all(feature = "testing", madsim))]
pub use pelican_sim::{External, JobSim};
