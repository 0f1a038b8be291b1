//! What an operator relies on without thinking of it: logs that name runs
//! and statements but never hold users' values, tokens read as a secret
//! store writes them, one partition count for the whole deployment, and
//! an API that bounds what a client can hold open.

use super::{agent, wait_for};
use crate::Env;
use serde_json::json;
use std::time::Duration;

/// A value no log line may hold.
const MARK: &str = "users-value-7f3a9c";

/// A statement that carries users' values fails (a keyed submission, whose
/// insert a constraint now refuses): the log says which statement failed,
/// and not one line holds the run's input.
pub fn logs_carry_ids_and_names_never_values(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("tok");
    let agent = agent();
    let submit = |key: &str| {
        agent
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer tok")
            .header("Idempotency-Key", key)
            .send_json(json!({ "kind": "echo", "input": { "text": MARK } }))
            .expect("the API answers")
            .status()
            .as_u16()
    };
    assert_eq!(submit("k1"), 202);
    sql(
        &env,
        "ALTER TABLE submit_keys ADD CONSTRAINT refuse_all CHECK (false) NOT VALID",
    );
    // Whether it was stored is not known to the API: 504.
    assert_eq!(submit("k2"), 504);
    sql(&env, "ALTER TABLE submit_keys DROP CONSTRAINT refuse_all");
    assert_eq!(submit("k3"), 202);
    let _w = env.worker(1, None, &[]);
    wait_for("both runs succeed", || {
        let db = env.db();
        db.runs.len() == 2 && db.runs.values().all(|r| r.status.is_terminal())
    });
    let logs: Vec<(String, String)> = env
        .log_files()
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap_or_default()))
        .collect();
    for (file, text) in &logs {
        if let Some(line) = text.lines().find(|l| l.contains(MARK)) {
            panic!("{file} holds a user's value: {line}");
        }
    }
    assert!(
        logs.iter()
            .any(|(_, text)| text.contains("statement failed") && text.contains("insert_run_keyed")),
        "the failed statement was logged by name: {:?}",
        env.log_files()
    );
}

/// Runs `text` on the test's database.
fn sql(env: &Env, text: &str) {
    let url = env.database_url.clone();
    let text = text.to_owned();
    crate::rt().block_on(async move {
        let db = pelican_real::live::PgDb::connect(&url, 1, Duration::from_secs(5))
            .await
            .expect("the test's Postgres answers");
        let mut s = db.session().await.expect("a session");
        s.raw(&text).await.expect("the test's SQL runs");
    });
}

/// A token read from a file that ends with a newline (a Kubernetes secret
/// made with `--from-file`) is the token without it; an empty one is
/// refused at start.
pub fn tokens_are_read_as_secret_stores_write_them(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("tok\n");
    let status = agent()
        .get(format!("{base}/runs"))
        .header("Authorization", "Bearer tok")
        .call()
        .expect("the API answers")
        .status()
        .as_u16();
    assert_eq!(status, 200, "the token without its newline");
    let out = env.cli(&["api", "--api-token", " \n", "--listen", "127.0.0.1:1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the token is empty"), "{stderr}");
}

/// A keyed bulk submission goes to Postgres as one insert, not one a run:
/// 2,000 keyed items are all accepted, and Postgres counts a handful of
/// commits for them (its own statistics, read once every session has
/// reported: one a statement, where one a run made 2,000).
pub fn a_keyed_bulk_is_one_statement(mutant: Option<&str>) {
    const ITEMS: usize = 2_000;
    let mut env = Env::mutated(mutant);
    let flags = ["--bulk-max", "5000", "--body-limit-bytes", "1048576"];
    let (_api, base) = env.api_with_flags("tok", 3, &flags);
    let commits = |env: &Env| {
        // Sessions report their counts at most every second when busy,
        // and within ten when idle.
        std::thread::sleep(Duration::from_secs(11));
        let url = env.database_url.clone();
        crate::rt().block_on(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("the test's Postgres answers");
            let n: i64 = sqlx::query_scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .expect("the statistics answer");
            n
        })
    };
    let items: Vec<serde_json::Value> = (0..ITEMS)
        .map(|i| json!({ "kind": "noop", "input": { "i": i }, "key": format!("bulk-{i}") }))
        .collect();
    let before = commits(&env);
    let mut resp = agent()
        .post(format!("{base}/runs"))
        .header("Authorization", "Bearer tok")
        .send_json(serde_json::Value::Array(items))
        .expect("the API answers");
    assert_eq!(resp.status().as_u16(), 200);
    let body: serde_json::Value = resp.body_mut().read_json().expect("JSON");
    let codes: Vec<u64> = body["runs"]
        .as_array()
        .expect("one answer an item")
        .iter()
        .filter_map(|a| a["code"].as_u64())
        .collect();
    assert_eq!(codes, vec![202; ITEMS], "every item accepted");
    let spent = commits(&env) - before;
    assert!(spent < 50, "{spent} commits for a keyed bulk of {ITEMS}");
    assert_eq!(env.db().runs.len(), ITEMS);
}

