//! What an operator relies on without thinking of it: logs that name runs
//! and statements but never hold users' values, tokens read as a secret
//! store writes them, names unique across hosts, and the streams and
//! consumer lists kept from growing.

use super::{agent, wait_for};
use crate::Env;
use serde_json::json;

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
        let db = pelican_real::live::PgDb::connect(&url, 1, std::time::Duration::from_secs(5))
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
