//! Driving the short-lived roles: a maintenance pass, a submission, a cancel.

use super::{DbClient, Io, Probe, RoleId, StreamClient};
use pelican_model::ids::{RunId, WorkerId};
use pelican_model::protocol::{
    Command, DbOp, DbReply, Input, Maintenance, MaintenanceTask, Submitter, SubmitterEnd,
    Unavailable,
};
use pelican_model::world::Issuer;

/// Runs one maintenance pass of `task` to its end, on the worker's
/// maintenance loop `m` (idle before and after).
pub async fn maintain<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    worker: WorkerId,
    m: &mut Maintenance,
    task: MaintenanceTask,
) {
    let role = RoleId::Maintenance(worker);
    let by = Issuer::worker(worker);
    let start = io.now();
    io.probe
        .started(&role, &super::Start::Maintenance { now: start, task });
    m.start(task);
    while let Some(command) = m.poll() {
        let (at, input) = io.run_at(&role, command, by).await;
        m.handle(at, input);
    }
    debug_assert!(m.is_idle());
}

/// Submits run `run`, under the client's idempotency `key` if given:
/// inserts it durably, then publishes it. `Accepted` means the row is
/// durable (the API answers 202); a failed publish is left to the outbox.
/// A key already used answers the run it made (`Existing`, or
/// `KeyConflict` for another request) and stores nothing.
pub async fn submit<S: StreamClient, D: DbClient, P: Probe>(
    io: &Io<S, D, P>,
    run: RunId,
    kind: &str,
    input: &str,
    key: Option<&str>,
) -> SubmitterEnd {
    let role = RoleId::Submitter(run);
    io.probe.started(
        &role,
        &super::Start::Submit {
            run,
            kind: kind.to_owned(),
            input: input.to_owned(),
            key: key.map(str::to_owned),
        },
    );
    let mut s = Submitter::new(&io.config.policy, run, kind, input, key);
    while let Some(command) = s.poll() {
        let (at, input) = io.run_at(&role, command, Issuer::default()).await;
        s.handle(at, input);
    }
    s.end()
        .expect("a submission ends once its commands are answered")
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
        .run(&role, Command::Db(DbOp::Cancel { run }), Issuer::default())
        .await
    {
        Input::Db(DbReply::Rows(n)) => Ok(n == 1),
        _ => Err(Unavailable),
    }
}
