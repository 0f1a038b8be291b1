//! An operator's routes for an incident: finding a run by id or
//! idempotency key, filtering by when runs ended, counting what a filter
//! matches, cancelling and requeueing in bulk, and the last minutes'
//! throughput and latency.

use super::agent;
use crate::Env;
use pelican_model::ids::RunId;
use pelican_model::status::RunStatus;
use serde_json::{Value, json};

/// The API at `base`, called with a token.
struct Api {
    agent: ureq::Agent,
    base: String,
}

impl Api {
    /// `method path` with `token` and a JSON `body`: the status and the
    /// answer's JSON.
    fn call(&self, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let mut resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("Authorization", &auth).call(),
            (_, b) => self
                .agent
                .post(&url)
                .header("Authorization", &auth)
                .header("Content-Type", "application/json")
                .send(b.map_or_else(String::new, Value::to_string)),
        }
        .expect("the API answers");
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_json().unwrap_or(Value::Null))
    }

    fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, v) = self.call(method, path, "tok", body);
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }

    fn ids(&self, path: &str) -> Vec<u64> {
        let v = self.ok("GET", path, None);
        v["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["run_id"].as_u64().unwrap())
            .collect()
    }
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.expect("after the epoch").as_millis()).expect("in range")
}

/// A run is found by its id's key; a filter by when runs ended keeps the
/// runs that ended in the range; `GET /runs/count` counts what a filter
/// matches; `POST /runs/cancel` cancels the queued runs of a kind a batch
/// at a time, going on after its cursor; `POST /dead-letters/requeue`
/// runs a kind's dead runs again, each once; `GET /stats` reports the
/// minutes' finished runs and their latency. Bad input gets a 4xx.
pub fn the_incident_routes_find_count_and_act_in_bulk(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_with_flags("tok", 2, &["--api-read-token", "reader"]);
    let api = Api {
        agent: agent(),
        base,
    };
    let before = now_ms();
    let submit = json!({"kind": "noop", "input": {"order": 42}});
    let keyed = api
        .agent
        .post(&format!("{}/runs", api.base))
        .header("Authorization", "Bearer tok")
        .header("Idempotency-Key", "order-42")
        .header("Content-Type", "application/json")
        .send(submit.to_string())
        .expect("submitted")
        .body_mut()
        .read_json::<Value>()
        .expect("its answer")["run_id"]
        .as_u64()
        .expect("a run id");
    env.accepted.insert(RunId(keyed));
    let effects = pelican_real::jobs::effects_of("noop", &submit["input"].to_string());
    env.effects.insert(RunId(keyed), effects);
    let dead: Vec<RunId> = (0..3)
        .map(|_| env.submit("fail", r#"{"class":"retryable","times":99}"#, 2))
        .collect();
    let worker = env.worker(1, None, &[]);
    env.settle();
    drop(worker);
    let after = now_ms() + 1;
    let waiting: Vec<RunId> = (0..5)
        .map(|i| env.submit("sleep", &format!(r#"{{"ms":60000,"i":{i}}}"#), 2))
        .collect();

    // Search: by key, alone; a key no run has finds nothing.
    assert_eq!(api.ids("/runs?key=order-42"), [keyed]);
    assert!(api.ids("/runs?key=order-43").is_empty());
    // A key's run passes the other filters, or the page is empty.
    assert_eq!(api.ids("/runs?key=order-42&kind=noop"), [keyed]);
    assert!(api.ids("/runs?key=order-42&kind=fail").is_empty());
    // Ended within a range: the keyed run and the dead ones ended in it.
    let range = format!("ended_from_ms={before}&ended_to_ms={after}");
    let mut ended: Vec<u64> = dead.iter().map(|r| r.0).chain([keyed]).collect();
    ended.sort_unstable();
    assert_eq!(api.ids(&format!("/runs?{range}")), ended);
    assert!(api.ids(&format!("/runs?ended_from_ms={after}")).is_empty());
    let empty = format!("/runs?ended_from_ms={after}&ended_to_ms={before}");
    assert!(api.ids(&empty).is_empty(), "an empty range matches nothing");
    assert_eq!(
        api.ids(&format!("/runs?status=dead&kind=fail&{range}"))
            .len(),
        3
    );
    let count = api.ok("GET", &format!("/runs/count?kind=fail&{range}"), None);
    assert_eq!(count, json!({"by_status": {"dead": 3}, "total": 3}));
    let count = api.ok("GET", "/runs/count?status=queued", None);
    assert_eq!(count["total"], json!(5), "{count}");

    // Cancel the queued sleeps, two a request, after each answer's cursor.
    let (mut cancelled, mut cursor, mut requests) = (0, Value::Null, 0);
    loop {
        let body = json!({"status": "queued", "kind": "sleep", "limit": 2, "cursor": cursor});
        let v = api.ok("POST", "/runs/cancel", Some(&body));
        cancelled += v["changed"].as_u64().unwrap();
        requests += 1;
        cursor = v["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!((cancelled, requests), (5, 3), "5 runs, 2 a request");
    let v = api.ok(
        "POST",
        "/runs/cancel",
        Some(&json!({"status": "queued", "kind": "sleep"})),
    );
    assert_eq!(v, json!({"changed": 0, "skipped": 0, "next_cursor": null}));

    // The same from Rust, through pelican-client.
    let client = pelican_client::Client::new(&api.base)
        .expect("a client")
        .with_token("tok");
    let found = crate::rt().block_on(client.run_of_key("order-42"));
    let found = found.expect("found");
    assert_eq!(found.map(|r| r.run_id), Some(RunId(keyed)));
    let count = crate::rt().block_on(client.count(Some("fail"), Some(RunStatus::Dead)));
    assert_eq!(count.expect("counted").total, 3);
    let none = crate::rt().block_on(client.cancel_matching(RunStatus::Queued, Some("sleep")));
    assert_eq!(none.expect("none left").changed, 0);

    // Requeue every dead fail: each once, with one more attempt.
    let v = api.ok(
        "POST",
        "/dead-letters/requeue",
        Some(&json!({"kind": "fail", "extra_attempts": 1})),
    );
    assert_eq!(v["changed"], json!(3), "{v}");
    let again = crate::rt().block_on(client.requeue_dead_of_kind("fail", 1));
    assert_eq!(again.expect("none dead now").changed, 0);
    assert_eq!(
        api.ok("GET", "/runs/count?status=queued&kind=fail", None)["total"],
        json!(3)
    );

    // The last minutes: every finished run counted, latency where runs succeeded.
    let v = api.ok("GET", "/stats?minutes=5", None);
    let minutes = v["minutes"].as_array().expect("minutes");
    assert_eq!(minutes.len(), 5, "{v}");
    let finished: u64 = minutes
        .iter()
        .flat_map(|m| m["finished"].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        finished, 6,
        "1 succeeded, 5 cancelled (the requeued are live): {v}"
    );
    let succeeded: Vec<&Value> = minutes.iter().filter(|m| !m["p50_ms"].is_null()).collect();
    assert_eq!(succeeded.len(), 1, "{v}");
    assert!(
        succeeded[0]["p50_ms"].as_u64() <= succeeded[0]["p99_ms"].as_u64(),
        "{v}"
    );

    for (method, path, token, body, want) in [
        ("GET", "/runs?key=has%20space", "tok", None, 400),
        ("GET", "/runs/count?status=nope", "tok", None, 400),
        (
            "GET",
            "/runs/count?ended_to_ms=9223372036854775808",
            "tok",
            None,
            400,
        ),
        ("GET", "/stats?minutes=61", "tok", None, 400),
        ("POST", "/runs/cancel", "reader", Some(json!({})), 403),
        (
            "POST",
            "/runs/cancel",
            "tok",
            Some(json!({"status": "succeeded"})),
            400,
        ),
        (
            "POST",
            "/runs/cancel",
            "tok",
            Some(json!({"status": "queued", "limit": 0})),
            400,
        ),
        ("POST", "/runs/cancel", "tok", Some(json!({})), 422),
        (
            "POST",
            "/runs/cancel",
            "tok",
            Some(json!([null, null])),
            422,
        ),
        (
            "POST",
            "/runs/cancel",
            "tok",
            Some(json!({"status": "queued", "limit": 2.5})),
            422,
        ),
        (
            "POST",
            "/runs/cancel",
            "tok",
            Some(json!({"all": true})),
            422,
        ),
        ("POST", "/dead-letters/requeue", "tok", Some(json!({})), 422),
        (
            "POST",
            "/dead-letters/requeue",
            "tok",
            Some(json!({"kind": "fail", "extra_attempts": 0})),
            400,
        ),
    ] {
        let (status, v) = api.call(method, path, token, body.as_ref());
        assert_eq!(status, want, "{method} {path} {body:?}: {v}");
        assert!(v["error"].is_string(), "{method} {path}: {v}");
    }

    let _worker = env.worker(2, None, &[]);
    env.settle();
    let db = env.check(&[]);
    for run in &dead {
        assert_eq!(
            (db.runs[run].status, db.runs[run].attempts),
            (RunStatus::Dead, 3),
            "run {run}: requeued once"
        );
    }
    for run in &waiting {
        assert_eq!(db.runs[run].status, RunStatus::Cancelled);
    }
}
