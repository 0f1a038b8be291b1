//! The soak's load: submitters at a steady rate, SSE watchers following
//! runs to their end, and a dashboard's polling; each counts what it was
//! answered.

use super::{Plan, TOKEN};
use crate::agent;
use pelican_model::ids::RunId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the load shares with the sampler and the verdict.
#[derive(Default)]
pub struct Load {
    /// Every run the API named, with when it was first accepted.
    pub accepted: Mutex<BTreeMap<RunId, Instant>>,
    /// Runs a cancel was asked for.
    pub cancelled: Mutex<BTreeSet<RunId>>,
    /// No-op runs, newest last, for the watchers to follow.
    pub watchable: Mutex<VecDeque<RunId>>,
    /// Submission latencies (ms) since the sampler last took them.
    pub submit_ms: Mutex<Vec<f64>>,
    /// From acceptance to a watcher's receipt of the terminal event (ms),
    /// since the sampler last took them.
    pub watch_lag_ms: Mutex<Vec<f64>>,
    /// Answers by HTTP status (0: no answer: the API was down).
    pub statuses: Mutex<BTreeMap<u16, u64>>,
    /// Set when the load is to stop.
    pub stop: AtomicBool,
    /// Runs accepted so far.
    pub accepted_n: AtomicU64,
}

impl Load {
    fn answered(&self, status: u16) {
        *self
            .statuses
            .lock()
            .expect("not poisoned")
            .entry(status)
            .or_default() += 1;
    }

    /// Answers of 500 and above.
    #[must_use]
    pub fn server_errors(&self) -> u64 {
        let s = self.statuses.lock().expect("not poisoned");
        s.range(500..).map(|(_, n)| n).sum()
    }
}

/// The `i`th job of the soak: steps, progress, failures of each class,
/// unknown errors, a limited provider, cancels (a pure function of the
/// seed). The second field is the delay before its cancel, if any.
#[must_use]
pub fn job(plan: &Plan, i: u64) -> (&'static str, Value, Option<u64>) {
    let mut rng = StdRng::seed_from_u64(plan.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ i);
    match rng.random_range(0..100) {
        0..40 => ("noop", json!({}), None),
        40..55 => ("effect", json!({ "calls": rng.random_range(1..=3) }), None),
        55..68 => ("steps", json!({ "calls": 2, "ms": 20 }), None),
        68..76 => ("fail", json!({ "class": "retryable", "times": 1 }), None),
        76..80 => ("fail", json!({ "class": "terminal", "times": 9 }), None),
        80..84 => ("fail", json!({ "class": "unknown", "times": 1 }), None),
        84..92 => ("limited", json!({ "provider": "soak", "ms": 20 }), None),
        92..95 => ("fail", json!({ "class": "retryable", "times": 99 }), None),
        _ => (
            "sleep",
            json!({ "ms": rng.random_range(300..900) }),
            Some(rng.random_range(50..400)),
        ),
    }
}

/// Submits jobs `lane, lane + lanes, …` at the plan's rate until told to
/// stop, each under the key `soak-<seed>-<i>`, retried under it until the
/// API names its run; cancels the ones the workload cancels.
pub(super) fn submitter(plan: &Plan, base: &str, lane: u64, lanes: u64, load: &Load) {
    let agent = agent();
    let started = Instant::now();
    let mut cancels: Vec<(Instant, RunId)> = Vec::new();
    let mut i = lane;
    while !load.stop.load(Ordering::Relaxed) {
        let due = started + Duration::from_secs_f64(i as f64 / f64::from(plan.rate_per_s));
        cancels.retain(|(at, run)| *at > Instant::now() || !cancel(&agent, base, *run, load));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait.min(Duration::from_millis(50)));
            continue;
        }
        let (kind, input, cancel_after) = job(plan, i);
        let sent = Instant::now();
        let answer = agent
            .post(format!("{base}/runs"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Idempotency-Key", format!("soak-{}-{i}", plan.seed))
            .send_json(json!({ "kind": kind, "input": input }));
        let run = match answer {
            Ok(mut resp) => {
                load.answered(resp.status().as_u16());
                match resp.status().as_u16() {
                    200 | 202 => resp
                        .body_mut()
                        .read_json::<Value>()
                        .ok()
                        .and_then(|v| v["run_id"].as_u64())
                        .map(RunId),
                    _ => None,
                }
            }
            Err(_) => {
                load.answered(0);
                None
            }
        };
        let Some(run) = run else {
            // The API restarting: the same key again finds out.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let took = sent.elapsed().as_secs_f64() * 1000.0;
        load.submit_ms.lock().expect("not poisoned").push(took);
        let first = load
            .accepted
            .lock()
            .expect("not poisoned")
            .insert(run, sent)
            .is_none();
        if first {
            load.accepted_n.fetch_add(1, Ordering::Relaxed);
        }
        if kind == "noop" {
            let mut w = load.watchable.lock().expect("not poisoned");
            w.push_back(run);
            if w.len() > 1_000 {
                w.pop_front();
            }
        }
        if let Some(ms) = cancel_after {
            load.cancelled.lock().expect("not poisoned").insert(run);
            cancels.push((Instant::now() + Duration::from_millis(ms), run));
        }
        i += lanes;
    }
}

/// Asks for `run`'s cancel; whether the API answered.
fn cancel(agent: &ureq::Agent, base: &str, run: RunId, load: &Load) -> bool {
    let r = agent
        .post(format!("{base}/runs/{}/cancel", run.0))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .send_empty();
    let status = r.map_or(0, |r| r.status().as_u16());
    load.answered(status);
    status != 0
}

/// Polls what a dashboard shows, once a second, with the read token.
pub(super) fn dashboard(base: &str, load: &Load) {
    let agent = agent();
    while !load.stop.load(Ordering::Relaxed) {
        for path in ["/queue", "/runs?limit=100", "/dead-letters?limit=100"] {
            let r = agent
                .get(format!("{base}{path}"))
                .header("Authorization", format!("Bearer {}", super::READ_TOKEN))
                .call();
            load.answered(r.map_or(0, |r| r.status().as_u16()));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Follows newly accepted no-op runs over SSE with the client library (it
/// reconnects with `Last-Event-ID` through API restarts), one after
/// another, and records when each one's terminal event arrives.
pub(super) async fn watcher(base: String, load: std::sync::Arc<Load>) {
    use futures_util::StreamExt;
    let client = pelican_client::Client::new(&base)
        .expect("the API's address")
        .with_token(TOKEN)
        .with_retry(pelican_client::Retry {
            attempts: 100,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_millis(500),
            timeout: Duration::from_secs(10),
        });
    while !load.stop.load(Ordering::Relaxed) {
        let next = load.watchable.lock().expect("not poisoned").pop_back();
        let Some(run) = next else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let accepted = load
            .accepted
            .lock()
            .expect("not poisoned")
            .get(&run)
            .copied();
        let mut events = std::pin::pin!(client.watch(run));
        while let Some(e) = events.next().await {
            let Ok(e) = e else { break };
            if e.kind.is_terminal() {
                if let Some(at) = accepted {
                    let lag = at.elapsed().as_secs_f64() * 1000.0;
                    load.watch_lag_ms.lock().expect("not poisoned").push(lag);
                }
                break;
            }
        }
    }
}
