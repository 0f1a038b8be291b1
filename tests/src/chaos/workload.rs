//! The workload: the seeded jobs, what each may end as, and the
//! submitters that send them through the API.

use super::{Plan, TOKEN};
use pelican_model::ids::RunId;
use pelican_model::status::RunStatus;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One job of the workload: what it is and what may become of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Its kind.
    pub kind: &'static str,
    /// Its input (JSON).
    pub input: Value,
    /// Cancel it this long after it was accepted.
    pub cancel_after_ms: Option<u64>,
}

/// The `i`th job of the workload (a pure function of the seed).
#[must_use]
pub fn job(plan: &Plan, i: u32) -> Job {
    let mut rng =
        StdRng::seed_from_u64(plan.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(i));
    let roll = rng.random_range(0..1000);
    let mut cancel_after_ms = None;
    let (kind, input) = match roll {
        0..390 => ("noop", json!({})),
        // A result Postgres refuses: the run fails alone, as unstorable.
        390..400 => ("echo", json!({ "text": "poison\u{0}" })),
        400..550 => ("sleep", json!({ "ms": rng.random_range(5..400) })),
        // Longer than the lease: kept alive by heartbeats.
        550..580 => ("sleep", json!({ "ms": rng.random_range(2200..3500) })),
        580..730 => ("effect", json!({ "calls": rng.random_range(1..=4) })),
        730..810 => (
            "fail",
            json!({ "class": "retryable", "times": rng.random_range(1..=2) }),
        ),
        810..840 => ("fail", json!({ "class": "retryable", "times": 99 })),
        840..880 => ("fail", json!({ "class": "terminal", "times": 99 })),
        880..920 => ("panic", json!({ "times": 1 })),
        920..930 => ("panic", json!({ "times": 99 })),
        _ => {
            cancel_after_ms = Some(rng.random_range(0..2500));
            ("sleep", json!({ "ms": rng.random_range(1000..3000) }))
        }
    };
    Job {
        kind,
        input,
        cancel_after_ms,
    }
}

/// The outcomes a run of `kind`/`input` may end with when nothing but its
/// own job decides: the fault model may also exhaust its attempts
/// (`Dead`, class `exhausted`) and a requested cancel may win.
#[must_use]
pub fn designed_outcome(kind: &str, input: &str, attempts_max: u32) -> RunStatus {
    let v: Value = serde_json::from_str(input).unwrap_or(Value::Null);
    let times = v["times"].as_u64().unwrap_or(0);
    match kind {
        "fail" if v["class"] == "terminal" => RunStatus::Failed,
        "echo" if v["text"].as_str().is_some_and(|t| t.contains('\0')) => RunStatus::Failed,
        "fail" | "panic" if times >= u64::from(attempts_max) => RunStatus::Dead,
        _ => RunStatus::Succeeded,
    }
}

/// What the submitters share with the nemesis.
#[derive(Default)]
pub(super) struct Shared {
    /// Accepted runs and their cancel requests.
    pub(super) accepted: Mutex<Vec<RunId>>,
    pub(super) cancel_requested: Mutex<BTreeSet<RunId>>,
    pub(super) submit_errors: AtomicU64,
    pub(super) accepted_n: AtomicU64,
    pub(super) stop: AtomicBool,
}

pub(super) use crate::agent;

/// Submits jobs `lane, lane + lanes, …` through the API on their pace, and
/// cancels the ones the workload cancels. Job `i` goes out under the
/// idempotency key `chaos-<seed>-<i>`, and is retried under it until the
/// API names its run: a retry never makes a second run.
pub(super) fn submitter(
    plan: &Plan,
    base: &str,
    lane: u32,
    lanes: u32,
    shared: &Shared,
    started: Instant,
) {
    let agent = agent();
    let pace_ms = f64::from(plan.seconds) * 1000.0 * 0.85 / f64::from(plan.jobs.max(1));
    let mut cancels: Vec<(Instant, RunId)> = Vec::new();
    let cancel = |run: RunId| {
        for _ in 0..20 {
            let r = agent
                .post(format!("{base}/runs/{}/cancel", run.0))
                .header("Authorization", format!("Bearer {TOKEN}"))
                .send_empty();
            match r.map(|r| r.status().as_u16()) {
                Ok(200 | 202 | 409) => return,
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    };
    let mut i = lane;
    while i < plan.jobs && !shared.stop.load(Ordering::Relaxed) {
        let due = started + Duration::from_secs_f64(f64::from(i) * pace_ms / 1000.0);
        while let Some(pos) = cancels.iter().position(|(at, _)| *at <= Instant::now()) {
            let (_, run) = cancels.swap_remove(pos);
            cancel(run);
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait.min(Duration::from_millis(50)));
            continue;
        }
        let j = job(plan, i);
        let body = json!({ "kind": j.kind, "input": j.input });
        let answer = agent
            .post(format!("{base}/runs"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Idempotency-Key", format!("chaos-{}-{i}", plan.seed))
            .send_json(&body);
        let accepted = match answer {
            // 202: stored now; 200: stored by an earlier try of this key.
            Ok(mut resp) if matches!(resp.status().as_u16(), 200 | 202) => resp
                .body_mut()
                .read_json::<Value>()
                .ok()
                .and_then(|v| v["run_id"].as_u64())
                .map(RunId),
            _ => None,
        };
        let Some(run) = accepted else {
            // Postgres restarting, or the answer lost: the run may or may
            // not exist; the retry under the same key finds out.
            shared.submit_errors.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        shared.accepted.lock().expect("not poisoned").push(run);
        shared.accepted_n.fetch_add(1, Ordering::Relaxed);
        if let Some(ms) = j.cancel_after_ms {
            shared
                .cancel_requested
                .lock()
                .expect("not poisoned")
                .insert(run);
            cancels.push((Instant::now() + Duration::from_millis(ms), run));
        }
        i += lanes;
    }
    cancels.sort_by_key(|(at, _)| *at);
    for (at, run) in cancels {
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        cancel(run);
    }
}
