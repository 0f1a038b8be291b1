//! The nemesis: its seeded schedule of faults, and how each is thrown at
//! the worker slots and the services.

use super::{BadInput, Plan, Report};
use crate::{Cluster, Env, Proc};
use pelican_model::ids::RunId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

/// One fault in the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 worker slot `worker`; start it again `down_ms` later.
    Kill {
        /// Worker slot.
        worker: u32,
        /// Down time.
        down_ms: u64,
    },
    /// SIGSTOP worker slot `worker` for `ms` (longer than the lease).
    Pause {
        /// Worker slot.
        worker: u32,
        /// Pause length.
        ms: u64,
    },
    /// kill -9 Redis and start it on its AOF.
    RedisRestart,
    /// kill -9 Redis and start it empty.
    RedisWipe,
    /// Hold back the replica of the job stream's master for `lag_ms`
    /// (what the master acknowledges meanwhile is not replicated), then
    /// kill -9 the master: the replica takes over without those writes,
    /// and the old master rejoins as its replica.
    Failover {
        /// How long the replica is held back.
        lag_ms: u64,
    },
    /// Immediate shutdown of Postgres, and start.
    PgRestart,
    /// XTRIM MINID at a pending ID (`xdel: false`), or XDEL of one pending
    /// entry.
    Trim {
        /// XDEL instead of XTRIM.
        xdel: bool,
    },
    /// Send bad input.
    Bad(BadInput),
    /// XADD a copy of a recent job entry.
    DuplicatePublish,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill { worker, down_ms } => {
                write!(f, "kill -9 worker {worker}, restart after {down_ms} ms")
            }
            Fault::Pause { worker, ms } => write!(f, "SIGSTOP worker {worker} for {ms} ms"),
            Fault::RedisRestart => f.write_str("restart Redis (AOF)"),
            Fault::RedisWipe => f.write_str("wipe Redis"),
            Fault::Failover { lag_ms } => write!(
                f,
                "kill the job stream's master {lag_ms} ms after holding back its replica"
            ),
            Fault::PgRestart => f.write_str("restart Postgres (immediate)"),
            Fault::Trim { xdel: false } => f.write_str("XTRIM MINID at a pending ID"),
            Fault::Trim { xdel: true } => f.write_str("XDEL a pending entry"),
            Fault::Bad(b) => write!(f, "bad input {b:?}"),
            Fault::DuplicatePublish => f.write_str("publish a job entry again"),
        }
    }
}

/// The nemesis's schedule for `plan`: (milliseconds into the fault phase,
/// fault), sorted by time. A pure function of the plan.
#[must_use]
pub fn schedule(plan: &Plan) -> Vec<(u64, Fault)> {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x006e_656d_6573_6973);
    let n = plan.fault_counts();
    let span = u64::from(plan.seconds) * 1000;
    // Faults land between 3% and 92% of the phase: the last stretch lets
    // the final kills' restarts and pauses' resumes happen in the phase.
    let at = |rng: &mut StdRng| rng.random_range(span * 3 / 100..span * 92 / 100);
    let mut out = Vec::new();
    let workers = plan.workers.max(1);
    for _ in 0..n.kills {
        let f = Fault::Kill {
            worker: rng.random_range(0..workers),
            down_ms: rng.random_range(0..1500),
        };
        out.push((at(&mut rng), f));
    }
    for _ in 0..n.pauses {
        let f = Fault::Pause {
            worker: rng.random_range(0..workers),
            ms: rng.random_range(2600..4500),
        };
        out.push((at(&mut rng), f));
    }
    // Service restarts are spread over the phase, one per equal slice, so
    // that each happens under load and they do not bunch up.
    let spread = |count: u32, offset: u64, rng: &mut StdRng| -> Vec<u64> {
        (0..u64::from(count))
            .map(|i| {
                let slice = span * 85 / 100 / u64::from(count);
                span * 5 / 100 + offset + i * slice + rng.random_range(0..slice / 2)
            })
            .collect()
    };
    for t in spread(n.redis_restarts, 0, &mut rng) {
        out.push((t, Fault::RedisRestart));
    }
    for t in spread(n.redis_wipes, span / 4, &mut rng) {
        out.push((t.min(span * 92 / 100), Fault::RedisWipe));
    }
    for t in spread(n.failovers, span / 10, &mut rng) {
        let lag_ms = rng.random_range(0..1000);
        out.push((t.min(span * 92 / 100), Fault::Failover { lag_ms }));
    }
    for t in spread(n.pg_restarts, span / 8, &mut rng) {
        out.push((t.min(span * 92 / 100), Fault::PgRestart));
    }
    for _ in 0..n.trims {
        let f = Fault::Trim {
            xdel: rng.random_bool(0.5),
        };
        out.push((at(&mut rng), f));
    }
    for i in 0..n.bad_inputs {
        let kind = BadInput::ALL[i as usize % BadInput::ALL.len()];
        out.push((at(&mut rng), Fault::Bad(kind)));
    }
    for _ in 0..n.duplicate_publishes {
        out.push((at(&mut rng), Fault::DuplicatePublish));
    }
    out.sort_by_key(|(t, _)| *t);
    out
}

