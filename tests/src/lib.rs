//! The harness of Pelican's live tests: throwaway Redis servers (AOF
//! everysec) and Postgres databases or clusters, real `pelican` processes
//! (the binary named by `PELICAN_BIN`, built with the `failpoints` feature),
//! and the end-of-test check of the guarantees on the live state.
//!
//! Services: `redis-server` must be on `PATH`; Postgres must accept
//! connections at `PELICAN_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), where each test creates
//! its own database; the Postgres-restart test also needs `initdb` and
//! `pg_ctl` to run a cluster of its own. A missing service fails the test
//! with what to do, never skips it. `cargo xtask test` builds the binary and
//! `.ci/run` installs and starts the services.
//!
//! The harness's parts: `services` (the throwaway Redis servers, Postgres
//! databases and clusters), `env` (one test's world, [`Env`]), `processes`
//! (the `pelican` processes it starts, [`Proc`]), `stream` (the job stream as
//! a test reads and tampers with it) and `audit` (the end-of-test check,
//! [`Finding`]).
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod audit;
pub mod bench;
pub mod chaos;
pub mod conformance;
pub mod deploy;
mod env;
pub mod otlp;
mod processes;
pub mod scenarios;
mod services;
pub mod soak;
mod stream;

pub use audit::{Finding, stale_writes_in_traces};
pub(crate) use env::Fixed;
pub use env::{Env, submit_new};
pub use pelican_model::invariants::{Broken, Guarantee};
pub use processes::{Proc, take_traces};
pub use services::{Cluster, Database, Redis, RedisConnection, pg_admin_url};

/// The shared async runtime the harness talks to Postgres and Redis with.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    })
}

/// The `pelican` binary under test.
///
/// # Panics
/// When `PELICAN_BIN` is unset or wrong: say how to run the tests.
pub fn pelican_bin() -> PathBuf {
    let bin = std::env::var_os("PELICAN_BIN").unwrap_or_else(|| {
        panic!(
            "PELICAN_BIN is not set: run the live tests with `cargo xtask test` (it builds \
             `pelican` with the failpoints feature and sets PELICAN_BIN)"
        )
    });
    let bin = PathBuf::from(bin);
    assert!(bin.is_file(), "PELICAN_BIN={} is not a file", bin.display());
    bin
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name no other test of this process uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh scratch directory (removed by its owner's drop).
pub fn scratch(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(prefix));
    std::fs::create_dir_all(&dir).expect("the temp dir is writable");
    dir
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding an ephemeral port")
        .port()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An HTTP client for the soaks' load: every status is an answer, not an
/// error, and no request waits longer than 10 s.
#[must_use]
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// The series `series` (its name and labels, as exposed) on the
/// Prometheus text at `url`, read with `token` if given.
#[must_use]
pub fn metric(url: &str, token: Option<&str>, series: &str) -> Option<f64> {
    let mut req = agent().get(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let text = req.call().ok()?.body_mut().read_to_string().ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// `x` rounded to `digits` decimals (for reports).
#[must_use]
pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::stale_writes_in_traces;

    fn trace(lines: &[&str]) -> std::path::PathBuf {
        let path = super::scratch("pelican_trace_test").join("t.jsonl");
        std::fs::write(&path, lines.join("\n")).expect("writable");
        path
    }

    const A: &str = r#"{"Delivery":[1,{"ms":1,"seq":0},0]}"#;
    const B: &str = r#"{"Delivery":[2,{"ms":1,"seq":0},0]}"#;

    fn claim(role: &str, fence: u64, at: u64) -> [String; 2] {
        [
            format!(
                r#"{{"sent":{{"role":{role},"command":{{"Db":{{"Claim":{{"run":7,"dispatch":1}}}}}}}}}}"#
            ),
            format!(
                r#"{{"received":{{"role":{role},"now":{at},"input":{{"Db":{{"Claimed":{{"claimed":{{"fence":{fence}}}}}}}}}}}}}"#
            ),
        ]
    }

    fn write(role: &str, fence: u64, after: u64, rows: u64) -> [String; 3] {
        [
            format!(
                r#"{{"received":{{"role":{role},"now":{after},"input":{{"Executed":{{}}}}}}}}"#
            ),
            format!(
                r#"{{"sent":{{"role":{role},"command":{{"Db":{{"Complete":{{"run":7,"fence":{fence},"result":"null"}}}}}}}}}}"#
            ),
            format!(
                r#"{{"received":{{"role":{role},"now":{},"input":{{"Db":{{"Rows":{rows}}}}}}}}}"#,
                after + 1
            ),
        ]
    }

    fn lines(parts: &[&[String]]) -> Vec<String> {
        parts.iter().flat_map(|p| p.iter().cloned()).collect()
    }

    #[test]
    fn a_write_accepted_after_a_newer_claim_is_stale() {
        // A claims fence 1; B claims fence 2 at 100; A's write (with the
        // fence it read, as NoFence does) is accepted at 200.
        let a = lines(&[&claim(A, 1, 10), &write(A, 2, 200, 1)]);
        let b = lines(&[&claim(B, 2, 100)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let pb = trace(&b.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(stale_writes_in_traces(&[pa.clone(), pb.clone()]).len(), 1);
        // Refused (0 rows): fine.
        let a = lines(&[&claim(A, 1, 10), &write(A, 1, 200, 0)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(stale_writes_in_traces(&[pa, pb.clone()]).is_empty());
        // Accepted before the newer claim: fine.
        let a = lines(&[&claim(A, 1, 10), &write(A, 1, 50, 1)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(stale_writes_in_traces(&[pa, pb]).is_empty());
    }
}
