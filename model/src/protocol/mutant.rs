//! Known protocol bugs, injected on purpose to prove that every check has
//! teeth (DESIGN.md, "Mutants").
//!
//! With the `mutants` feature, [`Mutant`] names the bugs and
//! [`Policy::mutant`](super::Policy::mutant) may select one. Without it,
//! [`Mutant`] is an enum with no variants: configurations, traces and
//! reports still have a type to name (always `None`), but a production
//! build holds no mutant's name, branch, statement or label. Call sites
//! test a bug with [`injects!`](crate::injects), which is `false` there.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Whether `policy` injects mutant `name`: `injects!(self.policy, NoFence)`.
/// Always `false` in a build without the `mutants` feature, where the
/// names do not exist. The feature is the calling crate's: a crate that
/// uses this forwards its own `mutants` feature to `pelican-model/mutants`.
#[macro_export]
#[doc(hidden)]
macro_rules! injects {
    ($policy:expr, $name:ident) => {{
        #[cfg(feature = "mutants")]
        let on = $policy.mutant == Some($crate::protocol::Mutant::$name);
        #[cfg(not(feature = "mutants"))]
        let on = $crate::protocol::none_injected(&$policy);
        on
    }};
}

/// `false`: what [`injects!`](crate::injects) is in a build without the
/// `mutants` feature (a call, not a literal, so that conditions such as
/// `own || injects!(..)` read as written).
#[doc(hidden)]
#[must_use]
#[inline(always)]
pub const fn none_injected<T>(_policy: &T) -> bool {
    false
}

#[cfg(feature = "mutants")]
macro_rules! mutants {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// One injected bug (see DESIGN.md, "Mutants").
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum Mutant {
            $($(#[doc = $doc])* $name,)*
        }

        impl Mutant {
            /// All of them.
            pub const ALL: &'static [Mutant] = &[$(Mutant::$name,)*];

            /// Its name, as on the command line.
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self { $(Mutant::$name => stringify!($name),)* }
            }
        }
    };
}

#[cfg(feature = "mutants")]
mutants! {
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
    /// Runs whose entry Redis lost are never published again: the sweeper
    /// does nothing.
    NoSweep,
    /// An outcome Postgres refuses (a NUL byte) is left pending, as if its
    /// reply were lost: the run is retried until its attempts run out.
    PoisonRetried,
    /// A claim judges the lease by the claiming worker's clock: a worker
    /// whose clock runs ahead takes over a live attempt.
    WorkerClock,
    /// Retention picks runs by when they were published, finished or not:
    /// a run still running, or waiting for its retry, is deleted.
    RetainLive,
    /// A step recorded by an earlier attempt runs again instead of being
    /// replayed.
    StepRerun,
    /// An error of class `unknown` is retried like a retryable one, past
    /// the policy's cap.
    UnknownRetried,
    /// A claim that finds the run's elapsed budget spent runs the job
    /// anyway, and no attempt is cut short by the budget.
    IgnoreBudget,
    /// A permit of a provider's concurrency limit takes the provider's
    /// lowest slot whether or not another permit still holds it.
    Overbooked,
    /// A progress event is written while the run is running, whether or
    /// not the attempt writing it still holds the run.
    ZombieProgress,
    /// The reclaimer scans the first partition only: deliveries that a dead
    /// worker held in the others stay pending.
    ReclaimOnePartition,
    /// Retention deletes a run's idempotency keys with the run: a retry
    /// under one, within its window, makes a second run.
    ForgetKeys,
    /// Housekeeping deletes idle consumers whatever they hold: their
    /// pending deliveries leave the PEL unacknowledged.
    ForgetHolders,
    /// The retry pass promotes delayed runs whether they are due or not:
    /// a run submitted with a delay starts before its time.
    PromoteEarly,
    /// The scheduler's `FireTick` handles its tick whatever the
    /// schedule's `next_tick` holds now: two schedulers that read the
    /// same tick both handle it.
    TickUnfenced,
}

/// No mutant: this build was made without the `mutants` feature.
#[cfg(not(feature = "mutants"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mutant {}

#[cfg(not(feature = "mutants"))]
impl Mutant {
    /// None in this build.
    pub const ALL: &'static [Mutant] = &[];

    /// Its name (there is none to name in this build).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {}
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown mutant name, or a build without mutants.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown mutant {name:?}; {known}")]
pub struct UnknownMutant {
    name: String,
    known: String,
}

impl FromStr for Mutant {
    type Err = UnknownMutant;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mutant::ALL
            .iter()
            .copied()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownMutant {
                name: s.to_owned(),
                known: if Mutant::ALL.is_empty() {
                    "this build has none (build with --features mutants)".to_owned()
                } else {
                    let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
                    format!("known: {}", names.join(", "))
                },
            })
    }
}
