//! What a statement does that the world's checks watch: each entry of the
//! statement table declares its class (`class: [...]`), and
//! [`DbOp::class`](super::DbOp::class) answers it for a command, with the
//! fields it names. [`World::db`](crate::world::World::db) reads the class,
//! never a statement's name, to decide which guarantees to check around a
//! statement.

use crate::ids::{EntryId, RunId};

/// A statement's class, for one command: each field is set when its
/// entry declares it, with the command's fields it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Class<'a> {
    /// `claims(run)`: takes `run` for a new attempt, raising its fence
    /// (S3, S7, S12 are checked around it).
    pub claims: Option<RunId>,
    /// `events(run)`: may write `run`'s events (S13).
    pub events: Option<RunId>,
    /// `deletes`: deletes runs, which must all have ended (S1).
    pub deletes: bool,
    /// `sweeps`: updates a set of runs, none of them ended (S2).
    pub sweeps: bool,
    /// `records_step(run, step)`: records a step, never over another
    /// record (S11).
    pub records_step: Option<(RunId, u32)>,
    /// `requeues_entry(entry)`: queues a trimmed entry's run again.
    pub requeues_entry: Option<EntryId>,
    /// `takes_slot(provider, slots, holder, hold_ms)`: takes one of a
    /// provider's slots (S15).
    pub takes_slot: Option<SlotTake<'a>>,
    /// `frees_slot(provider, holder)`: frees a holder's slot.
    pub frees_slot: Option<(&'a str, &'a str)>,
    /// `takes_token(provider, interval_ns, burst)`: takes a token of a
    /// provider's rate (S15).
    pub takes_token: Option<(&'a str, u64, u32)>,
    /// `binds_key(key)`: binds an idempotency key to a run, or answers its
    /// run (S14).
    pub binds_key: Option<&'a str>,
    /// `expires_keys`: forgets idempotency keys past their time.
    pub expires_keys: bool,
    /// `ticks(schedule)`: handles a tick of a schedule, which must come
    /// after every tick it handled before (S16).
    pub ticks: Option<&'a str>,
}

/// A slot taken ([`Class::takes_slot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotTake<'a> {
    /// The provider.
    pub provider: &'a str,
    /// Its slots.
    pub slots: u32,
    /// Who takes one.
    pub holder: &'a str,
    /// For how long, at most.
    pub hold_ms: u64,
}

/// Sets the field of `$c` that one declaration of an entry's `class` names.
macro_rules! class_of {
    ($c:ident, claims($run:ident)) => {
        $c.claims = Some(*$run);
    };
    ($c:ident, events($run:ident)) => {
        $c.events = Some(*$run);
    };
    ($c:ident, deletes) => {
        $c.deletes = true;
    };
    ($c:ident, sweeps) => {
        $c.sweeps = true;
    };
    ($c:ident, records_step($run:ident, $step:ident)) => {
        $c.records_step = Some((*$run, *$step));
    };
    ($c:ident, requeues_entry($entry:ident)) => {
        $c.requeues_entry = Some(*$entry);
    };
    ($c:ident, takes_slot($provider:ident, $slots:ident, $holder:ident, $hold_ms:ident)) => {
        $c.takes_slot = Some($crate::db::SlotTake {
            provider: $provider.as_str(),
            slots: *$slots,
            holder: $holder.as_str(),
            hold_ms: *$hold_ms,
        });
    };
    ($c:ident, frees_slot($provider:ident, $holder:ident)) => {
        $c.frees_slot = Some(($provider.as_str(), $holder.as_str()));
    };
    ($c:ident, takes_token($provider:ident, $interval_ns:ident, $burst:ident)) => {
        $c.takes_token = Some(($provider.as_str(), *$interval_ns, *$burst));
    };
    ($c:ident, binds_key($key:ident)) => {
        $c.binds_key = Some($key.as_str());
    };
    ($c:ident, ticks($schedule:ident)) => {
        $c.ticks = Some($schedule.as_str());
    };
    ($c:ident, expires_keys) => {
        $c.expires_keys = true;
    };
}
pub(super) use class_of;
