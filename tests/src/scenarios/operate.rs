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

/// Every `pelican_*` metric the deploy kit names (alert rules, the Grafana
/// dashboard, the worker autoscaler) is one that a running API or worker
/// exports, after a run succeeded and one died.
pub fn the_deploy_kit_names_only_exported_metrics(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("tok");
    let listen = format!("127.0.0.1:{}", free_port());
    let _worker = env.worker(1, None, &["--metrics-listen", &listen]);
    env.submit("noop", "{}", 1);
    env.submit("fail", r#"{"class":"retryable","times":9}"#, 1);
    env.settle();
    let agent = agent();
    let scrape = |url: &str| -> String {
        agent
            .get(url)
            .header("Authorization", "Bearer tok")
            .call()
            .expect("metrics answer")
            .body_mut()
            .read_to_string()
            .expect("text")
    };
    let exported = format!(
        "{}\n{}",
        scrape(&format!("{base}/metrics")),
        scrape(&format!("http://{listen}/metrics"))
    );
    let names: std::collections::BTreeSet<&str> = exported
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut named = std::collections::BTreeSet::new();
    let mut files = vec![crate::deploy::root().join("deploy")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (at, _) in text.match_indices("pelican_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            named.insert((name, path.clone()));
        }
    }
    assert!(named.len() >= 8, "{named:?}");
    let missing: Vec<String> = named
        .iter()
        .filter(|(name, _)| {
            !names.contains(name.as_str()) && !names.contains(format!("{name}_count").as_str())
        })
        .map(|(name, path)| format!("{name} (in {})", path.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "named by the deploy kit but not exported: {missing:?}\nexported: {names:?}"
    );
}