/// A worker slot: its process, if running, and its state.
pub(super) struct Slot {
    pub(super) proc: Option<Proc>,
    pub(super) paused_until: Option<Instant>,
    pub(super) restart_at: Option<Instant>,
}

/// Submits a no-op run under `key`, retried under it until the API names
/// its run (or gives up after 20 tries).
fn submit_probe(agent: &ureq::Agent, base: &str, key: &str) -> Option<RunId> {
    for _ in 0..20 {
        let answer = agent
            .post(format!("{base}/runs"))
            .header("Authorization", format!("Bearer {}", super::TOKEN))
            .header("Idempotency-Key", key)
            .send_json(serde_json::json!({ "kind": "noop", "input": {} }));
        if let Ok(mut resp) = answer
            && matches!(resp.status().as_u16(), 200 | 202)
        {
            let body: Value = resp.body_mut().read_json().ok()?;
            return body["run_id"].as_u64().map(RunId);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Throws one fault.
#[allow(clippy::too_many_arguments)]
pub(super) fn throw(
    fault: &Fault,
    env: &mut Env,
    cluster: &Cluster,
    slots: &mut [Slot],
    agent: &ureq::Agent,
    base: &str,
    report: &mut Report,
    bad_kinds: &mut BTreeSet<BadInput>,
    malformed: &mut Vec<pelican_model::ids::EntryId>,
) {
    let f = &mut report.faults;
    match fault {
        Fault::Kill { worker, down_ms } => {
            // The drawn slot, or the next one that is up, sparing paused
            // ones (their resume is a fault of its own: writes from
            // behind a lost lease) unless every one is paused.
            let n = slots.len();
            let order = || (0..n).map(|k| (*worker as usize + k) % n);
            let up = order()
                .find(|w| slots[*w].proc.is_some() && slots[*w].paused_until.is_none())
                .or_else(|| order().find(|w| slots[*w].proc.is_some()));
            if let Some(w) = up
                && let Some(mut p) = slots[w].proc.take()
            {
                let slot = &mut slots[w];
                p.kill9();
                slot.paused_until = None;
                slot.restart_at = Some(Instant::now() + Duration::from_millis(*down_ms));
                f.kills += 1;
            }
        }
        Fault::Pause { worker, ms } => {
            // The drawn slot, or the next one that is up and running.
            let n = slots.len();
            let running = (0..n)
                .map(|k| (*worker as usize + k) % n)
                .find(|w| slots[*w].proc.is_some() && slots[*w].paused_until.is_none());
            if let Some(w) = running
                && let Some(p) = &slots[w].proc
            {
                p.stop();
                slots[w].paused_until = Some(Instant::now() + Duration::from_millis(*ms));
                f.pauses += 1;
            }
        }
        Fault::RedisRestart => {
            env.redis.restart();
            f.redis_restarts += 1;
        }
        Fault::RedisWipe => {
            env.redis.wipe();
            f.redis_wipes += 1;
            let key = format!("chaos-{}-wipe-{}", report.plan.seed, f.redis_wipes);
            if let Some(run) = submit_probe(agent, base, &key) {
                report.wipe_probes.push(run);
            }
        }
        Fault::Failover { lag_ms } => {
            let key = env.jobs_key();
            env.redis.hold_replica(&key);
            std::thread::sleep(Duration::from_millis(*lag_ms));
            let outage = env.redis.fail_over(&key);
            f.failovers += 1;
            report.failover_ms.push(outage.as_millis() as u64);
        }
        Fault::PgRestart => {
            cluster.restart();
            f.pg_restarts += 1;
        }
        Fault::Trim { xdel } => {
            report.trimmed_entries += env.trim_below_pending(*xdel);
            f.trims += 1;
        }
        Fault::Bad(kind) => {
            f.bad_inputs += 1;
            bad_kinds.insert(*kind);
            if let Some(fields) = kind.entry() {
                if let Some(id) = env.xadd_raw(&fields) {
                    malformed.push(id);
                }
            } else if let Some((method, path, token, body, want)) = kind.request() {
                let url = format!("{base}{path}");
                let mut req = if method == "GET" {
                    let mut r = agent.get(&url);
                    if let Some(t) = token {
                        r = r.header("Authorization", format!("Bearer {t}"));
                    }
                    r.call()
                } else {
                    let mut r = agent.post(&url).header("Content-Type", "application/json");
                    if let Some(t) = token {
                        r = r.header("Authorization", format!("Bearer {t}"));
                    }
                    r.send(body.as_str())
                };
                let (status, json_error) = match req.as_mut() {
                    Ok(r) => (
                        Ok(r.status().as_u16()),
                        r.body_mut()
                            .read_json::<Value>()
                            .is_ok_and(|v| v["error"].is_string()),
                    ),
                    Err(e) => (Err(e.to_string()), false),
                };
                match status {
                    Ok(s) if want.contains(&s) && json_error => {}
                    other => {
                        report.bad_input_mishandled += 1;
                        if report.failures.len() < 50 {
                            report.failures.push(format!(
                                "{kind:?}: {method} {path} answered {other:?} (JSON error body: {json_error}), want one of {want:?}"
                            ));
                        }
                    }
                }
            }
        }
        Fault::DuplicatePublish => {
            if env.publish_again() {
                f.duplicate_publishes += 1;
            }
        }
    }
}
