//! Delayed runs (S15) against real processes: submitted through the API
//! with `delay_ms` and `run_at_ms`, they wait in Postgres while workers are
//! killed around them, and no attempt starts before its due time.

use super::{FAST_TAKEOVER, agent, sleep_ms, wait_for};
use crate::Env;
use pelican_model::ids::RunId;
use pelican_model::status::RunStatus;
use serde_json::{Value, json};
use std::time::{SystemTime, UNIX_EPOCH};

/// How long the scenario's delayed runs wait: every worker reads, reclaims
/// and runs its maintenance passes several times before they are due.
const DELAY_MS: u64 = 4_000;

/// Twenty runs submitted in one request with `delay_ms`, one with
/// `run_at_ms`, and one due in an hour that is cancelled while it waits.
/// Until due they are `delayed` and unpublished; a worker is killed
/// before they are due and another while they run. Every delayed run
/// succeeds, each of its attempts claimed no earlier than its due time by
/// Postgres's clock; the cancelled one never starts. A delay past its
/// bound is refused, and nothing is stored for it.
pub fn delayed_runs_start_when_due(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("sekret");
    let mut w1 = env.worker(1, None, FAST_TAKEOVER);
    let mut w2 = env.worker(2, None, FAST_TAKEOVER);
    let agent = agent();
    let post = |path: &str, body: &Value| -> (u16, Value) {
        let mut resp = agent
            .post(format!("{base}{path}"))
            .header("Authorization", "Bearer sekret")
            .send_json(body)
            .expect("the API answers");
        let code = resp.status().as_u16();
        (code, resp.body_mut().read_json().unwrap_or(Value::Null))
    };
    let input = json!({"calls": 1, "ms": 400});
    let items: Vec<Value> = (0..20)
        .map(|_| json!({"kind": "effect", "input": input, "delay_ms": DELAY_MS}))
        .collect();
    let (code, body) = post("/runs", &json!(items));
    assert_eq!(code, 200, "{body}");
    let mut delayed: Vec<RunId> = Vec::new();
    for item in body["runs"].as_array().expect("one answer per item") {
        assert_eq!(
            (item["code"].as_u64(), item["status"].as_str()),
            (Some(202), Some("delayed")),
            "{item}"
        );
        delayed.push(RunId(item["run_id"].as_u64().expect("a run id")));
    }
    let now_ms = || {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        u64::try_from(since.as_millis()).expect("ms fit")
    };
    let at = json!({"kind": "effect", "input": input, "run_at_ms": now_ms() + DELAY_MS});
    let (code, body) = post("/runs", &at);
    assert_eq!(
        (code, body["status"].as_str()),
        (202, Some("delayed")),
        "{body}"
    );
    delayed.push(RunId(body["run_id"].as_u64().expect("a run id")));
    let later = json!({"kind": "noop", "delay_ms": 3_600_000});
    let (code, body) = post("/runs", &later);
    assert_eq!(code, 202, "{body}");
    let cancelled = RunId(body["run_id"].as_u64().expect("a run id"));
    let (code, body) = post("/runs", &json!({"kind": "noop", "delay_ms": u64::MAX}));
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("delay_ms")),
        "{body}"
    );
    for run in &delayed {
        env.accepted.insert(*run);
        env.effects.insert(
            *run,
            pelican_real::jobs::effects_of("effect", &input.to_string()),
        );
    }
    env.accepted.insert(cancelled);
    env.effects.insert(cancelled, 0);
    // While they wait: delayed, with no entry, whatever the workers do.
    let db = env.db();
    assert_eq!(
        db.runs.len(),
        delayed.len() + 1,
        "the refused run was not stored"
    );
    for run in delayed.iter().chain([&cancelled]) {
        let r = &db.runs[run];
        assert_eq!(
            (r.status, r.entry_id, r.attempts),
            (RunStatus::Delayed, None, 0),
            "{r:?}"
        );
        assert!(r.due_at.is_some(), "{r:?}");
    }
    let metrics = || -> String {
        let mut resp = agent
            .get(format!("{base}/metrics"))
            .header("Authorization", "Bearer sekret")
            .call()
            .expect("metrics");
        resp.body_mut().read_to_string().expect("text")
    };
    let text = metrics();
    let waiting = format!("pelican_runs{{status=\"delayed\"}} {}", delayed.len() + 1);
    assert!(text.contains(&waiting), "{waiting}: {text}");
    assert!(text.contains("pelican_due_lag_ms 0"), "{text}");
    let (code, body) = post(&format!("/runs/{}/cancel", cancelled.0), &json!({}));
    assert_eq!(code, 200, "{body}");
    w1.kill9();
    let _w3 = env.worker(3, None, FAST_TAKEOVER);
    let first = delayed[0];
    wait_for("a delayed run starts", || {
        env.db().runs[&first].attempts > 0
    });
    sleep_ms(200);
    w2.kill9();
    env.settle();
    let db = env.check(&[]);
    let mut late_ms = Vec::new();
    for run in &delayed {
        let r = &db.runs[run];
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        let due = r.due_at.expect("a delayed run keeps its due time");
        let attempts = db.attempts.iter().filter(|((r, _), _)| r == run);
        for ((_, n), a) in attempts {
            let claimed = a
                .claimed_at
                .expect("attempts record when they were claimed");
            assert!(
                claimed >= due,
                "{run} attempt {n:?} claimed at {claimed}, before its due time {due} (S15)"
            );
            late_ms.push(claimed.ms_since(due));
        }
    }
    let r = &db.runs[&cancelled];
    assert_eq!((r.status, r.attempts), (RunStatus::Cancelled, 0), "{r:?}");
    let text = metrics();
    for line in ["pelican_runs{status=\"delayed\"} 0", "pelican_due_lag_ms 0"] {
        assert!(text.contains(line), "{line}: {text}");
    }
    late_ms.sort_unstable();
    eprintln!(
        "delayed runs: {} attempts, claimed {:?} ms after due (min, max)",
        late_ms.len(),
        (late_ms.first(), late_ms.last())
    );
}
