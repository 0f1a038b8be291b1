//! The live scenarios (one function each, all listed here, hence the
//! length): each builds its own [`Env`] (with `mutant` injected
//! into every process, if given), drives real `pelican` processes through a
//! failure, and panics if any guarantee is broken. `tests/live.rs` runs each
//! on the correct build (it must pass); `tests/mutants.rs` runs each mutant
//! against the scenario that exposes it (it must fail).

mod delays;
mod events;
mod hygiene;
mod incident;
mod operate;
mod runs_api;
mod schedules;
mod steady;
mod telemetry;

pub use operate::{
    pelican_bench_reports_a_deployments_drain, pelican_dev_runs_everything_and_stops_clean,
    the_deploy_kit_names_only_exported_metrics, worker_probes_follow_its_connections,
};

pub use runs_api::{
    requeue_gives_a_fresh_budget_and_unknown_count, the_api_conforms_to_its_openapi_document,
    the_openapi_document_is_the_served_routes, the_queue_route_reports_lag_and_pending,
    the_runs_api_lists_pages_and_requeues,
};

pub use hygiene::{
    a_keyed_bulk_is_one_statement, a_partition_count_is_the_deployments,
    logs_carry_ids_and_names_never_values, the_api_bounds_slow_heads_and_connections,
    tokens_are_read_as_secret_stores_write_them,
};

pub use steady::{
    a_redis_wipe_is_recovered_at_the_servers_pace, idle_consumers_are_forgotten_unless_they_hold,
    retention_keeps_a_keys_window, retention_keeps_pace_with_finished_runs,
};

pub use delays::delayed_runs_start_when_due;
pub use incident::the_incident_routes_find_count_and_act_in_bulk;
pub use schedules::schedule_ticks_run_once;
pub use telemetry::runs_export_their_spans_to_an_otlp_receiver;

pub use events::{
    a_late_attempts_progress_is_refused, an_events_stream_ends_at_a_full_reads_terminal_event,
    one_reader_feeds_every_events_stream, run_events_survive_a_kill_and_a_reconnect,
    sigterm_ends_an_apis_events_streams, the_client_library_against_the_api,
};

use crate::{Cluster, Database, Env};
use pelican_model::ids::{EntryId, RunId};
use pelican_model::protocol::{DbOp, DbReply, KindPolicy};
use pelican_model::status::{ErrorClass, RunStatus};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Sweeper grace long enough that only the protocol path under test can
/// recover a run (the sweeper is the safety net of last resort).
const NO_SWEEP: &[&str] = &["--sweep-grace-ms", "600000"];

/// Worker flags that take a dead worker's deliveries over within seconds:
/// a 2 s lease, heartbeats every 500 ms, reclaims of deliveries idle 2.5 s.
const FAST_TAKEOVER: &[&str] = &[
    "--lease-ms",
    "2000",
    "--heartbeat-ms",
    "500",
    "--reclaim-min-idle-ms",
    "2500",
];

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        sleep_ms(50);
    }
}

/// The happy path through the API: submit, two workers, every outcome right.
pub fn through_the_api(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("sekret");
    let _w1 = env.worker(1, None, &[]);
    let _w2 = env.worker(2, None, &[]);
    let agent = agent();
    let jobs = [
        ("noop", json!({}), "succeeded"),
        ("sleep", json!({"ms": 300}), "succeeded"),
        ("effect", json!({"calls": 3}), "succeeded"),
        (
            "fail",
            json!({"class": "retryable", "times": 1}),
            "succeeded",
        ),
        ("fail", json!({"class": "terminal", "times": 5}), "failed"),
        ("fail", json!({"class": "retryable", "times": 9}), "dead"),
        ("panic", json!({"times": 1}), "succeeded"),
    ];
    let mut ids = Vec::new();
    for (kind, input, _) in &jobs {
        let mut resp = agent
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer sekret")
            .send_json(json!({ "kind": kind, "input": input }))
            .expect("the API answers");
        assert_eq!(resp.status().as_u16(), 202);
        let body: Value = resp.body_mut().read_json().expect("JSON");
        let id = RunId(body["run_id"].as_u64().expect("a run id"));
        env.accepted.insert(id);
        env.effects
            .insert(id, pelican_real::jobs::effects_of(kind, &input.to_string()));
        ids.push(id);
    }
    env.settle();
    env.check(&[]);
    for (id, (kind, _, want)) in ids.iter().zip(&jobs) {
        let mut resp = agent
            .get(format!("{base}/runs/{}", id.0))
            .header("Authorization", "Bearer sekret")
            .call()
            .expect("the API answers");
        assert_eq!(resp.status().as_u16(), 200);
        let body: Value = resp.body_mut().read_json().expect("JSON");
        assert_eq!(body["status"], *want, "{kind}: {body}");
        assert!(body["attempts"].as_array().is_some_and(|a| !a.is_empty()));
    }
    let mut metrics = agent
        .get(format!("{base}/metrics"))
        .header("Authorization", "Bearer sekret")
        .call()
        .expect("metrics");
    let text = metrics.body_mut().read_to_string().expect("text");
    // Live runs only: counting finished ones would scan them all.
    for status in ["queued", "running", "retry_wait"] {
        let line = format!("pelican_runs{{status=\"{status}\"}} 0");
        assert!(text.contains(&line), "{line}: {text}");
    }
    assert!(
        !text.contains("pelican_runs{status=\"succeeded\""),
        "{text}"
    );
    assert!(text.contains("pelican_pel_count 0"), "{text}");
}

/// What the first worker left when its crash point killed it.
enum Killed {
    /// Its deliveries, pending in the group.
    Pending,
    /// The run's outcome committed, its entry not acknowledged.
    Committed,
    /// Nothing this scenario looks at.
    Anything,
}

/// A crash-point scenario: runs of `kind` with `input`, whose first worker
/// dies at crash point `point`, finished by a second worker (both with
/// `flags`); what the kill left, and the history every run must have after.
struct Crash {
    point: &'static str,
    kind: &'static str,
    input: &'static str,
    runs: usize,
    flags: &'static [&'static str],
    killed: Killed,
    /// Attempts each run took (`None`: not fixed).
    attempts: Option<u32>,
    /// How often the tool service was asked for each call, by call.
    requests: &'static [u64],
    /// Each recorded step, with the fence of the attempt that recorded it.
    recorded_by: &'static [(u32, u64)],
}

