//! # pelican-model: the pure core of Pelican
//!
//! Pelican runs durable jobs on a Redis Streams consumer group with
//! PostgreSQL as the source of truth. This crate is the whole protocol and
//! nothing else: no I/O, no async, no clock, no randomness.
//!
//! * [`stream`] and [`db`]: reference semantics of the Redis commands and the
//!   SQL statements Pelican issues — one method per command or statement,
//!   answering as the server does. The simulator serves these; the
//!   differential tests hold them to live servers.
//! * [`protocol`]: each role (a worker's delivery, the reclaimer, maintenance,
//!   the submitter) as a sans-IO state machine: `handle(now, Input)` in,
//!   `poll() -> Option<Command>` out. See the drive loop in [`protocol`].
//! * [`world`] and [`invariants`]: the state all three levels check, and the
//!   guarantees S1–S10 as functions over it.
//!
//! The stateright model lives in `pelican-checker` (stateright depends on
//! `rand`, which this crate must not).

#![warn(missing_docs)]

pub mod db;
pub mod events;
pub mod ids;
pub mod invariants;
pub mod protocol;
pub mod schedule;
pub mod shared;
pub mod status;
pub mod stream;
pub mod time;
pub mod world;

pub use db::Db;
pub use status::{ErrorClass, JobOutcome, RunStatus};
