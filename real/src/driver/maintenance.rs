//! Driving the short-lived roles: a maintenance pass, a submission, a cancel.

use super::{DbClient, Io, Probe, RoleId, StreamClient};
use pelican_model::db::{Delay, query};
use pelican_model::ids::{RunId, WorkerId};
use pelican_model::protocol::{
    Command, Maintenance, MaintenanceTask, PassReport, Policy, Submitter, SubmitterEnd, Unavailable,
};
use pelican_model::world::Issuer;

/// Runs one maintenance pass of `task` to its end, on the worker's
/// maintenance loop `m` (idle before and after), and says what it did.
/// Each group of commands the pass sends at once goes out together
/// ([`Io::run_each`]): a batch's publications as one pipeline, its marks
/// as one statement.
pub async fn maintain<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    worker: WorkerId,
    m: &mut Maintenance,
    task: MaintenanceTask,
) -> PassReport {
    let role = RoleId::Maintenance(worker);
    let by = Issuer::worker(worker);
    let start = io.now();
    io.probe
        .started(&role, &super::Start::Maintenance { now: start, task });
    m.start(task, start);
    loop {
        let group: Vec<(RoleId, Command, Issuer)> = std::iter::from_fn(|| m.poll())
            .map(|c| (role.clone(), c, by))
            .collect();
        if group.is_empty() {
            break;
        }
        for (at, input) in io.run_each(group).await {
            m.handle(at, input);
        }
    }
    debug_assert!(m.is_idle());
    let report = m.report();
    io.probe.maintained(worker, task, &report);
    report
}

/// Submits `new` as run `run`, under the client's idempotency key if it
/// has one: inserts it durably, then publishes it. `Accepted` means the
/// row is durable (the API answers 202); a failed publish is left to the
/// outbox. A key already used answers the run it made (`Existing`, or
/// `KeyConflict` for another request) and stores nothing.
pub async fn submit<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    run: RunId,
    new: &NewRun,
) -> SubmitterEnd {
    let role = RoleId::Submitter(run);
    let mut s = submitter(io, &role, run, new);
    while let Some(command) = s.poll() {
        let (at, input) = io.run_at(&role, command, Issuer::default()).await;
        s.handle(at, input);
    }
    s.end()
        .expect("a submission ends once its commands are answered")
}

/// A run to submit ([`submit`], [`submit_many`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRun {
    /// The job kind.
    pub kind: String,
    /// The job input (JSON text).
    pub input: String,
    /// The client's idempotency key, if any.
    pub key: Option<String>,
    /// The caller's W3C `traceparent`, if any: the run's spans join its
    /// trace.
    pub trace: Option<String>,
    /// When it may start ([`Delay::NONE`]: at once).
    pub delay: Delay,
}

impl NewRun {
    /// A run of `kind` with `input` (JSON text), without a key or a trace.
    #[must_use]
    pub fn new(kind: &str, input: &str) -> NewRun {
        NewRun {
            kind: kind.to_owned(),
            input: input.to_owned(),
            ..NewRun::default()
        }
    }
}

/// `new`'s submitter as run `run`, its start reported as `role`'s.
fn submitter<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    role: &RoleId,
    run: RunId,
    new: &NewRun,
) -> Submitter {
    io.probe.started(
        role,
        &super::Start::Submit {
            run,
            kind: new.kind.clone(),
            input: new.input.clone(),
            key: new.key.clone(),
            trace: new.trace.clone(),
            delay: new.delay,
        },
    );
    let s = Submitter::new(
        &io.config.policy,
        run,
        &new.kind,
        &new.input,
        new.key.as_deref(),
    );
    let s = match &new.trace {
        Some(t) => s.traced(t),
        None => s,
    };
    s.delayed(new.delay)
}

/// `count` fresh run ids, from one statement.
///
/// # Errors
/// Postgres did not answer: no id was handed out to anyone who will use
/// it, and nothing was stored.
pub async fn new_run_ids<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    count: usize,
) -> Result<Vec<RunId>, Unavailable> {
    let count = u32::try_from(count).map_err(|_| Unavailable)?;
    match io.db.query(query::NextRunIds { count }).await {
        Ok(ids) if ids.len() == count as usize => Ok(ids),
        _ => Err(Unavailable),
    }
}