/// One scenario a row of the table: its doc, its name, the crash point and
/// the expected history.
macro_rules! crash_points {
    ($($(#[doc = $doc:literal])* $name:ident: $crash:expr;)*) => {$(
        $(#[doc = $doc])*
        pub fn $name(mutant: Option<&str>) {
            killed_at(mutant, &$crash);
        }
    )*};
}

crash_points! {
    /// Kill right after XREADGROUP: the entries stay pending and another
    /// worker reclaims and runs them.
    kill_right_after_receive: Crash {
        point: "after_receive", kind: "noop", input: "{}", runs: 3, flags: &[],
        killed: Killed::Pending, attempts: None, requests: &[], recorded_by: &[],
    };
    /// Kill after the outcome is committed, before XACK: the run is not run
    /// again; the redelivered entry is acknowledged as already terminal.
    kill_after_commit_before_ack: Crash {
        point: "before_ack", kind: "effect", input: r#"{"calls":1}"#, runs: 1, flags: &[],
        killed: Killed::Committed, attempts: Some(1), requests: &[1], recorded_by: &[],
    };
    /// Kill right after XACK: with ack-after-commit the outcome is already
    /// durable, so nothing is left to recover (the sweeper is off).
    kill_right_after_ack: Crash {
        point: "after_ack", kind: "noop", input: "{}", runs: 1, flags: NO_SWEEP,
        killed: Killed::Anything, attempts: None, requests: &[], recorded_by: &[],
    };
    /// Kill right after a side effect: the retry sends the same idempotency
    /// key and the tool service does not apply it twice.
    kill_right_after_the_side_effect: Crash {
        point: "after_effect", kind: "effect", input: r#"{"calls":2}"#, runs: 1, flags: &[],
        killed: Killed::Anything, attempts: Some(2), requests: &[2, 1], recorded_by: &[],
    };
    /// Kill between a durable step's external call and its record: the next
    /// attempt runs the step again (the key keeps the call applied once) and
    /// records both steps under its own fence.
    kill_between_a_steps_call_and_its_record: Crash {
        point: "after_effect", kind: "steps", input: r#"{"calls":2}"#, runs: 1, flags: &[],
        killed: Killed::Anything, attempts: Some(2), requests: &[2, 1],
        recorded_by: &[(0, 2), (1, 2)],
    };
    /// Kill right after a durable step is recorded: the next attempt replays
    /// it without calling out again, and runs only the step after it.
    kill_right_after_a_step_is_recorded: Crash {
        point: "after_step_record", kind: "steps", input: r#"{"calls":2}"#, runs: 1, flags: &[],
        killed: Killed::Anything, attempts: Some(2), requests: &[1, 1],
        recorded_by: &[(0, 1), (1, 2)],
    };
}

/// Runs crash-point scenario `c` (see [`Crash`]) and checks its history.
fn killed_at(mutant: Option<&str>, c: &Crash) {
    let mut env = Env::mutated(mutant);
    let runs: Vec<_> = (0..c.runs)
        .map(|_| env.submit(c.kind, c.input, 3))
        .collect();
    let mut w1 = env.worker(1, Some(c.point), c.flags);
    let status = w1.wait(Duration::from_secs(20));
    match c.killed {
        Killed::Pending => {
            assert!(!status.success(), "the crash point killed it");
            assert!(env.pel_len() > 0, "its deliveries are pending");
        }
        Killed::Committed => {
            assert_eq!(env.db().runs[&runs[0]].status, RunStatus::Succeeded);
            assert_eq!(env.pel_len(), 1, "committed but not acknowledged");
        }
        Killed::Anything => {}
    }
    let _w2 = env.worker(2, None, c.flags);
    env.settle();
    let db = env.check(&[]);
    for run in &runs {
        let r = &db.runs[run];
        assert_eq!(r.status, RunStatus::Succeeded, "run {run}");
        if let Some(attempts) = c.attempts {
            assert_eq!(r.attempts, attempts, "run {run}: attempts");
        }
        let requests: Vec<u64> = (0..c.requests.len())
            .map(|n| db.effects[&format!("{run}/{n}")])
            .collect();
        assert_eq!(
            requests, c.requests,
            "run {run}: requests by call, applied once each"
        );
        let recorded_by: Vec<(u32, u64)> = db
            .steps
            .iter()
            .filter(|((r, _), _)| r == run)
            .map(|((_, i), s)| (*i, s.fence.0))
            .collect();
        assert_eq!(
            recorded_by, c.recorded_by,
            "run {run}: each step's recording fence"
        );
    }
}

fn result_attempt(env: &Env, run: RunId) -> u64 {
    let db = env.db();
    let result = db.runs[&run].result.clone().unwrap_or_default();
    serde_json::from_str::<Value>(&result).expect("a JSON result")["attempt"]
        .as_u64()
        .expect("the sleep job reports its attempt")
}

/// A live long job is reclaimed prematurely (its worker paused past the
/// lease): the late worker's write is rejected and overwrites nothing.
pub fn premature_reclaim_of_a_live_long_job(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":3000}"#, 3);
    let w1 = env.worker(1, None, &[]);
    wait_for("w1 runs the job", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    w1.stop();
    let _w2 = env.worker(2, None, &[]);
    wait_for("w2 reclaims the run", || env.db().runs[&run].attempts >= 2);
    w1.cont();
    env.settle();
    let db = env.check(&[]);
    let r = &db.runs[&run];
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.attempts, 2);
    let attempts = db.read_attempts(run);
    assert_eq!(attempts[0].1.worker, "w1");
    assert_eq!(attempts[0].1.outcome, None, "the late write was rejected");
    assert_eq!(attempts[1].1.worker, "w2");
    assert_eq!(
        result_attempt(&env, run),
        2,
        "the result is the current attempt's"
    );
}

/// A late worker (stalled past its lease) must not acknowledge the entry
/// that another worker reclaimed and then died holding: the entry stays
/// pending and a third worker finishes the run.
pub fn late_worker_does_not_ack_a_reclaimed_entry(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":2500}"#, 5);
    // w1 runs the job, then stalls 6 s right before writing its outcome
    // (a SIGSTOP could let a heartbeat go first on resume, and a rejected
    // heartbeat is not the path under test). Once only: a stall on every
    // write would make each attempt w1 later reclaims a lost one too, and
    // the run could spend all five attempts on stalls and be dead-lettered.
    let _w1 = env.worker(1, Some("before_write=1*sleep(6000)"), NO_SWEEP);
    wait_for("w1 runs the job", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    let mut w2 = env.worker(2, None, NO_SWEEP);
    wait_for("w2 reclaims the run", || env.db().runs[&run].attempts >= 2);
    w2.kill9();
    // w1's write now goes out, and is rejected: w1 must leave the entry.
    sleep_ms(5000);
    let _w3 = env.worker(3, None, NO_SWEEP);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
}

/// Retryable errors back off through retry_at and end in the dead letters;
/// an operator's requeue runs the run again.
pub fn retryable_errors_back_off_then_dead_letter(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("fail", r#"{"class":"retryable","times":99}"#, 3);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Dead);
    assert_eq!(db.runs[&run].attempts, 3);
    let d = &db.dead_letters[&run];
    assert_eq!(d.attempts.len(), 3);
    assert_eq!(d.class, ErrorClass::Retryable, "died of its own errors");
    let out = env.cli(&["--json", "dlq", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("\"run_id\": {}", run.0)));
    // For people: a table, the run in its first column.
    let out = env.cli(&["dlq", "list"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(table.starts_with("run "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{} ", run.0)) && l.contains("retryable")),
        "{table}"
    );
    let out = env.cli(&["dlq", "requeue", &run.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].attempts, 4);
    assert_eq!(db.runs[&run].status, RunStatus::Dead);
}

/// An unknown error is retried at most `--unknown-retries-max` times, then
/// fails its run (not dead: attempts were left), while another run whose
/// unknown error clears on its second attempt succeeds.
pub fn unknown_errors_are_retried_up_to_the_cap(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("fail", r#"{"class":"unknown","times":99}"#, 5);
    let cleared = env.submit("fail", r#"{"class":"unknown","times":1}"#, 5);
    env.unknown_retries_max = 2;
    let _w = env.worker(1, None, &["--unknown-retries-max", "2"]);
    env.settle();
    let db = env.check(&[]);
    let r = &db.runs[&run];
    assert_eq!((r.status, r.attempts), (RunStatus::Failed, 3), "{r:?}");
    assert_eq!(r.error.as_ref().map(|e| e.0), Some(ErrorClass::Unknown));
    assert_eq!(r.unknown_failures, 2);
    assert!(!db.dead_letters.contains_key(&run));
    assert_eq!(db.runs[&cleared].status, RunStatus::Succeeded);
}

/// Kinds' policies bound their runs. A run that keeps failing is failed
/// as `budget_exhausted` once its kind's elapsed budget is spent, with
/// attempts left and no dead letter; an attempt still running when the
/// budget runs out is cut short the same way; an attempt longer than its
/// kind's attempt timeout fails retryably, and the kind's own attempts
/// bound the retries.
pub fn budgets_and_timeouts_bound_runs(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let policy = |attempts_max, backoff_ms, attempt_timeout_ms, budget_ms| {
        let mut p = KindPolicy::default();
        p.attempts_max = attempts_max;
        (p.backoff_base_ms, p.backoff_cap_ms) = (backoff_ms, backoff_ms);
        p.attempt_timeout_ms = attempt_timeout_ms;
        p.budget_ms = budget_ms;
        p
    };
    env.kinds = [
        ("fail", policy(Some(20), Some(300), None, Some(1_500))),
        ("sleep", policy(None, None, None, Some(1_200))),
        ("effect", policy(Some(2), Some(100), Some(300), None)),
    ]
    .into_iter()
    .map(|(k, p)| (k.to_owned(), p))
    .collect();
    let failing = env.submit("fail", r#"{"class":"retryable","times":99}"#, 5);
    let slow = env.submit("sleep", r#"{"ms":5000}"#, 5);
    let timed_out = env.submit("effect", r#"{"calls":1,"ms":1000}"#, 5);
    let args = env.kind_policy_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _w = env.worker(1, None, &args);
    env.settle();
    let db = env.check(&[]);
    let class = |run: RunId| db.runs[&run].error.as_ref().map(|e| e.0);
    let r = &db.runs[&failing];
    assert_eq!(r.status, RunStatus::Failed, "{r:?}");
    assert_eq!(class(failing), Some(ErrorClass::BudgetExhausted), "{r:?}");
    assert!((2..20).contains(&r.attempts), "{r:?}");
    assert!(!db.dead_letters.contains_key(&failing));
    let r = &db.runs[&slow];
    assert_eq!((r.status, r.attempts), (RunStatus::Failed, 1), "{r:?}");
    assert_eq!(class(slow), Some(ErrorClass::BudgetExhausted), "{r:?}");
    let r = &db.runs[&timed_out];
    assert_eq!((r.status, r.attempts), (RunStatus::Dead, 2), "{r:?}");
    let message = r.error.as_ref().map(|e| e.1.as_str()).unwrap_or_default();
    assert!(message.contains("timed out after 300 ms"), "{r:?}");
}

/// A provider's limits hold across two workers with 8 job slots each:
/// 16 `limited` runs of provider `p` (2 at once, 4 started per second)
/// never overlap more than 2 deep nor start more than 4 (plus one for
/// clock jitter) in any second, and both workers ran some. The control,
/// 8 runs of an unlimited provider, does overlap: the workers could have
/// broken the limits.
pub fn provider_limits_hold_across_two_workers(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let limited: Vec<RunId> = (0..16)
        .map(|_| env.submit("limited", r#"{"provider":"p","ms":300}"#, 5))
        .collect();
    let free: Vec<RunId> = (0..8)
        .map(|_| env.submit("limited", r#"{"provider":"free","ms":300}"#, 5))
        .collect();
    let flags = [
        "--in-flight-max",
        "8",
        "--provider-limit",
        "p:concurrent=2,per_second=4",
    ];
    let _w1 = env.worker(1, None, &flags);
    let _w2 = env.worker(2, None, &flags);
    env.settle();
    let db = env.check(&[]);
    let spans = |runs: &[RunId]| -> Vec<(u64, u64)> {
        runs.iter()
            .map(|run| {
                let r = &db.runs[run];
                assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
                let v: Value = serde_json::from_str(r.result.as_deref().unwrap_or("")).unwrap();
                (
                    v["started_ms"].as_u64().unwrap(),
                    v["ended_ms"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let deepest = |spans: &[(u64, u64)]| {
        spans
            .iter()
            .map(|(s, _)| spans.iter().filter(|(a, b)| a <= s && s < b).count())
            .max()
            .unwrap_or(0)
    };
    let busiest_second = |spans: &[(u64, u64)]| {
        spans
            .iter()
            .map(|(s, _)| {
                spans
                    .iter()
                    .filter(|(a, _)| s <= a && *a < s + 1_000)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let p = spans(&limited);
    assert!(deepest(&p) <= 2, "more than 2 calls at once: {p:?}");
    assert!(
        busiest_second(&p) <= 5,
        "more than 4 (+1) starts in a second: {p:?}"
    );
    let workers: BTreeSet<&str> = db
        .attempts
        .iter()
        .filter(|((run, _), _)| limited.contains(run))
        .map(|(_, a)| a.worker.as_str())
        .collect();
    assert_eq!(
        workers.len(),
        2,
        "one worker ran every limited run: {workers:?}"
    );
    let f = spans(&free);
    assert!(
        deepest(&f) > 2 && busiest_second(&f) > 5,
        "the control never overlapped: {f:?}"
    );
}

/// A worker killed while it holds a provider's only slot keeps it held
/// for the permit's hold, not forever and not less: a second run of that
/// provider, on another worker, starts only once the hold has run out by
/// Postgres's clock, and the killed run is reclaimed and finishes too.
pub fn a_dead_workers_permit_frees_after_its_hold(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let first = env.submit("limited", r#"{"provider":"p","ms":100}"#, 3);
    let flags = ["--provider-limit", "p:concurrent=1,hold_ms=4000"];
    let mut w1 = env.worker(1, Some("after_permit"), &flags);
    w1.wait(Duration::from_secs(20));
    let (holder, until) = env.db().slots[&("p".to_owned(), 0)].clone();
    assert!(!holder.is_empty(), "the dead worker holds the slot");
    let until_ms = i64::try_from(until.as_ms()).unwrap();
    let second = env.submit("limited", r#"{"provider":"p","ms":100}"#, 3);
    let _w2 = env.worker(2, None, &flags);
    env.settle();
    let db = env.check(&[]);
    let started = |run: RunId| {
        let r = &db.runs[&run];
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        let v: Value = serde_json::from_str(r.result.as_deref().unwrap_or("")).unwrap();
        i64::try_from(v["started_ms"].as_u64().unwrap()).unwrap()
    };
    let (a, b) = (started(first), started(second));
    assert_eq!(
        db.runs[&first].attempts, 2,
        "the killed attempt was reclaimed"
    );
    // Both calls start after the hold; the clocks are one machine's.
    assert!(
        a >= until_ms && b >= until_ms,
        "a call started while the dead worker's permit held its slot (until {until_ms}): {a}, {b}"
    );
}

/// `pelican submit --from-file` stores and publishes 50,000 lines, a batch
/// of them at a time, and a bad line fails alone: one not JSON, one whose
/// kind is misspelt, one with an unknown field; a key given twice with the
/// same body answers its first run, and with another body is refused.
pub fn submit_from_file_stores_every_line(mutant: Option<&str>) {
    use std::fmt::Write as _;
    const LINES: u64 = 50_000;
    let env = Env::mutated(mutant);
    let mut text = String::new();
    for i in 0..LINES {
        let _ = writeln!(text, r#"{{"kind":"noop","input":{{"i":{i}}}}}"#);
    }
    for line in [
        "{not json",
        r#"{"kind":"Bad Kind"}"#,
        r#"{"kind":"noop","speed":1}"#,
        r#"{"kind":"noop","key":"k1"}"#,
        "",
        r#"{"kind":"noop","key":"k1"}"#,
        r#"{"kind":"noop","input":{"x":1},"key":"k1"}"#,
    ] {
        text.push_str(line);
        text.push('\n');
    }
    let path = std::env::temp_dir().join(format!("pelican-lines-{}.jsonl", std::process::id()));
    std::fs::write(&path, text).expect("the test writes its lines");
    let out = env.cli(&["--json", "submit", "--from-file", &path.to_string_lossy()]);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "bad lines fail the command: {stderr}"
    );
    assert!(stderr.contains("4 line(s)"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("it prints JSON");
    assert_eq!(
        (&v["accepted"], &v["existing"], &v["failed"]),
        (&json!(LINES + 1), &json!(1), &json!(4)),
        "{v}"
    );
    let failed: Vec<(u64, String)> = v["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|f| {
            (
                f["line"].as_u64().unwrap(),
                f["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let lines: Vec<u64> = failed.iter().map(|f| f.0).collect();
    assert_eq!(
        lines,
        [LINES + 1, LINES + 2, LINES + 3, LINES + 7],
        "{failed:?}"
    );
    assert!(failed[1].1.contains("kind"), "{failed:?}");
    assert!(failed[2].1.contains("unknown field"), "{failed:?}");
    assert!(failed[3].1.contains("another request"), "{failed:?}");
    let db = env.db();
    assert_eq!(db.runs.len() as u64, LINES + 1, "one run per good line");
    assert!(
        db.runs
            .values()
            .all(|r| r.published_at.is_some() && r.entry_id.is_some()),
        "every run published"
    );
    let len: u64 = redis::cmd("XLEN")
        .arg("pelican:jobs")
        .query(&mut env.redis.conn())
        .expect("XLEN");
    assert_eq!(len, LINES + 1, "one entry per run");
    let inputs: BTreeSet<&str> = db.runs.values().map(|r| r.input.as_str()).collect();
    assert!(inputs.contains(r#"{"i":0}"#) && inputs.contains(r#"{"i":49999}"#));
}

/// `POST /runs` with an array stores every good item and answers each on
/// its own: a bad kind (400), an unknown field (422), a key's first run
/// (202), the same item again (200, the first run), the key with another
/// body (422). An array with an `Idempotency-Key` header, an empty one and
/// one past `--bulk-max` store nothing. The stored runs run to their end.
pub fn bulk_submit_answers_each_item(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_with_flags("sekret", 3, &["--bulk-max", "8"]);
    let agent = agent();
    let post = |body: &Value, key: Option<&str>| {
        let mut req = agent
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer sekret");
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let mut resp = req.send_json(body).expect("the API answers");
        let status = resp.status().as_u16();
        (
            status,
            resp.body_mut().read_json::<Value>().unwrap_or(Value::Null),
        )
    };
    let items = json!([
        {"kind": "noop"},
        {"kind": "Bad Kind"},
        {"kind": "effect", "input": {"calls": 1}, "key": "b1"},
        {"kind": "noop", "speed": 1},
        {"kind": "effect", "input": {"calls": 1}, "key": "b1"},
        {"kind": "noop", "key": "b1"},
        {"kind": "sleep", "input": {"ms": 10}},
    ]);
    let (status, body) = post(&items, None);
    assert_eq!(status, 200, "{body}");
    let answers = body["runs"].as_array().expect("one answer per item");
    let codes: Vec<u64> = answers
        .iter()
        .map(|a| a["code"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, [202, 400, 202, 422, 200, 422, 202], "{body}");
    assert_eq!(
        answers[4]["run_id"], answers[2]["run_id"],
        "the key's first run"
    );
    for (i, a) in answers.iter().enumerate() {
        if [1, 3, 5].contains(&i) {
            assert!(a["error"].is_string(), "{a}");
        }
    }
    let stored = env.db().runs.len();
    assert_eq!(stored, 3, "the good items alone");
    for (body, key, want) in [
        (json!([{"kind": "noop"}]), Some("k"), 400),
        (json!([]), None, 400),
        (json!(vec![json!({"kind": "noop"}); 9]), None, 413),
    ] {
        let (status, answer) = post(&body, key);
        assert_eq!(status, want, "{answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    assert_eq!(env.db().runs.len(), stored, "nothing more stored");
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert!(
        db.runs.values().all(|r| r.status == RunStatus::Succeeded),
        "{:?}",
        db.runs
    );
}

/// A terminal error is not retried.
pub fn terminal_error_is_not_retried(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("fail", r#"{"class":"terminal","times":1}"#, 5);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Failed);
    assert_eq!(db.runs[&run].attempts, 1);
}

/// Values Postgres cannot store fail their run alone, on its first attempt,
/// as `unstorable`: a result holding a NUL byte, completed in the same
/// batches as 200 other runs, and a bad input whose error message holds one
/// (the field name serde quotes).
pub fn poison_values_fail_alone(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let runs: Vec<RunId> = (0..200).map(|_| env.submit("noop", "{}", 5)).collect();
    let poison = [
        env.submit("echo", r#"{"text":"poison\u0000"}"#, 5),
        env.submit("sleep", r#"{"\u0000x":1}"#, 5),
    ];
    let fast = [&["--in-flight-max", "256"], FAST_TAKEOVER].concat();
    let _w = env.worker(1, None, &fast);
    env.settle();
    let db = env.check(&[]);
    for run in runs {
        let r = &db.runs[&run];
        assert_eq!((r.status, r.attempts), (RunStatus::Succeeded, 1), "{run}");
    }
    for run in poison {
        let r = &db.runs[&run];
        assert_eq!(
            (r.status, r.attempts),
            (RunStatus::Failed, 1),
            "{run}: {r:?}"
        );
        assert_eq!(
            r.error.as_ref().map(|e| e.0),
            Some(ErrorClass::Unstorable),
            "{run}"
        );
    }
}

/// A `POST /runs` that waits on a lock on `runs` past the API's call
/// timeout gets 504 with an unknown outcome (its statement may still
/// commit, and here does). The client retries with the same
/// `Idempotency-Key` and gets the first run back: one run, executed once.
/// The same key with another body is refused (422).
pub fn keyed_retry_through_a_lock_wait(mutant: Option<&str>) {
    use sqlx::Connection;
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("sekret");
    let agent = agent();
    let post = |key: &str, body: &Value| {
        let mut r = agent
            .post(&format!("{base}/runs"))
            .header("Authorization", "Bearer sekret")
            .header("Idempotency-Key", key)
            .send_json(body)
            .expect("the API answers");
        let status = r.status().as_u16();
        let body: Value = r.body_mut().read_json().expect("a JSON body");
        (status, body)
    };
    let body = json!({"kind": "effect", "input": {"calls": 1}});
    // Hold an exclusive lock on `runs` for 3 s: past the 1 s call timeout.
    let url = env.database_url.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        crate::rt().block_on(async move {
            let mut c = sqlx::PgConnection::connect(&url).await.expect("Postgres");
            let mut tx = c.begin().await.expect("BEGIN");
            sqlx::query("LOCK TABLE runs IN EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await
                .expect("LOCK");
            locked_tx.send(()).expect("the test waits");
            tokio::time::sleep(Duration::from_secs(3)).await;
            tx.commit().await.expect("COMMIT");
        });
    });
    locked_rx.recv().expect("the lock is held");
    let (status, first) = post("order-42", &body);
    assert_eq!(status, 504, "{first}");
    assert_eq!(first["outcome"], "unknown", "{first}");
    holder.join().expect("the lock holder ends");
    // Once the lock is gone, the first statement commits.
    let mut run = None;
    wait_for("the retry answers the first run", || {
        let (status, again) = post("order-42", &body);
        if status == 200 {
            run = again["run_id"].as_u64();
            assert_eq!(again["existing"], true, "{again}");
        }
        status == 200
    });
    let run = RunId(run.expect("a run id"));
    let (status, other) = post(
        "order-42",
        &json!({"kind": "effect", "input": {"calls": 2}}),
    );
    assert_eq!(status, 422, "{other}");
    env.accepted.insert(run);
    env.effects.insert(run, 1);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(
        db.runs.len(),
        1,
        "one run for one key: {:?}",
        db.runs.keys()
    );
    assert_eq!(
        (db.runs[&run].status, db.runs[&run].attempts),
        (RunStatus::Succeeded, 1)
    );
    assert_eq!(db.effects[&format!("{run}/0")], 1, "executed once");
}

/// Two workers whose clocks differ by ten minutes, far more than the 2 s
/// lease. Worker 2, ahead, reclaims the entry of the run worker 1 is
/// running and reads a duplicate of it; its claims are refused, because
/// Postgres's clock judges the lease. One attempt, no takeover.
pub fn skewed_clock_takes_no_live_lease(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":5000}"#, 3);
    // One slot: worker 1 reads nothing more while it runs the job.
    let mut flags = NO_SWEEP.to_vec();
    flags.extend(["--in-flight-max", "1"]);
    let _w1 = env.worker(1, None, &flags);
    wait_for("worker 1 runs it", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    // Worker 2's clock runs ten minutes ahead, and its reclaimer takes
    // worker 1's entry however recently touched: only the claim's lease
    // check, by Postgres's clock, keeps the live attempt. A duplicate
    // publication reaches worker 2 as well.
    flags.extend([
        "--clock-offset-ms",
        "600000",
        "--reclaim-min-idle-ms",
        "0",
        "--reclaim-every-ms",
        "100",
    ]);
    let mut w2 = env.worker(2, None, &flags);
    let dispatch = env.db().runs[&run].dispatch.0.to_string();
    env.xadd(&[("run_id", &run.0.to_string()), ("dispatch", &dispatch)]);
    env.settle();
    assert!(
        w2.is_running(),
        "worker 2 runs with its clock ten minutes ahead"
    );
    let db = env.check(&[]);
    let r = &db.runs[&run];
    assert_eq!(
        (r.status, r.attempts),
        (RunStatus::Succeeded, 1),
        "no takeover"
    );
}

/// Two workers started as containers start them, each process id 1 in
/// its own PID namespace and without `--id`, get distinct consumer names
/// from the worker registry, and both take work.
pub fn contained_workers_get_unique_names(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let runs: Vec<RunId> = (0..8)
        .map(|_| env.submit("sleep", r#"{"ms":600}"#, 3))
        .collect();
    let _a = env.contained_worker(&["--in-flight-max", "2"]);
    let _b = env.contained_worker(&["--in-flight-max", "2"]);
    env.settle();
    let db = env.check(&[]);
    let names: BTreeSet<String> = runs
        .iter()
        .flat_map(|r| db.read_attempts(*r))
        .map(|(_, a)| a.worker)
        .collect();
    assert_eq!(names.len(), 2, "two workers, two consumer names: {names:?}");
    assert_eq!(db.workers.len(), 2, "{:?}", db.workers);
    assert!(
        db.workers.values().all(|(_, pid, _)| *pid == 1),
        "{:?}",
        db.workers
    );
}

/// A pending entry trimmed away is detected (XAUTOCLAIM's deleted IDs) and
/// its run recovered from Postgres, without the sweeper's help.
pub fn trimmed_pending_entry_is_recovered(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("noop", "{}", 3);
    let mut w1 = env.worker(1, Some("after_receive"), NO_SWEEP);
    w1.wait(Duration::from_secs(20));
    assert_eq!(env.pel_len(), 1);
    let mut c = env.redis.conn();
    let _: i64 = redis::cmd("XTRIM")
        .arg(env.jobs_key())
        .arg("MAXLEN")
        .arg(0)
        .query(&mut c)
        .expect("XTRIM");
    let _w2 = env.worker(2, None, NO_SWEEP);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    assert!(
        db.runs[&run].dispatch.0 >= 2,
        "recovered under a new dispatch"
    );
}

/// Redis restarts (kill -9, AOF replay) while runs are in flight.
pub fn redis_restart_with_aof(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    for _ in 0..6 {
        env.submit("sleep", r#"{"ms":800}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    let _w2 = env.worker(2, None, &[]);
    sleep_ms(500);
    env.redis.restart();
    env.settle();
    env.check(&[]);
}

/// Redis loses everything (stream and group): workers recreate the group and
/// the sweeper re-publishes from Postgres.
pub fn total_redis_data_loss(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    for _ in 0..4 {
        env.submit("sleep", r#"{"ms":1500}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    sleep_ms(700);
    env.redis.wipe();
    let after: Vec<RunId> = (0..3).map(|_| env.submit("noop", "{}", 5)).collect();
    env.settle();
    let db = env.check(&[]);
    // Runs published after the wipe are read from the recreated group
    // (created at 0, not `$`): delivered from their first dispatch, not
    // re-dispatched by the sweeper after its grace.
    for r in after {
        assert_eq!(
            (db.runs[&r].dispatch.0, db.runs[&r].attempts),
            (1, 1),
            "{r}"
        );
    }
}

/// Postgres restarts (immediate shutdown) while runs are in flight.
pub fn postgres_restart(mutant: Option<&str>) {
    let cluster = Cluster::start();
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), mutant);
    for _ in 0..6 {
        env.submit("sleep", r#"{"ms":700}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    sleep_ms(500);
    cluster.restart();
    env.settle();
    env.check(&[]);
    drop(env);
}

/// SIGTERM: the worker stops reading, finishes its in-flight job within the
/// grace period and exits 0.
pub fn sigterm_finishes_in_flight_jobs(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":1500}"#, 3);
    let mut w = env.worker(1, None, &[]);
    wait_for("the job runs", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    w.term();
    let status = w.wait(Duration::from_secs(20));
    assert!(status.success(), "exit 0; log:\n{}", w.log_text());
    assert_eq!(
        env.db().runs[&run].status,
        RunStatus::Succeeded,
        "finished in the grace period"
    );
    let later = env.submit("noop", "{}", 3);
    let _w2 = env.worker(2, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&later].status, RunStatus::Succeeded);
}

/// SIGTERM with a job longer than the grace period: exit 0, the entry stays
/// pending, another worker finishes the run.
pub fn sigterm_leaves_a_long_job_pending(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":4000}"#, 3);
    let mut w = env.worker(1, None, &["--shutdown-grace-ms", "300"]);
    wait_for("the job runs", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    w.term();
    assert!(w.wait(Duration::from_secs(20)).success());
    assert_eq!(env.pel_len(), 1);
    let _w2 = env.worker(2, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
}

/// Malformed entries and entries naming unknown runs are quarantined with a
/// reason, acknowledged, and block nothing.
pub fn malformed_stream_entries_are_quarantined(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let bad = vec![
        env.xadd(&[("garbage", "1")]),
        env.xadd(&[("run_id", "not-a-number"), ("dispatch", "1")]),
        env.xadd(&[("run_id", "5")]),
        env.xadd(&[("run_id", "999999"), ("dispatch", "1")]),
        env.xadd(&[("run_id", "1"), ("dispatch", "1"), ("extra", "x")]),
    ];
    let good = env.submit("noop", "{}", 3);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&bad);
    assert_eq!(db.runs[&good].status, RunStatus::Succeeded);
}

/// A cancel that lands before any delivery: the run never starts, and a
/// later delivery of its entry does not revive it.
pub fn cancelled_before_delivery_never_runs(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("noop", "{}", 3);
    env.cli_ok(&["cancel", &run.0.to_string()]);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Cancelled);
    assert_eq!(db.runs[&run].attempts, 0, "never started");
}

/// A cancel that lands while the job runs: the job stops at its next
/// heartbeat and the run stays cancelled.
pub fn cancel_stops_a_running_job(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let run = env.submit("sleep", r#"{"ms":5000}"#, 3);
    let _w = env.worker(1, None, &[]);
    wait_for("the job runs", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    env.cli_ok(&["cancel", &run.0.to_string()]);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Cancelled);
    assert_eq!(db.runs[&run].attempts, 1);
}

/// Runs whose publication was lost (the API stored them, then the XADD
/// failed) are published by the outbox and run. Four workers' outboxes race
/// for them: each run is published once. A run cancelled before it was
/// published, and a run claimed before its publication was marked, leave
/// the outbox's index (`published_at IS NULL`).
pub fn unpublished_run_is_published_by_the_outbox(mutant: Option<&str>) {
    const RUNS: u64 = 200;
    let mut env = Env::mutated(mutant);
    let io = env.io(3);
    let (runs, cancelled) = crate::rt().block_on(async move {
        let mut runs = Vec::new();
        for _ in 0..=RUNS {
            let run = match io.db.execute(&DbOp::NextRunId).await {
                Ok(DbReply::NewRun(r)) => r,
                other => panic!("next run id: {other:?}"),
            };
            let insert = DbOp::InsertRun {
                run,
                kind: "noop".into(),
                input: "{}".into(),
                attempts_max: 3,
                budget_ms: 0,
                trace: String::new(),
                delay_ms: 0,
                at_ms: 0,
            };
            assert!(matches!(io.db.execute(&insert).await, Ok(DbReply::Rows(1))));
            runs.push(run);
        }
        let cancelled = runs.pop().expect("one more");
        let cancel = DbOp::Cancel { run: cancelled };
        assert!(matches!(io.db.execute(&cancel).await, Ok(DbReply::Rows(1))));
        (runs, cancelled)
    });
    env.accepted.extend(runs.iter().copied());
    env.accepted.insert(cancelled);
    let _w: Vec<_> = (1..=4)
        .map(|w| env.worker(w, None, &["--maintenance-every-ms", "20"]))
        .collect();
    env.settle();
    let db = env.check(&[]);
    for r in &runs {
        assert_eq!(db.runs[r].status, RunStatus::Succeeded);
    }
    let mut c = env.redis.conn();
    let published: u64 = redis::cmd("XLEN")
        .arg(env.jobs_key())
        .query(&mut c)
        .expect("XLEN");
    assert_eq!(published, RUNS, "each run published once");
    let waiting: Vec<_> = db
        .runs
        .values()
        .filter(|r| r.published_at.is_none())
        .map(|r| (r.run_id, r.status))
        .collect();
    assert!(waiting.is_empty(), "in the outbox's index: {waiting:?}");
}

/// Retention deletes finished runs with their attempts, dead letters and
/// keys, and never a live run published as long ago; an entry of a deleted
/// run delivered later is acknowledged as stale, and one naming a run never
/// made is quarantined.
pub fn retention_deletes_finished_runs(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let done = env.submit("noop", "{}", 3);
    // Dies on its only attempt: a dead letter to delete too.
    let dead = env.submit("fail", r#"{"class":"retryable","times":9}"#, 1);
    // Still running while the other two are deleted.
    let long = env.submit("sleep", r#"{"ms":2500}"#, 1);
    let flags = [
        "--keep-finished-ms",
        "1",
        "--sweep-grace-ms",
        "400",
        "--maintenance-every-ms",
        "50",
    ];
    let _w = env.worker(1, None, &flags);
    wait_for("retention deletes the finished runs", || {
        let db = env.db();
        !db.runs.contains_key(&done) && !db.runs.contains_key(&dead)
    });
    let db = env.db();
    match db.runs.get(&long) {
        Some(row) => assert!(!row.status.is_terminal(), "{row:?}"),
        None => panic!("retention deleted {long}, a live run"),
    }
    wait_for("retention deletes every run once finished", || {
        let db = env.db();
        db.runs.is_empty() && db.attempts.is_empty() && db.dead_letters.is_empty()
    });
    // Deleted: nothing left to check them against.
    env.accepted.clear();
    let dispatch = "1";
    let late = env.xadd(&[("run_id", &done.0.to_string()), ("dispatch", dispatch)]);
    let unknown = env.xadd(&[("run_id", "999999"), ("dispatch", dispatch)]);
    env.settle();
    let quarantined = env.quarantined();
    assert!(quarantined.contains(&unknown), "{quarantined:?}");
    assert!(
        !quarantined.contains(&late),
        "acked as stale: {quarantined:?}"
    );
    env.check(&[unknown]);
}

/// A database an earlier release migrated (schema version 1 only), holding a
/// run it never published and one it finished, is brought to the current
/// schema by `pelican migrate`: the hot-path indexes replace the old ones,
/// the attempts' foreign key is gone, the old run is published and runs to
/// its end, and the finished one reads as it did, its success recorded on
/// its attempt and its log its `queued` event alone (it had no events).
pub fn migrate_upgrades_a_version_1_database(mutant: Option<&str>) {
    let db = Database::create();
    let url = db.url().to_owned();
    // Far above what the run id sequence hands out to this test.
    let run = RunId(1_000);
    let finished = RunId(1_001);
    let pg = crate::rt()
        .block_on(pelican_real::live::pg::PgDb::connect(
            &url,
            1,
            Duration::from_secs(10),
        ))
        .expect("Postgres answers");
    crate::rt().block_on(async {
        pelican_real::live::pg::migrator()
            .run_to(1, pg.pool())
            .await
            .expect("schema version 1 applies");
        // As that release inserted it: today's statement names columns
        // later migrations add.
        let insert = format!(
            "INSERT INTO runs (run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max) \
             VALUES ({}, 'noop', '{{}}', 'queued', 1, 0, 0, 3)",
            run.0
        );
        let inserted = pelican_real::live::pg::raw_execute(&pg, &insert).await;
        assert!(matches!(inserted, Ok(1)), "{inserted:?}");
        let finished = format!(
            "INSERT INTO runs (run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max, result, entry_id) \
             VALUES ({0}, 'noop', '{{}}', 'succeeded', 1, 1, 1, 3, 'null', '1-0'); \
             INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch, outcome) \
             VALUES ({0}, 1, 1, 'old-worker', '1-0', 1, 'succeeded')",
            finished.0
        );
        let inserted = pelican_real::live::pg::raw_execute(&pg, &finished).await;
        assert!(inserted.is_ok(), "{inserted:?}");
    });
    // `Env` runs `pelican migrate`: the upgrade under test.
    let mut env = Env::with_database(url, Some(db), mutant);
    let schema = crate::rt().block_on(async {
        sqlx::query_as::<_, (String,)>(
            "SELECT indexname::text FROM pg_indexes WHERE tablename = 'runs' \
             UNION ALL SELECT conname::text FROM pg_constraint \
              WHERE conrelid IN ('attempts'::regclass, 'dead_letters'::regclass) AND contype = 'f' \
             UNION ALL SELECT c.relname || ':' || array_to_string(c.reloptions, ',') \
               FROM pg_class c WHERE c.relname IN ('runs', 'attempts')",
        )
        .fetch_all(pg.pool())
        .await
        .expect("the catalog answers")
        .into_iter()
        .map(|(name,)| name)
        .collect::<BTreeSet<_>>()
    });
    assert_eq!(
        schema.iter().map(String::as_str).collect::<Vec<_>>(),
        [
            "attempts:fillfactor=50",
            "runs:fillfactor=50",
            "runs_entry_live",
            "runs_finished",
            "runs_live",
            "runs_pkey",
            "runs_retry_order",
            "runs_sweep",
            "runs_unpublished",
        ],
        "the upgraded schema: indexes of runs, no foreign keys on attempts or dead letters, fill factors"
    );
    env.accepted.extend([run, finished]);
    let _w = env.worker(1, None, &[]);
    env.settle();
    let mut db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    // Postgres reads both runs' attempts and events as the model does from
    // the same rows (the audit above read them through the model).
    crate::rt().block_on(async {
        for r in [run, finished] {
            for op in [
                DbOp::ReadAttempts { run: r },
                DbOp::ReadEvents {
                    run: r,
                    after: 0,
                    limit: 100,
                    bytes_max: u64::MAX,
                },
            ] {
                let got = pg.execute(&op).await.expect("Postgres answers");
                assert_eq!(got, db.execute(&op), "{op:?}");
            }
        }
    });
    let log = db.read_events(finished, 0, 100);
    assert_eq!(
        log.len(),
        1,
        "a run finished before events has its queued event alone: {log:?}"
    );
    let attempts = db.read_attempts(finished);
    assert_eq!(
        attempts[0].1.outcome,
        Some(pelican_model::status::AttemptOutcome::Succeeded),
        "{attempts:?}"
    );
}

/// Bad API requests get clear 4xx answers with a JSON body, and change nothing.
pub fn bad_api_requests_get_clear_errors(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("sekret");
    let agent = agent();
    let post = |path: &str, token: Option<&str>, body: &str| {
        let mut req = agent
            .post(format!("{base}{path}"))
            .header("Content-Type", "application/json");
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.send(body).expect("the API answers");
        let status = resp.status().as_u16();
        let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        (status, body)
    };
    let ok = Some("sekret");
    let cases: Vec<(&str, Option<&str>, String, u16)> = vec![
        ("/runs", None, r#"{"kind":"noop"}"#.into(), 401),
        ("/runs", Some("wrong"), r#"{"kind":"noop"}"#.into(), 401),
        ("/runs", ok, "{not json".into(), 400),
        ("/runs", ok, r#"{"kind":"noop","input":"#.into(), 400),
        ("/runs", ok, r#"{"input":{}}"#.into(), 422),
        ("/runs", ok, r#"{"kind":"noop","surprise":1}"#.into(), 422),
        ("/runs", ok, r#"{"kind":"Bad Kind!"}"#.into(), 400),
        ("/runs", ok, r#"{"kind":""}"#.into(), 400),
        (
            "/runs",
            ok,
            format!(r#"{{"kind":"noop","input":"{}"}}"#, "x".repeat(10_000)),
            413,
        ),
        ("/runs/abc/cancel", ok, String::new(), 400),
        ("/runs/424242/cancel", ok, String::new(), 404),
        ("/nowhere", ok, String::new(), 404),
    ];
    for (path, token, body, want) in &cases {
        let (status, json) = post(path, *token, body);
        assert_eq!(status, *want, "POST {path} {body:.60}: {json}");
        assert!(
            json["error"].is_string(),
            "POST {path}: a JSON error body, got {json}"
        );
    }
    // A body far over the limit (and over the sockets' buffers, so the
    // client is still sending when the API has decided) is read to its end
    // and refused: the 413 reaches the client every time, on a connection
    // that stays open, and the next request on it is answered.
    let huge = format!(r#"{{"kind":"noop","input":"{}"}}"#, "x".repeat(1 << 20));
    for _ in 0..10 {
        let mut resp = agent
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer sekret")
            .header("Content-Type", "application/json")
            .send(&huge)
            .expect("the API answers a body over the limit");
        assert_eq!(resp.status().as_u16(), 413);
        assert_eq!(
            resp.headers().get("connection"),
            None,
            "a refused body was read whole: its connection stays open"
        );
        let json: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        assert!(json["error"].is_string(), "{json}");
        let (status, _) = post("/runs/424242/cancel", ok, "");
        assert_eq!(status, 404, "the next request on the connection");
    }
    let get = |path: &str, token: Option<&str>| {
        let mut req = agent.get(format!("{base}{path}"));
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call().expect("the API answers");
        let status = resp.status().as_u16();
        let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        (status, body)
    };
    for (path, want) in [("/runs/abc", 400), ("/runs/424242", 404)] {
        let (status, json) = get(path, ok);
        assert_eq!(status, want, "GET {path}");
        assert!(json["error"].is_string());
    }
    for key in ["", "has space", &"k".repeat(256)] {
        let mut resp = agent
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer sekret")
            .header("Idempotency-Key", key)
            .send_json(json!({"kind": "noop"}))
            .expect("the API answers");
        let json: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(resp.status().as_u16(), 400, "key {key:.20?}: {json}");
        assert!(json["error"].is_string());
    }
    assert!(env.db().runs.is_empty(), "no bad request stored a run");
    let run = env.submit("noop", "{}", 3);
    let events = format!("/runs/{}/events", run.0);
    let past = format!("{events}?after=99");
    let unknown_param = format!("{events}?from=1");
    for (path, token, want) in [
        ("/runs/abc/events", ok, 400),
        ("/runs/424242/events", ok, 404),
        (events.as_str(), None, 401),
        (past.as_str(), ok, 400),
        (unknown_param.as_str(), ok, 400),
    ] {
        let (status, json) = get(path, token);
        assert_eq!(status, want, "GET {path}");
        assert!(json["error"].is_string(), "GET {path}: {json}");
    }
    let mut resp = agent
        .get(format!("{base}{events}"))
        .header("Authorization", "Bearer sekret")
        .header("Last-Event-ID", "first")
        .call()
        .expect("the API answers");
    assert_eq!(
        resp.status().as_u16(),
        400,
        "a Last-Event-ID that is not a number"
    );
    let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
    assert!(body["error"].is_string(), "{body}");
    // Every route but /healthz refuses a missing or wrong token; the
    // read-only token reads and changes nothing.
    let (_reader_api, reader_base) =
        env.api_with_flags("sekret", 3, &["--api-read-token", "reader"]);
    let cancel = format!("/runs/{}/cancel", run.0);
    let read = format!("/runs/{}", run.0);
    for token in [None, Some("wrong")] {
        for path in ["/runs", cancel.as_str()] {
            let (status, json) = post(path, token, r#"{"kind":"noop"}"#);
            assert_eq!(status, 401, "POST {path} with {token:?}: {json}");
        }
        for path in [read.as_str(), "/metrics"] {
            let (status, _) = get(path, token);
            assert_eq!(status, 401, "GET {path} with {token:?}");
        }
    }
    let reader = |path: &str, post_it: bool| {
        let url = format!("{reader_base}{path}");
        let bearer = "Bearer reader";
        let resp = if post_it {
            agent
                .post(&url)
                .header("Authorization", bearer)
                .header("Content-Type", "application/json")
                .send(r#"{"kind":"noop"}"#)
        } else {
            agent.get(&url).header("Authorization", bearer).call()
        };
        resp.expect("the API answers").status().as_u16()
    };
    assert_eq!(reader(&read, false), 200, "the read-only token reads a run");
    assert_eq!(reader("/metrics", false), 200, "and the metrics");
    assert_eq!(reader("/runs", true), 403, "but submits nothing");
    assert_eq!(reader(&cancel, true), 403, "and cancels nothing");
    let health = agent
        .get(format!("{base}/healthz"))
        .call()
        .expect("answers");
    assert_eq!(health.status().as_u16(), 200, "/healthz needs no token");
    assert_eq!(env.db().runs.len(), 1, "no refused request stored a run");
    let _w = env.worker(1, None, &[]);
    env.settle();
    let (status, json) = post(&format!("/runs/{}/cancel", run.0), ok, "");
    assert_eq!(status, 409, "{json}");
    env.check(&[]);
}

/// The binary's own errors are clear: bad flags, unreachable servers, bad
/// input.
pub fn bad_flags_and_unreachable_servers_fail_clearly(mutant: Option<&str>) {
    let env = Env::mutated(mutant);
    let err = |args: &[&str]| {
        let out = env.cli(args);
        assert!(!out.status.success(), "pelican {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["worker", "--lease-ms", "soon"]).contains("invalid value"));
    for (limit, says) in [
        ("p:concurrent=0", "concurrent must be at least 1"),
        ("p:per_second=5000", "per_second must be at most 1000"),
        ("p:burst=x", "is not a number"),
        ("p:speed=3", "unknown field \"speed\""),
        (":concurrent=1", "names no provider"),
    ] {
        let e = err(&["worker", "--provider-limit", limit]);
        assert!(e.contains(says), "--provider-limit {limit}: {e}");
    }
    assert!(
        err(&[
            "worker",
            "--heartbeat-ms",
            "5000",
            "--lease-ms",
            "3000",
            "--read-block-ms",
            "100"
        ])
        .contains("heartbeat_ms")
    );
    assert!(err(&["status", "424242"]).contains("no run"));
    assert!(
        err(&[
            "--database-url",
            "postgres://postgres@127.0.0.1:1/x",
            "status"
        ])
        .contains("connecting to Postgres")
    );
    assert!(err(&["--redis-url", "redis://127.0.0.1:1", "cancel", "1"]).contains("Redis"));
    assert!(err(&["submit", "noop", "{not json"]).contains("not JSON"));
    assert!(err(&["submit", "Bad Kind", "{}"]).contains("kind"));
    assert!(err(&["cancel", "run-x"]).contains("not a run id"));
    // An API without a token is refused, unless asked for explicitly.
    assert!(err(&["api", "--listen", "127.0.0.1:1"]).contains("--insecure-no-auth"));
    assert!(
        err(&["api", "--insecure-no-auth", "--api-token", "t"]).contains("cannot be used with")
    );
}

/// Retention: once runs are done, their acknowledged entries are trimmed
/// from the stream; the runs are untouched.
pub fn retention_trims_acknowledged_entries(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let runs: Vec<_> = (0..5).map(|_| env.submit("noop", "{}", 3)).collect();
    let _w = env.worker(1, None, &["--retention-ms", "1"]);
    env.settle();
    let key = env.jobs_key();
    wait_for("the stream is trimmed", || {
        let mut c = env.redis.conn();
        redis::cmd("XLEN")
            .arg(&key)
            .query::<u64>(&mut c)
            .unwrap_or(1)
            == 0
    });
    let db = env.check(&[]);
    for r in runs {
        assert_eq!(db.runs[&r].status, RunStatus::Succeeded);
    }
}

/// The worker pipelines its acknowledgements (`Batching::stream`): one round
/// trip, each `XACK` its own command with its own answer. Acks of pending,
/// already acknowledged and unknown IDs each answer as a lone `XACK` would,
/// in order; with the stream gone, each answers 0 on its own.
pub fn pipelined_acks_answer_each_xack(mutant: Option<&str>) {
    use pelican_model::ids::{Dispatch, WorkerId};
    use pelican_model::protocol::{JobEntry, StreamOp, StreamReply};
    use pelican_real::StreamClient;

    let env = Env::mutated(mutant);
    let io = env.io(3);
    let acks = |ids: &[EntryId]| -> Vec<StreamOp> {
        ids.iter()
            .map(|id| StreamOp::Ack { ids: vec![*id] })
            .collect()
    };
    crate::rt().block_on(async {
        let call = |op| io.stream.call(op);
        call(StreamOp::EnsureGroup { partition: 0 })
            .await
            .expect("Redis answers")
            .expect("group");
        for run in 1..=3 {
            let entry = JobEntry::Job {
                run: RunId(run),
                dispatch: Dispatch(1),
            };
            let now = pelican_real::now();
            call(StreamOp::Publish {
                partition: 0,
                entry,
                now,
            })
            .await
            .expect("Redis answers")
            .expect("published");
        }
        let read = StreamOp::Read {
            partition: 0,
            consumer: WorkerId(1).consumer(),
            count: 3,
            now: pelican_real::now(),
        };
        let Ok(Ok(StreamReply::Entries(got))) = call(read).await else {
            panic!("the three entries are read");
        };
        let [a, b, c] = [got[0].0, got[1].0, got[2].0];
        let unknown = EntryId::new(1, 0);
        let replies = io
            .stream
            .call_batch(acks(&[a, b, a, unknown, c]))
            .await
            .expect("Redis answers the pipeline");
        let counts: Vec<_> = replies
            .into_iter()
            .map(|r| match r {
                Ok(StreamReply::Acked(n)) => n,
                other => panic!("an XACK answered {other:?}"),
            })
            .collect();
        assert_eq!(
            counts,
            [1, 1, 0, 0, 1],
            "each XACK answers for itself, in order"
        );

        // Without the stream, each XACK of the pipeline answers 0 on its own
        // (as the model's Ack does).
        let mut conn = env.redis.conn();
        let _: () = redis::cmd("DEL")
            .arg(env.jobs_key())
            .query(&mut conn)
            .expect("DEL");
        let replies = io
            .stream
            .call_batch(acks(&[a, b]))
            .await
            .expect("Redis answers the pipeline");
        assert_eq!(
            replies,
            [Ok(StreamReply::Acked(0)), Ok(StreamReply::Acked(0))]
        );
    });
}

/// Redis Cluster: three masters with a replica each, a partition on each.
/// Workers and submissions run through redis-rs' cluster client. Mid-drain
/// the workers are stopped (so no reader takes the next entries from the
/// master) and the replica of partition 0's master is held back; runs are
/// submitted (the entries of partition 0's reach the master alone), the
/// master is killed and the replica takes over: those entries are lost, with whatever deliveries
/// and acknowledgements the master had not replicated (replication is
/// asynchronous). Postgres holds every run, so the sweeper publishes what
/// was lost (NoSweep leaves those runs queued) and the reclaimer takes
/// back what is delivered again: every run ends once, and nothing is left
/// pending.
pub fn redis_cluster_master_failover(mutant: Option<&str>) {
    let mut env = Env::on_cluster(mutant);
    let fast_sweep = ["--sweep-grace-ms", "3000", "--maintenance-every-ms", "500"];
    let before: Vec<RunId> = (0..40)
        .map(|i| match i % 2 {
            0 => env.submit("sleep", r#"{"ms":300}"#, 5),
            _ => env.submit("effect", r#"{"calls":1}"#, 5),
        })
        .collect();
    let w1 = env.worker(1, None, &fast_sweep);
    let w2 = env.worker(2, None, &fast_sweep);
    wait_for("a first run finishes on the cluster", || {
        let db = env.db();
        before
            .iter()
            .any(|r| db.runs.get(r).is_some_and(|row| row.status.is_terminal()))
    });
    let key = env.jobs_key();
    w1.stop();
    w2.stop();
    env.redis.hold_replica(&key);
    let submitted: Vec<RunId> = (0..15).map(|_| env.submit("noop", "{}", 5)).collect();
    let outage = env.redis.fail_over(&key);
    w1.cont();
    w2.cont();
    eprintln!("partition 0's slot had no master for {outage:?}");
    // The new master never had partition 0's entries.
    let db = env.db();
    let published: Vec<(RunId, EntryId)> = submitted
        .iter()
        .filter_map(|r| Some((*r, db.runs[r].entry_id?)))
        .collect();
    assert_eq!(published.len(), submitted.len(), "each run was published");
    let (unreplicated, entries): (Vec<RunId>, Vec<EntryId>) = published
        .into_iter()
        .filter(|(_, id)| id.partition == 0)
        .unzip();
    assert_eq!(entries.len(), 5, "a third of the runs went to partition 0");
    assert_eq!(
        env.present(&entries),
        [],
        "the failover lost the unreplicated entries"
    );
    let after: Vec<RunId> = (0..10).map(|_| env.submit("noop", "{}", 5)).collect();
    env.settle();
    let db = env.check(&[]);
    for r in before.iter().chain(&submitted).chain(&after) {
        assert_eq!(db.runs[r].status, RunStatus::Succeeded, "{r}");
    }
    for r in &unreplicated {
        assert!(db.runs[r].dispatch.0 >= 2, "{r} was published again");
    }
    let again: Vec<String> = before
        .iter()
        .filter(|r| db.runs[*r].dispatch.0 >= 2 || db.runs[*r].attempts >= 2)
        .map(|r| {
            format!(
                "{r}: dispatch {}, {} attempts",
                db.runs[r].dispatch.0, db.runs[r].attempts
            )
        })
        .collect();
    eprintln!("runs in flight at the failover that were recovered: {again:?}");
}

/// Partitions on a Redis Cluster: three partitions, whose keys three
/// different masters serve. A worker takes a long job from every
/// partition and is killed (kill -9) while they run; another worker's
/// reclaimer must take over the deliveries of every partition (with
/// ReclaimOnePartition, those past partition 0 stay pending and their runs
/// running: the sweeper leaves a pending entry to the reclaimer).
pub fn partitions_spread_over_cluster_masters(mutant: Option<&str>) {
    let mut env = Env::on_cluster(mutant);
    let names = env.names();
    let masters: BTreeSet<u16> = names
        .partitions
        .iter()
        .map(|key| env.redis.master_of(key).expect("a master serves each key"))
        .collect();
    assert_eq!(
        masters.len(),
        names.partitions.len(),
        "each partition on a master of its own: {:?}",
        names.partitions
    );
    let runs: Vec<RunId> = (0..9)
        .map(|_| env.submit("sleep", r#"{"ms":3000}"#, 5))
        .collect();
    let db = env.db();
    let spread: BTreeSet<u16> = runs
        .iter()
        .filter_map(|r| db.runs[r].entry_id)
        .map(|id| id.partition)
        .collect();
    assert_eq!(
        spread.len(),
        names.partitions.len(),
        "runs in every partition"
    );
    let mut w1 = env.worker(1, None, &["--in-flight-max", "9"]);
    wait_for("the first worker runs every job", || {
        let db = env.db();
        runs.iter().all(|r| db.runs[r].status == RunStatus::Running)
    });
    w1.kill9();
    let _w2 = env.worker(2, None, &["--in-flight-max", "9"]);
    env.settle();
    let db = env.check(&[]);
    let mut taken_over = BTreeSet::new();
    for r in &runs {
        let row = &db.runs[r];
        assert_eq!(row.status, RunStatus::Succeeded, "{r}");
        assert_eq!(row.dispatch.0, 1, "{r} was reclaimed, not published again");
        assert!(row.attempts >= 2, "{r} ran again after the kill");
        taken_over.extend(row.entry_id.map(|id| id.partition));
    }
    assert_eq!(
        taken_over, spread,
        "deliveries taken over in every partition"
    );
}
