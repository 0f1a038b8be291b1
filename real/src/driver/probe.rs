//! Observing the driver: the [`Probe`] trait, and the probes made of
//! others (none, a pair, an optional one).

use super::{RoleId, Start};
use pelican_model::ids::{EntryId, Fence, WorkerId};
use pelican_model::protocol::{
    Command, DeliveryEnd, Execution, Input, MaintenanceTask, PassReport,
};
use pelican_model::status::JobOutcome;
use pelican_model::time::Timestamp;
use std::collections::BTreeSet;
use std::time::Duration;

/// Observes the driver. Every method defaults to nothing, so a probe pays
/// only for what it watches. The simulator's oracle, the live worker's
/// metrics and its protocol trace are probes.
pub trait Probe: Send + Sync + 'static {
    /// Whether [`Probe::sent`] and [`Probe::started`] keep anything. When
    /// false the driver may leave out the calls whose arguments it would
    /// copy only for them (each delivery's start, each job's execution).
    fn keeps_roles(&self) -> bool {
        true
    }
    /// `role` issued `command`.
    fn sent(&self, role: &RoleId, command: &Command) {
        let _ = (role, command);
    }
    /// `role` received `input` at `now` (the time the role handles it at).
    fn received(&self, role: &RoleId, now: Timestamp, input: &Input) {
        let _ = (role, now, input);
    }
    /// A role instance started (see [`Start`]).
    fn started(&self, role: &RoleId, start: &Start) {
        let _ = (role, start);
    }
    /// A job starts, in delivery `role`, under the attempt it claimed
    /// (`own_fence`).
    fn executing(&self, role: &RoleId, execution: &Execution, own_fence: Option<Fence>) {
        let _ = (role, execution, own_fence);
    }
    /// A job ran to `outcome` in `took` (from its start to its outcome
    /// reaching the delivery; a job the delivery aborted reports nothing).
    fn job_ended(&self, role: &RoleId, outcome: &JobOutcome, took: Duration) {
        let _ = (role, outcome, took);
    }
    /// `role`'s statement `statement` (a [`DbOp::name`](pelican_model::db::DbOp::name)) got `input`: a
    /// reply, or [`Input::Unavailable`].
    fn db_answered(&self, role: &RoleId, statement: &'static str, input: &Input) {
        let _ = (role, statement, input);
    }
    /// A delivery ended.
    fn delivery_end(&self, worker: WorkerId, entry: EntryId, end: DeliveryEnd) {
        let _ = (worker, entry, end);
    }
    /// A maintenance pass of `worker` ended, having done `report`.
    fn maintained(&self, worker: WorkerId, task: MaintenanceTask, report: &PassReport) {
        let _ = (worker, task, report);
    }
    /// The deleted pending IDs `worker`'s reclaimer still owes a recovery.
    fn reclaimer_holds(&self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        let _ = (worker, held);
    }
}

/// A probe that observes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbe;
impl Probe for NoProbe {
    fn keeps_roles(&self) -> bool {
        false
    }
}

/// Two probes observe together.
impl<A: Probe, B: Probe> Probe for (A, B) {
    fn keeps_roles(&self) -> bool {
        self.0.keeps_roles() || self.1.keeps_roles()
    }
    fn sent(&self, role: &RoleId, command: &Command) {
        self.0.sent(role, command);
        self.1.sent(role, command);
    }
    fn received(&self, role: &RoleId, now: Timestamp, input: &Input) {
        self.0.received(role, now, input);
        self.1.received(role, now, input);
    }
    fn started(&self, role: &RoleId, start: &Start) {
        self.0.started(role, start);
        self.1.started(role, start);
    }
    fn executing(&self, role: &RoleId, execution: &Execution, own_fence: Option<Fence>) {
        self.0.executing(role, execution, own_fence);
        self.1.executing(role, execution, own_fence);
    }
    fn job_ended(&self, role: &RoleId, outcome: &JobOutcome, took: Duration) {
        self.0.job_ended(role, outcome, took);
        self.1.job_ended(role, outcome, took);
    }
    fn db_answered(&self, role: &RoleId, statement: &'static str, input: &Input) {
        self.0.db_answered(role, statement, input);
        self.1.db_answered(role, statement, input);
    }
    fn delivery_end(&self, worker: WorkerId, entry: EntryId, end: DeliveryEnd) {
        self.0.delivery_end(worker, entry, end);
        self.1.delivery_end(worker, entry, end);
    }
    fn maintained(&self, worker: WorkerId, task: MaintenanceTask, report: &PassReport) {
        self.0.maintained(worker, task, report);
        self.1.maintained(worker, task, report);
    }
    fn reclaimer_holds(&self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        self.0.reclaimer_holds(worker, held);
        self.1.reclaimer_holds(worker, held);
    }
}

/// An optional probe.
impl<P: Probe> Probe for Option<P> {
    fn keeps_roles(&self) -> bool {
        self.as_ref().is_some_and(P::keeps_roles)
    }
    fn sent(&self, role: &RoleId, command: &Command) {
        if let Some(p) = self {
            p.sent(role, command);
        }
    }
    fn received(&self, role: &RoleId, now: Timestamp, input: &Input) {
        if let Some(p) = self {
            p.received(role, now, input);
        }
    }
    fn started(&self, role: &RoleId, start: &Start) {
        if let Some(p) = self {
            p.started(role, start);
        }
    }
    fn executing(&self, role: &RoleId, execution: &Execution, own_fence: Option<Fence>) {
        if let Some(p) = self {
            p.executing(role, execution, own_fence);
        }
    }
    fn job_ended(&self, role: &RoleId, outcome: &JobOutcome, took: Duration) {
        if let Some(p) = self {
            p.job_ended(role, outcome, took);
        }
    }
    fn db_answered(&self, role: &RoleId, statement: &'static str, input: &Input) {
        if let Some(p) = self {
            p.db_answered(role, statement, input);
        }
    }
    fn delivery_end(&self, worker: WorkerId, entry: EntryId, end: DeliveryEnd) {
        if let Some(p) = self {
            p.delivery_end(worker, entry, end);
        }
    }
    fn maintained(&self, worker: WorkerId, task: MaintenanceTask, report: &PassReport) {
        if let Some(p) = self {
            p.maintained(worker, task, report);
        }
    }
    fn reclaimer_holds(&self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        if let Some(p) = self {
            p.reclaimer_holds(worker, held);
        }
    }
}
