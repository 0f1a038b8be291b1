//! End-to-end tests against live Redis and Postgres, with real `pelican`
//! processes killed at named crash points (the seed article's test table),
//! Redis restarts and wipes, a Postgres restart, graceful shutdown, and bad
//! input. Every test ends by checking the guarantees on the live state
//! (`Env::check`).

use pelican_model::status::RunStatus;
use pelican_tests::{Cluster, Database, Env};
use serde_json::{Value, json};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(60);

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The happy path through the API: submit, two workers, every outcome right.
#[test]
fn runs_submitted_through_the_api_reach_their_outcomes() {
    let mut env = Env::new();
    let (_api, base) = env.api("sekret");
    let _w1 = env.worker(1, None, &[]);
    let _w2 = env.worker(2, None, &[]);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let jobs = [
        ("noop", json!({}), "succeeded"),
        ("sleep", json!({"ms": 300}), "succeeded"),
        ("effect", json!({"calls": 3}), "succeeded"),
        ("fail", json!({"class": "retryable", "times": 1}), "succeeded"),
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
        let id = body["run_id"].as_u64().expect("a run id");
        env.accepted.insert(pelican_model::ids::RunId(id));
        env.effects.insert(
            pelican_model::ids::RunId(id),
            pelican_real::jobs::effects_of(kind, &input.to_string()),
        );
        ids.push(id);
    }
    env.settle(SETTLE);
    env.check(&[]);
    for (id, (kind, _, want)) in ids.iter().zip(&jobs) {
        let mut resp = agent
            .get(format!("{base}/runs/{id}"))
            .call()
            .expect("the API answers");
        assert_eq!(resp.status().as_u16(), 200);
        let body: Value = resp.body_mut().read_json().expect("JSON");
        assert_eq!(body["status"], *want, "{kind}: {body}");
        assert!(body["attempts"].as_array().is_some_and(|a| !a.is_empty()));
    }
    let dead = env.db().runs.values().filter(|r| r.status == RunStatus::Dead).count();
    assert_eq!(dead, 1);
    let mut metrics = agent.get(format!("{base}/metrics")).call().expect("metrics");
    let text = metrics.body_mut().read_to_string().expect("text");
    assert!(text.contains("pelican_runs{status=\"succeeded\"} 5"), "{text}");
    assert!(text.contains("pelican_pel_count 0"), "{text}");
}

/// Kill right after XREADGROUP: the entries stay pending and another worker
/// reclaims and runs them.
#[test]
fn kill_right_after_receive() {
    let mut env = Env::new();
    let runs: Vec<_> = (0..3).map(|_| env.submit("noop", "{}", 3)).collect();
    let mut w1 = env.worker(1, Some("after_receive"), &[]);
    let status = w1.wait(Duration::from_secs(20));
    assert!(!status.success(), "the crash point killed it");
    assert!(env.pel_len() > 0, "its deliveries are pending");
    let _w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    for r in runs {
        assert_eq!(db.runs[&r].status, RunStatus::Succeeded);
    }
}

/// Kill after the outcome is committed, before XACK: the run is not run
/// again; the redelivered entry is acknowledged as already terminal.
#[test]
fn kill_after_commit_before_ack() {
    let mut env = Env::new();
    let run = env.submit("effect", r#"{"calls":1}"#, 3);
    let mut w1 = env.worker(1, Some("before_ack"), &[]);
    w1.wait(Duration::from_secs(20));
    assert_eq!(env.db().runs[&run].status, RunStatus::Succeeded);
    assert_eq!(env.pel_len(), 1, "committed but not acknowledged");
    let _w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].attempts, 1, "never executed again");
}

