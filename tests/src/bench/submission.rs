//! Bulk submission through the API: `POST /runs` with arrays of
//! [`PER_REQUEST`] runs, [`CLIENTS`] requests in flight, into an empty
//! database — the figure set beside `pelican submit --from-file`'s, which
//! drives the same `submit_many` without HTTP.

use crate::{Cluster, Database, Env};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Runs in one request: the API's default `--bulk-max`.
pub const PER_REQUEST: u32 = 1_000;
/// Requests in flight at once.
pub const CLIENTS: u32 = 4;

/// Submits `n` no-op runs, each with an input of its own, through a fresh
/// `pelican api`; checks that every one was stored and answers runs a
/// second, from the first request to the last answer (the bodies are
/// made before the clock starts).
///
/// # Panics
/// When a request fails or an item is not stored.
pub fn through_api(cluster: &Cluster, n: u32) -> f64 {
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), None);
    env.trace = false;
    let (_api, base) = env.api_with_flags("bench", 3, &["--body-limit-bytes", "1048576"]);
    let bodies: Vec<String> = (0..n.div_ceil(PER_REQUEST))
        .map(|r| body(r * PER_REQUEST..n.min((r + 1) * PER_REQUEST)))
        .collect();
    eprintln!("bench: POST /runs of {n} runs, {PER_REQUEST} a request, {CLIENTS} in flight");
    let next = AtomicU32::new(0);
    let start = Instant::now();
    let stored: u32 = std::thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let agent = crate::agent();
                    let mut stored = 0;
                    loop {
                        let r = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(body) = bodies.get(r) else {
                            return stored;
                        };
                        stored += post(&agent, &base, body);
                    }
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("a client thread"))
            .sum()
    });
    let seconds = start.elapsed().as_secs_f64();
    assert_eq!(stored, n, "every run stored");
    let per_s = f64::from(n) / seconds;
    eprintln!("bench: submitted through the API in {seconds:.2} s ({per_s:.0}/s)");
    per_s
}

/// A JSON array of no-op runs, one for each of `runs`.
fn body(runs: std::ops::Range<u32>) -> String {
    let mut text = String::from("[");
    for i in runs {
        if text.len() > 1 {
            text.push(',');
        }
        let _ = write!(text, r#"{{"kind":"noop","input":{{"i":{i}}}}}"#);
    }
    text.push(']');
    text
}

/// Sends one array and answers how many of its runs were stored (202).
/// The answer is counted, not parsed: the bench shares the two cores with
/// the API, and a parse of every answer would be its cost, not the API's.
fn post(agent: &ureq::Agent, base: &str, body: &str) -> u32 {
    let mut answer = agent
        .post(format!("{base}/runs"))
        .header("Authorization", "Bearer bench")
        .header("Content-Type", "application/json")
        .send(body)
        .unwrap_or_else(|e| panic!("POST /runs: {e}"));
    let status = answer.status().as_u16();
    let text = answer
        .body_mut()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .unwrap_or_else(|e| panic!("POST /runs answered {status}, unreadable: {e}"));
    assert_eq!(status, 200, "POST /runs of an array: {text}");
    let stored = text.matches(STORED).count();
    u32::try_from(stored).expect("at most PER_REQUEST")
}

/// An item's answer when its run was stored, as the API writes it.
const STORED: &str = r#""code":202"#;

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn an_items_code_is_counted_as_the_wire_type_writes_it() {
        let item = pelican_client::wire::BulkItem::refused(202, String::new());
        let answer = json!({ "runs": [item] }).to_string();
        assert_eq!(answer.matches(super::STORED).count(), 1, "{answer}");
    }
}
