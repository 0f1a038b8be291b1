//! Pelican's own time type.
//!
//! The core never reads a clock: every call that depends on time takes a
//! [`Timestamp`] from its caller. Milliseconds since an arbitrary epoch are
//! enough for leases, idle times and back-off, and a plain `u64` keeps states
//! `Hash + Eq + Ord + Serialize` for the checker and for traces.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A point in time, in milliseconds since an epoch chosen by the driver.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The epoch.
    pub const ZERO: Timestamp = Timestamp(0);

    /// Milliseconds since the epoch.
    #[must_use]
    pub const fn as_ms(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating at the end of time.
    #[must_use]
    pub const fn add_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// `self - ms`, saturating at the epoch.
    #[must_use]
    pub const fn sub_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_sub(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 when `earlier` is later.
    #[must_use]
    pub const fn ms_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}ms", self.0)
    }
}