/// Kill right after a side effect: the retry sends the same idempotency key
/// and the tool service does not apply it twice.
#[test]
fn kill_right_after_the_side_effect() {
    let mut env = Env::new();
    let run = env.submit("effect", r#"{"calls":2}"#, 3);
    let mut w1 = env.worker(1, Some("after_effect"), &[]);
    w1.wait(Duration::from_secs(20));
    let _w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    assert_eq!(db.runs[&run].attempts, 2);
    assert_eq!(db.effects[&format!("{run}/0")], 2, "requested twice, applied once");
    assert_eq!(db.effects[&format!("{run}/1")], 1);
}

/// A live long job is reclaimed prematurely (its worker paused past the
/// lease): the late worker's write is rejected and overwrites nothing.
#[test]
fn premature_reclaim_of_a_live_long_job() {
    let mut env = Env::new();
    let run = env.submit("sleep", r#"{"ms":3000}"#, 3);
    let w1 = env.worker(1, None, &[]);
    sleep_ms(1_000);
    assert_eq!(env.db().runs[&run].status, RunStatus::Running);
    w1.stop();
    let _w2 = env.worker(2, None, &[]);
    // w2 reclaims after the lease (2 s) and min-idle (2.5 s) and claims a
    // second attempt while w1 sleeps on.
    let start = std::time::Instant::now();
    while env.db().runs[&run].attempts < 2 {
        assert!(start.elapsed() < Duration::from_secs(30), "w2 never reclaimed the run");
        sleep_ms(100);
    }
    w1.cont();
    env.settle(SETTLE);
    let db = env.check(&[]);
    let r = &db.runs[&run];
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.attempts, 2);
    let attempts = db.read_attempts(run);
    assert_eq!(attempts[0].1.worker, "w1");
    assert_eq!(attempts[0].1.outcome, None, "the late write was rejected");
    assert_eq!(attempts[1].1.worker, "w2");
    assert_eq!(r.active_fence, attempts[1].1.fence);
}

/// Retryable errors back off through retry_at and end in the dead letters.
#[test]
fn retryable_errors_back_off_then_dead_letter() {
    let mut env = Env::new();
    let run = env.submit("fail", r#"{"class":"retryable","times":99}"#, 3);
    let _w = env.worker(1, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Dead);
    assert_eq!(db.runs[&run].attempts, 3);
    let d = &db.dead_letters[&run];
    assert_eq!(d.attempts.len(), 3);
    assert_eq!(d.class, pelican_model::status::ErrorClass::Retryable);
    let out = env.cli(&["dlq", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("\"run_id\": {}", run.0)));
    // An operator's requeue runs it once more (and it dies again).
    let out = env.cli(&["dlq", "requeue", &run.0.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].attempts, 4);
    assert_eq!(db.runs[&run].status, RunStatus::Dead);
}

/// A terminal error is not retried.
#[test]
fn terminal_error_is_not_retried() {
    let mut env = Env::new();
    let run = env.submit("fail", r#"{"class":"terminal","times":1}"#, 5);
    let _w = env.worker(1, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Failed);
    assert_eq!(db.runs[&run].attempts, 1);
}

/// A pending entry trimmed away is detected (XAUTOCLAIM's deleted IDs) and
/// its run recovered from Postgres.
#[test]
fn trimmed_pending_entry_is_recovered() {
    let mut env = Env::new();
    let run = env.submit("noop", "{}", 3);
    let mut w1 = env.worker(1, Some("after_receive"), &[]);
    w1.wait(Duration::from_secs(20));
    assert_eq!(env.pel_len(), 1);
    let mut c = env.redis.conn();
    let _: i64 = redis::cmd("XTRIM")
        .arg(env.jobs_key())
        .arg("MAXLEN")
        .arg(0)
        .query(&mut c)
        .expect("XTRIM");
    let w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    assert!(db.runs[&run].dispatch.0 >= 2, "recovered under a new dispatch");
    drop(w2);
}

/// Redis restarts (kill -9, AOF replay) while runs are in flight.
#[test]
fn redis_restart_with_aof() {
    let mut env = Env::new();
    for _ in 0..6 {
        env.submit("sleep", r#"{"ms":800}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    let _w2 = env.worker(2, None, &[]);
    sleep_ms(500);
    env.redis.restart();
    env.settle(SETTLE);
    env.check(&[]);
}

/// Redis loses everything (stream and group): workers recreate the group and
/// the sweeper re-publishes from Postgres.
#[test]
fn total_redis_data_loss() {
    let mut env = Env::new();
    for _ in 0..4 {
        env.submit("sleep", r#"{"ms":1500}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    sleep_ms(700);
    env.redis.wipe();
    for _ in 0..3 {
        env.submit("noop", "{}", 5);
    }
    env.settle(SETTLE);
    env.check(&[]);
}

/// Postgres restarts (immediate shutdown) while runs are in flight.
#[test]
fn postgres_restart() {
    let cluster = Cluster::start();
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db));
    for _ in 0..6 {
        env.submit("sleep", r#"{"ms":700}"#, 5);
    }
    let _w1 = env.worker(1, None, &[]);
    sleep_ms(500);
    cluster.restart();
    env.settle(SETTLE);
    env.check(&[]);
    drop(env);
}

/// SIGTERM: the worker stops reading, finishes its in-flight job within the
/// grace period and exits 0.
#[test]
fn sigterm_finishes_in_flight_jobs_and_exits_zero() {
    let mut env = Env::new();
    let run = env.submit("sleep", r#"{"ms":1500}"#, 3);
    let mut w = env.worker(1, None, &[]);
    sleep_ms(700);
    assert_eq!(env.db().runs[&run].status, RunStatus::Running);
    let later = env.submit("noop", "{}", 3);
    w.term();
    let status = w.wait(Duration::from_secs(20));
    assert!(status.success(), "exit 0; log:\n{}", w.log_text());
    let db = env.db();
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded, "finished in the grace period");
    let _w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&later].status, RunStatus::Succeeded);
}

/// SIGTERM with a job longer than the grace period: exit 0, the entry stays
/// pending, another worker finishes the run.
#[test]
fn sigterm_leaves_a_long_job_pending() {
    let mut env = Env::new();
    let run = env.submit("sleep", r#"{"ms":4000}"#, 3);
    let mut w = env.worker(1, None, &["--shutdown-grace-ms", "300"]);
    sleep_ms(700);
    w.term();
    assert!(w.wait(Duration::from_secs(20)).success());
    assert_eq!(env.pel_len(), 1);
    let _w2 = env.worker(2, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
}

/// Malformed entries and entries naming unknown runs are quarantined with a
/// reason, acknowledged, and block nothing.
#[test]
fn malformed_stream_entries_are_quarantined() {
    let mut env = Env::new();
    let bad = vec![
        env.xadd(&[("garbage", "1")]),
        env.xadd(&[("run_id", "not-a-number"), ("dispatch", "1")]),
        env.xadd(&[("run_id", "5")]),
        env.xadd(&[("run_id", "999999"), ("dispatch", "1")]),
        env.xadd(&[("run_id", "1"), ("dispatch", "1"), ("extra", "x")]),
    ];
    let good = env.submit("noop", "{}", 3);
    let _w = env.worker(1, None, &[]);
    env.settle(SETTLE);
    let db = env.check(&bad);
    assert_eq!(db.runs[&good].status, RunStatus::Succeeded);
}

/// Bad API requests get clear 4xx answers with a JSON body, and change nothing.
#[test]
fn bad_api_requests_get_clear_errors() {
    let mut env = Env::new();
    let (_api, base) = env.api("sekret");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
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
        ("/runs", ok, r#"{"input":{}}"#.into(), 422),
        ("/runs", ok, r#"{"kind":"noop","surprise":1}"#.into(), 422),
        ("/runs", ok, r#"{"kind":"noop","input":"#.into(), 400),
        ("/runs", ok, r#"{"kind":"Bad Kind!"}"#.into(), 400),
        ("/runs", ok, r#"{"kind":""}"#.into(), 400),
        ("/runs", ok, format!(r#"{{"kind":"noop","input":"{}"}}"#, "x".repeat(10_000)), 413),
        ("/runs/abc/cancel", ok, String::new(), 400),
        ("/runs/424242/cancel", ok, String::new(), 404),
        ("/nowhere", ok, String::new(), 404),
    ];
    for (path, token, body, want) in &cases {
        let (status, json) = post(path, *token, body);
        assert_eq!(status, *want, "POST {path} {body:.60}: {json}");
        if *want != 413 {
            assert!(json["error"].is_string(), "POST {path}: a JSON error body, got {json}");
        }
    }
    for (path, want) in [("/runs/abc", 400), ("/runs/424242", 404)] {
        let mut resp = agent.get(format!("{base}{path}")).call().expect("answers");
        assert_eq!(resp.status().as_u16(), want, "GET {path}");
        let json: Value = resp.body_mut().read_json().expect("a JSON body");
        assert!(json["error"].is_string());
    }
    assert!(env.db().runs.is_empty(), "no bad request stored a run");
    // A cancel of a finished run is a conflict.
    let run = env.submit("noop", "{}", 3);
    let _w = env.worker(1, None, &[]);
    env.settle(SETTLE);
    let (status, json) = post(&format!("/runs/{}/cancel", run.0), ok, "");
    assert_eq!(status, 409, "{json}");
    env.check(&[]);
}

/// A cancel lands while the job runs: it stops at its next heartbeat and the
/// run stays cancelled.
#[test]
fn cancel_stops_a_running_job() {
    let mut env = Env::new();
    let run = env.submit("sleep", r#"{"ms":5000}"#, 3);
    let _w = env.worker(1, None, &[]);
    sleep_ms(800);
    let out = env.cli(&["cancel", &run.0.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.settle(SETTLE);
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Cancelled);
    assert_eq!(db.runs[&run].attempts, 1);
}

/// The binary's own errors are clear: bad flags, unreachable servers.
#[test]
fn bad_flags_and_unreachable_servers_fail_clearly() {
    let env = Env::new();
    let out = env.cli(&["worker", "--lease-ms", "soon"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value"));
    let out = env.cli(&["worker", "--heartbeat-ms", "5000", "--lease-ms", "3000", "--read-block-ms", "100"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("heartbeat_ms"));
    let out = env.cli(&["--redis-url", "redis://127.0.0.1:1", "status", "1"]);
    assert!(!out.status.success(), "run 1 does not exist");
    let out = env.cli(&["--database-url", "postgres://postgres@127.0.0.1:1/x", "status"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to Postgres"));
    let out = env.cli(&["submit", "noop", "{not json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not JSON"));
}
