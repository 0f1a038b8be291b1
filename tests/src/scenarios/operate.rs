//! What an operator's platform sees of a worker: its probes.

use super::{agent, wait_for};
use crate::{Env, free_port};
use serde_json::{Value, json};

/// A worker's `--metrics-listen` serves `/metrics`, `/healthz` and
/// `/readyz`. Readiness follows its connections: ready once its reads are
/// answered, not ready while Redis answers nothing (the process stays
/// healthy), ready again when Redis is back, and not ready from the moment
/// it is told to stop while it finishes its in-flight job.
pub fn worker_probes_follow_its_connections(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut worker = env.worker(1, None, &["--metrics-listen", &listen]);
    let agent = agent();
    let get = |path: &str| -> (u16, String) {
        match agent.get(&format!("http://{listen}{path}")).call() {
            Ok(mut r) => (
                r.status().as_u16(),
                r.body_mut().read_to_string().unwrap_or_default(),
            ),
            Err(_) => (0, String::new()),
        }
    };
    let ready = |path: &str| -> (u16, Value) {
        let (code, body) = get(path);
        (code, serde_json::from_str(&body).unwrap_or(Value::Null))
    };
    wait_for("the worker is ready", || ready("/readyz").0 == 200);
    assert_eq!(get("/healthz").0, 200);
    env.submit("noop", "{}", 1);
    env.settle();
    let (code, metrics) = get("/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("pelican_attempts_total{outcome=\"succeeded\"} 1"),
        "{metrics}"
    );
    env.redis.freeze();
    wait_for("not ready while Redis answers nothing", || {
        ready("/readyz")
            == (
                503,
                json!({"ready": false, "reading": false, "postgres": true, "stopping": false}),
            )
    });
    assert_eq!(get("/healthz").0, 200, "still alive");
    env.redis.thaw();
    wait_for("ready again", || ready("/readyz").0 == 200);
    let run = env.submit("sleep", r#"{"ms":3000}"#, 1);
    wait_for("the job runs", || {
        env.db()
            .runs
            .get(&run)
            .is_some_and(|r| r.status == pelican_model::status::RunStatus::Running)
    });
    worker.term();
    wait_for("not ready once stopping", || {
        let (code, v) = ready("/readyz");
        code == 503 && v["stopping"] == json!(true)
    });
    assert!(worker.wait(std::time::Duration::from_secs(30)).success());
    let db = env.check(&[]);
    assert_eq!(
        db.runs[&run].status,
        pelican_model::status::RunStatus::Succeeded,
        "the in-flight job finished in the grace"
    );
}
