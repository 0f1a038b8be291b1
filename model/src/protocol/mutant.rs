//! Known protocol bugs, injected on purpose to prove that every check has
//! teeth. The enum always exists (so configurations, traces and reports can
//! name a mutant), but [`super::Policy::is`] only answers `true` in a build
//! with the `mutants` feature.
//!
//! One more name lives here that is not a bug hunted by the checks but a
//! yardstick: [`Mutant::Unguarded`], the least protocol that still drains a
//! queue, which the benchmarks run to price the guarantees (and which every
//! level of checks catches all the same).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One injected bug (see DESIGN.md, "Mutants").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mutant {
    /// XACK, then write the result.
    AckBeforeCommit,
    /// Results and failures are written with the run's current fence, read
    /// just before, instead of the attempt's own.
    NoFence,
    /// A redelivered, already finished run is executed again.
    NoTerminalCheck,
    /// Side effects carry a key that changes per attempt.
    NoIdempotencyKey,
    /// A retry is left to the PEL instead of a durable `retry_at`.
    RetryInPel,
    /// Runs get unlimited attempts.
    NoDeadLetter,
    /// A late worker whose write was rejected acknowledges anyway.
    StaleAck,
    /// XAUTOCLAIM's deleted IDs are dropped without recovery.
    IgnoreTrimmed,
    /// A reclaim starts a new attempt of a cancelled run.
    ReviveCancelled,
    /// Runs whose publish was lost are never published.
    NoPublishRecovery,
    /// Not one of the ten, and not in [`Mutant::ALL`]: the benchmarks'
    /// baseline, the least protocol that still drains a queue. A delivery
    /// reads its run (for the job's kind and input), runs the job, writes
    /// the outcome without a fence ([`DbOp::CompleteUnfenced`],
    /// [`DbOp::FailUnfenced`]: any run not yet terminal takes it) and
    /// acknowledges. No claim, attempt record, lease, heartbeat, retry or
    /// dead letter: it pays for none of S3, S6 and S7's machinery and keeps
    /// none of those guarantees. `cargo xtask bench` drains with it beside
    /// the shipped protocol, to price them.
    ///
    /// [`DbOp::CompleteUnfenced`]: super::DbOp::CompleteUnfenced
    /// [`DbOp::FailUnfenced`]: super::DbOp::FailUnfenced
    Unguarded,
}

impl Mutant {
    /// All ten.
    pub const ALL: [Mutant; 10] = [
        Mutant::AckBeforeCommit,
        Mutant::NoFence,
        Mutant::NoTerminalCheck,
        Mutant::NoIdempotencyKey,
        Mutant::RetryInPel,
        Mutant::NoDeadLetter,
        Mutant::StaleAck,
        Mutant::IgnoreTrimmed,
        Mutant::ReviveCancelled,
        Mutant::NoPublishRecovery,
    ];

    /// The ten and the benchmarks' baseline ([`Mutant::Unguarded`]): every
    /// name `--mutant` accepts.
    pub const NAMED: [Mutant; 11] = {
        let mut named = [Mutant::Unguarded; 11];
        let mut i = 0;
        while i < Mutant::ALL.len() {
            named[i] = Mutant::ALL[i];
            i += 1;
        }
        named
    };

    /// Its name, as on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Mutant::AckBeforeCommit => "AckBeforeCommit",
            Mutant::NoFence => "NoFence",
            Mutant::NoTerminalCheck => "NoTerminalCheck",
            Mutant::NoIdempotencyKey => "NoIdempotencyKey",
            Mutant::RetryInPel => "RetryInPel",
            Mutant::NoDeadLetter => "NoDeadLetter",
            Mutant::StaleAck => "StaleAck",
            Mutant::IgnoreTrimmed => "IgnoreTrimmed",
            Mutant::ReviveCancelled => "ReviveCancelled",
            Mutant::NoPublishRecovery => "NoPublishRecovery",
            Mutant::Unguarded => "Unguarded",
        }
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown mutant name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown mutant {0:?}; known: AckBeforeCommit, NoFence, NoTerminalCheck, NoIdempotencyKey, RetryInPel, NoDeadLetter, StaleAck, IgnoreTrimmed, ReviveCancelled, NoPublishRecovery, and the benchmarks' baseline Unguarded"
)]
pub struct UnknownMutant(pub String);

impl FromStr for Mutant {
    type Err = UnknownMutant;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mutant::NAMED
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownMutant(s.to_owned()))
    }
}
