//! Pelican's async driver, shared by the simulator (`pelican-sim`, under
//! madsim) and the live worker (the `pelican` binary, on Redis and Postgres).
//!
//! **Writing jobs?** Depend on `pelican-sdk`: it holds what a job author's
//! crate needs, and it is the API that stays. This crate is the
//! implementation; its driver, bindings and traces are public for the
//! simulator and the tests, hidden from the docs, and change freely.
//!
//! The protocol lives in [`pelican_model::protocol`] as sans-IO state
//! machines. This crate runs them: it owns the clock, the randomness, the
//! network and the job executions, and it feeds each role one input at a
//! time. Every role is driven by the same loop:
//!
//! ```text
//! loop {
//!     while let Some(command) = role.poll() {      // drain what the role asks
//!         Db(op)      => send op to the database client
//!         Stream(op)  => send op to the stream client
//!         Execute(e)  => spawn the job handler
//!         Abort       => stop the job at its next await
//!         SetTimer(t) => arm the one timer
//!     }
//!     input = first of { the reply (or Unavailable after the call timeout),
//!                        the job's outcome, the timer };
//!     role.handle(now(), input);
//! }
//! ```
//!
//! The I/O is behind three traits: [`StreamClient`], [`DbClient`] and
//! [`Tools`]. The simulator implements them with madsim RPC to nodes that
//! serve the model's reference semantics; the live binding implements them
//! with redis-rs and sqlx. Time is `tokio::time`, which is madsim's clock
//! when built with `--cfg madsim` (through `madsim-tokio`), so the simulator
//! runs this very code.
//!
//! What the driver adds to the core, and only this: bounded in-flight jobs
//! (a semaphore of `in_flight_max` slots shared by the reader and the
//! reclaimer; the reader takes slots only for entries it got, never while
//! XREADGROUP blocks), periodic ticks for the reclaimer and the maintenance
//! tasks, a timeout on every call, batching of concurrent claims and
//! completions into one statement and of acknowledgements into one
//! pipeline ([`Batching`]: each role still sends its own command and gets
//! its own answer), and graceful shutdown.

#![warn(missing_docs)]

/// Crashes the process at a named point when the `failpoints` feature is on
/// and the point is armed (`FAILPOINTS="<name>=return"`); the live kill
/// tests use these. Without the feature it compiles to nothing.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| {
            eprintln!(concat!("pelican: crash point ", $name));
            std::process::abort()
        });
    };
}

#[cfg(feature = "live")]
pub mod cli;
#[doc(hidden)]
pub mod driver;
pub mod jobs;
#[cfg(feature = "live")]
#[doc(hidden)]
pub mod live;
pub mod telemetry;
#[doc(hidden)]
pub mod trace;

#[doc(hidden)]
pub use driver::{
    Batching, Config, DbClient, Entropy, Io, NewRun, NoProbe, Probe, QueryError, Requeued, RoleId,
    Start, StreamClient, StreamResult, Tools, Worker, cancel, maintain, new_run_ids, now,
    requeue_dead, submit, submit_many,
};
