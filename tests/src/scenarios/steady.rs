//! Housekeeping and recovery at the pace their work arrives: a backlog is
//! worked off in batches, pass after pass, not a small batch per period.
//! Each scenario gives the old pace (one batch of 64 per round) minutes of
//! work, and the new one seconds: it waits far longer than the new pace
//! needs and far less than the old one did.

use super::{agent, sleep_ms};
use crate::{Env, free_port};
use pelican_model::ids::RunId;
use pelican_model::status::RunStatus;
use std::time::{Duration, Instant};

/// Runs a backlog scenario submits: enough that a batch of 64 per round
/// would take over two minutes at one round every two seconds.
const BACKLOG: usize = 5_000;

/// Submits `n` no-op runs with `pelican submit --from-file`, and counts
/// them as accepted.
fn submit_noops(env: &mut Env, n: usize) {
    env.submit_noops_from_file(n);
    let runs: Vec<RunId> = env.db().runs.keys().copied().collect();
    assert_eq!(runs.len(), n, "every line is a run");
    for run in runs {
        env.accepted.insert(run);
        env.effects.insert(run, 0);
    }
}

fn wait_within(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        sleep_ms(200);
    }
}

/// The series (as exposed, with its labels) on the worker's `/metrics` at
/// `listen`.
fn metric(listen: &str, series: &str) -> Option<f64> {
    crate::metric(&format!("http://{listen}/metrics"), None, series)
}

/// Retention deletes a backlog of finished runs in one maintenance round,
/// batch after batch, and reports the rows it deleted.
pub fn retention_keeps_pace_with_finished_runs(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    submit_noops(&mut env, BACKLOG);
    let listen = format!("127.0.0.1:{}", free_port());
    let flags = [
        "--keep-finished-ms",
        "1",
        "--maintenance-every-ms",
        "2000",
        "--metrics-listen",
        &listen,
    ];
    let _w = env.worker(1, None, &flags);
    wait_within(
        "retention deletes every finished run",
        Duration::from_secs(30),
        || env.db().runs.is_empty(),
    );
    let deleted = metric(
        &listen,
        r#"pelican_maintenance_rows_total{task="retention"}"#,
    );
    assert_eq!(deleted, Some(BACKLOG as f64), "the pace metric counts them");
    let behind = metric(&listen, r#"pelican_maintenance_behind{task="retention"}"#);
    assert_eq!(behind, Some(0.0), "caught up");
    env.accepted.clear();
}

/// Redis loses a backlog of queued runs: the sweeper re-dispatches them and
/// the outbox publishes them again, a batch after another, each batch's
/// publications as one pipeline, until every run has run once.
pub fn a_redis_wipe_is_recovered_at_the_servers_pace(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    submit_noops(&mut env, BACKLOG);
    env.redis.wipe();
    let flags = ["--sweep-grace-ms", "1000", "--maintenance-every-ms", "2000"];
    let _w = env.worker(1, None, &flags);
    wait_within(
        "every run of the wiped backlog succeeds",
        Duration::from_secs(40),
        || {
            env.db()
                .runs
                .values()
                .all(|r| r.status == RunStatus::Succeeded)
        },
    );
    let db = env.check(&[]);
    assert!(
        db.runs
            .values()
            .all(|r| r.dispatch.0 == 2 && r.attempts == 1),
        "each run re-dispatched once and run once"
    );
}

/// Retention deletes a keyed run, not its `Idempotency-Key`: a retry under
/// the key within its window names the deleted run and makes none, and
/// another request under it is a conflict.
pub fn retention_keeps_a_keys_window(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("tok");
    let flags = ["--keep-finished-ms", "1", "--maintenance-every-ms", "100"];
    let _w = env.worker(1, None, &flags);
    let submit = |input: serde_json::Value| {
        let mut resp = agent()
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer tok")
            .header("Idempotency-Key", "order-17")
            .send_json(serde_json::json!({ "kind": "noop", "input": input }))
            .expect("the API answers");
        let body: serde_json::Value = resp.body_mut().read_json().unwrap_or_default();
        (resp.status().as_u16(), body["run_id"].as_u64().map(RunId))
    };
    let (status, run) = submit(serde_json::json!({}));
    assert_eq!(status, 202);
    let run = run.expect("a run id");
    wait_within("retention deletes the run", Duration::from_secs(30), || {
        !env.db().runs.contains_key(&run)
    });
    assert_eq!(
        submit(serde_json::json!({})),
        (200, Some(run)),
        "the key's run, deleted"
    );
    assert_eq!(
        submit(serde_json::json!({ "x": 1 })).0,
        422,
        "another request"
    );
    sleep_ms(500);
    assert!(env.db().runs.is_empty(), "no second run");
    env.check(&[]);
}

/// A stopped worker's consumer is deleted once idle; a killed worker's
/// that still holds a delivery is kept, its entry pending for the
/// reclaimer. w1 runs a job and stops; w2 is killed running one; w3,
/// busy with a long job of its own (so its reclaimer has no room to take
/// anything), forgets w1's consumer and keeps w2's. Then the long job is
/// cancelled, and w3 reclaims w2's run and finishes it.
pub fn idle_consumers_are_forgotten_unless_they_hold(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let quick = env.submit("noop", "{}", 3);
    let w1 = env.worker(1, None, &[]);
    super::wait_for("w1 runs its job", || {
        env.db().runs[&quick].status == RunStatus::Succeeded
    });
    w1.term();
    let held = env.submit("sleep", r#"{"ms":3000}"#, 3);
    let mut w2 = env.worker(2, None, &[]);
    super::wait_for("w2 runs its job", || {
        env.db().runs[&held].status == RunStatus::Running
    });
    w2.kill9();
    let busy = env.submit("sleep", r#"{"ms":600000}"#, 3);
    let _w3 = env.worker(3, None, &["--in-flight-max", "1"]);
    super::wait_for("w3 runs its own job", || {
        env.db().runs[&busy].status == RunStatus::Running
    });
    super::wait_for("w1's consumer is forgotten", || {
        !env.consumers().contains_key("w1")
    });
    // Idle past the threshold (2.5 s) by two sweep rounds and more: the
    // housekeeping has looked at it since.
    super::wait_for("w2's consumer is idle past the threshold", || {
        env.consumers().get("w2").is_none_or(|c| c.1 >= 5_000)
    });
    assert_eq!(
        env.consumers().get("w2").map(|c| c.0),
        Some(1),
        "the consumer of a killed worker, and the delivery it holds, are kept"
    );
    assert_eq!(
        env.db().runs[&held].attempts,
        1,
        "nothing took the run over yet"
    );
    env.cli_ok(&["cancel", &busy.0.to_string()]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&held].status, RunStatus::Succeeded);
    assert_eq!(
        db.runs[&held].attempts, 2,
        "w3 reclaimed the run from its entry"
    );
    assert_eq!(
        db.runs[&held].dispatch.0, 1,
        "from its own entry, not a new one"
    );
}