/// Submits `runs` (each with its id, from [`new_run_ids`]) together: one
/// [`Submitter`] each, driven in step, each step's commands sent at once
/// ([`Io::run_each`]): the inserts as one statement, the publications as
/// one pipeline, the marks as one statement. Answers each run's end, in
/// order: every run keeps its own key and its own answer, and a value
/// Postgres refuses fails only its run. A key that comes again later in
/// `runs` is submitted after its first run has its answer, so the first in
/// order is the key's run, as if they were sent one by one.
pub async fn submit_many<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    runs: &[(RunId, NewRun)],
) -> Vec<SubmitterEnd> {
    let mut keys = std::collections::BTreeSet::new();
    let (first, again): (Vec<usize>, Vec<usize>) =
        (0..runs.len()).partition(|&i| runs[i].1.key.as_ref().is_none_or(|k| keys.insert(k)));
    let mut machines: Vec<(usize, RoleId, Submitter)> = first
        .into_iter()
        .map(|i| {
            let (run, r) = &runs[i];
            let role = RoleId::Submitter(*run);
            let s = submitter(io, &role, *run, r);
            (i, role, s)
        })
        .collect();
    loop {
        let (at, commands): (Vec<usize>, Vec<(RoleId, Command, Issuer)>) = machines
            .iter_mut()
            .enumerate()
            .filter_map(|(m, (_, role, s))| Some((m, (role.clone(), s.poll()?, Issuer::default()))))
            .unzip();
        if commands.is_empty() {
            break;
        }
        for (m, (now, input)) in at.into_iter().zip(io.run_each(commands).await) {
            machines[m].2.handle(now, input);
        }
    }
    let mut ends = vec![SubmitterEnd::Unavailable; runs.len()];
    for (i, _, s) in machines {
        ends[i] = s
            .end()
            .expect("a submission ends once its commands are answered");
    }
    for i in again {
        let (run, r) = &runs[i];
        ends[i] = submit(io, *run, r).await;
    }
    ends
}

/// Cancels `run` (S7): `Ok(true)` if this request made it cancelled,
/// `Ok(false)` if it was already terminal or unknown.
///
/// # Errors
/// `Unavailable` when the database did not answer; the cancel may or may not
/// have happened, and is safe to repeat.
pub async fn cancel<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    run: RunId,
) -> Result<bool, Unavailable> {
    let role = RoleId::Cancel(run);
    match io
        .query(&role, query::Cancel { run }, Issuer::default())
        .await
    {
        Ok(n) => Ok(n == 1),
        Err(_) => Err(Unavailable),
    }
}

/// What an operator's requeue of a dead run came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeued {
    /// Queued again.
    Yes,
    /// The run exists but is not dead awaiting a requeue.
    NotDead,
    /// No such run.
    NoRun,
}

/// An operator's requeue of dead run `run`: `extra_attempts` more, and a
/// fresh budget as `policy` gives the run's kind (read without its
/// values), with its count of unknown errors reset: the run starts over
/// as a new submission would.
///
/// # Errors
/// `Unavailable` when Postgres did not answer; the requeue may or may not
/// have happened, and is safe to repeat (a second finds it not dead).
pub async fn requeue_dead<D: DbClient>(
    db: &D,
    policy: &Policy,
    run: RunId,
    extra_attempts: u32,
) -> Result<Requeued, Unavailable> {
    let head = db.query(query::ReadRunHead { run }).await;
    let Some(kind) = head.map_err(|_| Unavailable)?.map(|r| r.kind) else {
        return Ok(Requeued::NoRun);
    };
    let q = query::DlqRequeue {
        run,
        extra_attempts,
        budget_ms: policy.kind(&kind).budget_ms.unwrap_or(0),
    };
    match db.query(q).await.map_err(|_| Unavailable)? {
        1 => Ok(Requeued::Yes),
        _ => Ok(Requeued::NotDead),
    }
}
