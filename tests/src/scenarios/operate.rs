//! What an operator's platform sees of a worker: its probes.

use super::{agent, wait_for};
use crate::{Env, free_port};
use pelican_model::status::RunStatus;
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
            .is_some_and(|r| r.status == RunStatus::Running)
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
        RunStatus::Succeeded,
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

/// `pelican dev` runs the whole system from the machine's own binaries:
/// Redis and Postgres of its own in a data directory, the schema, the API
/// and two workers. A run submitted through the API succeeds. SIGINT stops
/// everything in order, and nothing is left: no process holds the data
/// directory, and none of the ports it printed is open. (It uses servers
/// of its own only when given no `REDIS_URL` or `DATABASE_URL`, which this
/// test's environment may hold, so they are removed.)
pub fn pelican_dev_runs_everything_and_stops_clean(mutant: Option<&str>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};
    assert!(mutant.is_none(), "pelican dev runs the correct build");
    let dir = crate::scratch("pelican_dev");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut dev = Command::new(crate::pelican_bin())
        .args([
            "dev",
            "--listen",
            &listen,
            "--api-token",
            "tok",
            "--data-dir",
        ])
        .arg(&dir)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .spawn()
        .expect("pelican dev starts");
    let out = Arc::new(Mutex::new(Vec::<String>::new()));
    let lines = BufReader::new(dev.stdout.take().expect("piped"));
    let sink = out.clone();
    let reader = std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            sink.lock().expect("not poisoned").push(line);
        }
    });
    let printed = |prefix: &str| -> Option<String> {
        let out = out.lock().expect("not poisoned");
        out.iter()
            .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
    };
    let agent = agent();
    let base = format!("http://{listen}");
    wait_for("pelican dev's API answers", || {
        agent.get(&format!("{base}/healthz")).call().is_ok()
    });
    let submitted: Value = agent
        .post(&format!("{base}/runs"))
        .header("Authorization", "Bearer tok")
        .send_json(json!({"kind": "noop", "input": {}}))
        .expect("accepted")
        .body_mut()
        .read_json()
        .expect("a JSON answer");
    let run = submitted["run_id"].as_u64().expect("a run id");
    wait_for("the run succeeds", || {
        agent
            .get(&format!("{base}/runs/{run}"))
            .header("Authorization", "Bearer tok")
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json::<Value>().ok())
            .is_some_and(|v| v["status"] == "succeeded")
    });
    let port_of = |url: String| -> u16 {
        let tail = url.rsplit(':').next().unwrap_or_default();
        tail.split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .expect("a port")
    };
    let redis = port_of(printed("pelican dev: redis ").expect("the Redis URL printed"));
    let postgres = port_of(printed("pelican dev: postgres ").expect("the Postgres URL printed"));
    let interrupted = Command::new("kill")
        .args(["-s", "INT", &dev.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(interrupted, "SIGINT sent");
    let status = dev.wait().expect("pelican dev exits");
    reader.join().expect("the reader ends with the output");
    assert!(status.success(), "pelican dev stopped cleanly: {status}");
    assert!(printed("pelican dev: stopped").is_some());
    for (what, p) in [("the API", port), ("Redis", redis), ("Postgres", postgres)] {
        let open = std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
        assert!(!open, "{what}'s port {p} is still open");
    }
    let needle = dir.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect();
    assert!(left.is_empty(), "processes left running: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pelican bench` against a running deployment (an API and a worker):
/// every run it submits is accepted and ends, and the report's figures
/// hold together (the rates positive, the percentiles in order). With no
/// worker, its runs stay queued: at the timeout they are cancelled, and
/// the command fails saying so.
pub fn pelican_bench_reports_a_deployments_drain(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_with_flags("tok", 3, &["--body-limit-bytes", "65536"]);
    let bench = |env: &Env, extra: &[&str]| {
        let mut args = vec!["bench", "--api-url", &base, "--api-token", "tok", "--json"];
        args.extend(extra);
        env.cli(&args)
    };
    let worker = env.worker(1, None, &[]);
    let out = bench(&env, &["--runs", "300", "--batch", "100"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["accepted"], 300, "{report}");
    assert_eq!(report["ended"]["succeeded"], 300, "{report}");
    assert_eq!(report["cancelled"], 0, "{report}");
    assert!(report["drained_per_s"].as_f64() > Some(0.0), "{report}");
    let latency: Vec<u64> = (0..4)
        .map(|i| report["latency_ms"][i].as_u64().expect("a latency"))
        .collect();
    assert!(latency.is_sorted(), "p50 <= p90 <= p99 <= max: {report}");
    drop(worker);
    let out = bench(&env, &["--runs", "5", "--timeout-s", "2"]);
    assert!(!out.status.success(), "a timed-out bench fails");
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["cancelled"], 5, "{report}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("were cancelled"), "{stderr}");
    assert_eq!(
        env.db()
            .runs
            .values()
            .filter(|r| r.status == RunStatus::Cancelled)
            .count(),
        5
    );
}
