//! Per-provider limits (S12): how many calls to a provider may be in flight
//! at once, and how fast they may start, across every worker.
//!
//! Both live in Postgres and are judged by its clock. A concurrency limit
//! of N is N slots (`provider_slots`); a permit holds one until it is
//! released or its hold runs out, so a worker that dies holding one frees it
//! after [`ProviderLimit::hold_ms`], never before. A rate limit is one row of
//! GCRA state (`provider_rates`, in nanoseconds, so that any rate is kept
//! as stated): a call may start when the provider's
//! theoretical arrival time is at most `(burst - 1) * interval` ahead of now.
//! Limits bound load on the provider; they never change what a run writes.

use super::Policy;
use crate::db::{DbOp, Shaped, query, shape};
use crate::ids::{Fence, RunId};
use serde::{Deserialize, Serialize};

/// A provider's limits, shared by every worker. Built from its default (no
/// limit) with a setter a limit: it will grow, so other crates cannot
/// build one field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProviderLimit {
    /// Calls in flight at once, across all workers (`None`: no limit).
    pub concurrent: Option<u32>,
    /// Calls started per second, on average (`None`: no limit); at most
    /// [`ProviderLimit::PER_SECOND_MAX`].
    pub per_second: Option<u32>,
    /// Calls that may start together after a quiet spell (at least 1).
    pub burst: u32,
    /// The longest a permit holds its slot. A worker that dies holding one
    /// frees it after this; a call that takes longer shares its slot.
    pub hold_ms: u64,
}

impl Default for ProviderLimit {
    fn default() -> ProviderLimit {
        ProviderLimit {
            concurrent: None,
            per_second: None,
            burst: 1,
            hold_ms: 60_000,
        }
    }
}

impl ProviderLimit {
    /// At most `n` calls in flight at once, across all workers.
    #[must_use]
    pub const fn concurrent(mut self, n: u32) -> ProviderLimit {
        self.concurrent = Some(n);
        self
    }

    /// At most `n` calls started per second, on average.
    #[must_use]
    pub const fn per_second(mut self, n: u32) -> ProviderLimit {
        self.per_second = Some(n);
        self
    }

    /// Up to `n` calls may start together after a quiet spell.
    #[must_use]
    pub const fn burst(mut self, n: u32) -> ProviderLimit {
        self.burst = n;
        self
    }

    /// A permit holds its slot for at most `ms` milliseconds.
    #[must_use]
    pub const fn hold_ms(mut self, ms: u64) -> ProviderLimit {
        self.hold_ms = ms;
        self
    }

    /// The fastest rate a limit can state: one call a millisecond (the
    /// clock's unit) on average; a larger burst lets more start together.
    pub const PER_SECOND_MAX: u32 = 1_000;

    /// Whether the limit can be enforced as stated.
    ///
    /// # Errors
    /// A zero count, a rate above [`ProviderLimit::PER_SECOND_MAX`], or a
    /// zero hold.
    pub fn validate(&self) -> Result<(), String> {
        if self.concurrent == Some(0) {
            return Err("concurrent must be at least 1".into());
        }
        match self.per_second {
            Some(0) => return Err("per_second must be at least 1".into()),
            Some(n) if n > Self::PER_SECOND_MAX => {
                return Err(format!(
                    "per_second must be at most {} (raise burst for more at once)",
                    Self::PER_SECOND_MAX
                ));
            }
            _ => {}
        }
        if self.burst == 0 {
            return Err("burst must be at least 1".into());
        }
        if self.hold_ms == 0 {
            return Err("hold_ms must be at least 1".into());
        }
        Ok(())
    }

    /// The permit name of the `n`th permit the attempt of `run` holding
    /// `fence` asks for: unique across attempts and workers.
    #[must_use]
    pub fn holder(run: RunId, fence: Fence, n: u32) -> String {
        format!("{}/{}/{n}", run.0, fence.0)
    }

    /// The statement that takes one of `provider`'s slots for `holder`
    /// (`None`: no concurrency limit). Answers 1, or 0 when all are held
    /// or none exist yet ([`ProviderLimit::ensure`]).
    #[must_use]
    pub fn acquire(
        &self,
        policy: &Policy,
        provider: &str,
        holder: &str,
    ) -> Option<Shaped<shape::Rows>> {
        let (provider, slots) = (provider.to_owned(), self.concurrent?);
        let (holder, hold_ms) = (holder.to_owned(), self.hold_ms);
        #[cfg(feature = "mutants")]
        if crate::injects!(policy, Overbooked) {
            return Some(Shaped::new(DbOp::AcquireAnySlot {
                provider,
                slots,
                holder,
                hold_ms,
            }));
        }
        #[cfg(not(feature = "mutants"))]
        let _ = policy;
        Some(Shaped::new(DbOp::AcquireSlot {
            provider,
            slots,
            holder,
            hold_ms,
        }))
    }

    /// The statement that makes `provider`'s slots (free), for a first
    /// acquire that found none.
    #[must_use]
    pub fn ensure(&self, provider: &str) -> Option<query::EnsureSlots> {
        Some(query::EnsureSlots {
            provider: provider.to_owned(),
            slots: self.concurrent?,
        })
    }

    /// The statement that frees `holder`'s slot of `provider`.
    #[must_use]
    pub fn release(provider: &str, holder: &str) -> query::ReleaseSlot {
        query::ReleaseSlot {
            provider: provider.to_owned(),
            holder: holder.to_owned(),
        }
    }

    /// The time between calls at the stated rate, in nanoseconds, rounded
    /// up: never faster than stated, and slower by less than a millionth
    /// (`None`: no rate limit).
    #[must_use]
    pub fn interval_ns(&self) -> Option<u64> {
        self.per_second
            .map(|n| 1_000_000_000u64.div_ceil(u64::from(n.clamp(1, Self::PER_SECOND_MAX))))
    }

    /// The statement that takes a token of `provider`'s rate limit (`None`:
    /// no rate limit). Answers 1, or 0 when it is too soon.
    #[must_use]
    pub fn take_token(&self, provider: &str) -> Option<query::TakeToken> {
        Some(query::TakeToken {
            provider: provider.to_owned(),
            interval_ns: self.interval_ns()?,
            burst: self.burst.max(1),
        })
    }
}