/// The partition count is the deployment's: a process started with
/// another refuses to start and says which to use; `pelican partitions
/// --set` grows the count and refuses to shrink it; a worker of the grown
/// count drains a run published under the old one; and a process of the
/// old count is then refused.
pub fn a_partition_count_is_the_deployments(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (n, m) = (env.partitions.to_string(), (env.partitions + 1).to_string());
    let (_api, _base) = env.api("tok");
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let out = env.cli(&["partitions"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        n,
        "stored by the API"
    );
    let out = env.cli(&[
        "worker",
        "--id",
        "9",
        "--read-block-ms",
        "200",
        "--partitions",
        &m,
    ]);
    assert!(!out.status.success(), "a worker of another count started");
    let said = format!("this deployment has {n} partitions");
    assert!(text(&out).contains(&said), "{}", text(&out));
    let out = env.cli(&["partitions", "--set", &m]);
    assert!(out.status.success(), "{}", text(&out));
    let out = env.cli(&["partitions", "--set", &n]);
    assert!(!out.status.success(), "the count shrank");
    assert!(text(&out).contains("fewer is refused"), "{}", text(&out));
    let run = env.submit("noop", "{}", 3);
    let _w = env.worker(1, None, &["--partitions", &m]);
    let db = env.settle();
    assert!(db.runs[&run].status.is_terminal());
    let out = env.cli(&["submit", "noop"]);
    assert!(!out.status.success(), "a submission under the old count");
    assert!(text(&out).contains(&format!("this deployment has {m} partitions")));
    env.check(&[]);
}

/// The API bounds what a client can hold open. A connection that sends
/// its request head too slowly is closed after `--header-read-timeout-ms`,
/// and so is one that idles after a request; past `--connections-max`
/// connections, the next is served only once one closes.
pub fn the_api_bounds_slow_heads_and_connections(mutant: Option<&str>) {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_with_flags("tok", 3, &["--header-read-timeout-ms", "500"]);
    let addr = base.trim_start_matches("http://").to_owned();
    let closed_within = |mut tcp: TcpStream, secs: u64| -> bool {
        tcp.set_read_timeout(Some(Duration::from_secs(secs)))
            .expect("a timeout");
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    );
                }
            }
        }
    };
    let mut slow = TcpStream::connect(&addr).expect("the API accepts");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: pelican\r\n")
        .expect("half a head");
    assert!(
        closed_within(slow, 5),
        "a head half sent held its connection"
    );
    let mut idle = TcpStream::connect(&addr).expect("the API accepts");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: pelican\r\n\r\n")
        .expect("a request");
    assert!(closed_within(idle, 5), "an idle connection was kept");
    let (_capped, base) = env.api_with_flags(
        "tok",
        3,
        &[
            "--connections-max",
            "2",
            "--header-read-timeout-ms",
            "20000",
        ],
    );
    let addr = base.trim_start_matches("http://").to_owned();
    // /healthz answered while waiting for the API is done; two idle
    // connections take both places.
    std::thread::sleep(Duration::from_millis(300));
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(&addr).expect("the API accepts"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let quick: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(1)))
        .build()
        .into();
    let health = format!("{base}/healthz");
    assert!(
        quick.get(&health).call().is_err(),
        "a third connection was served while two were held"
    );
    drop(held);
    wait_for("a place frees", || quick.get(&health).call().is_ok());
    env.check(&[]);
}
