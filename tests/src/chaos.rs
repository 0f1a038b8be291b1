//! The chaos soak: a real API and real workers against a throwaway Redis
//! (AOF everysec) and a throwaway Postgres cluster, a mixed workload
//! submitted through the HTTP API, and a seeded nemesis that does
//! everything the fault model allows at once: kill -9 of workers (restarted
//! after a while), SIGSTOP past the lease, Redis restarts (AOF replay, up
//! to a second lost), one total Redis wipe, Postgres restarts (immediate
//! shutdown), trims and XDELs below pending IDs, duplicate publications, and
//! bad input of every kind — malformed stream entries and bad API requests.
//!
//! After the fault phase the nemesis heals (resumes paused workers,
//! restarts killed ones) and [`run`] waits for quiescence: every run row in
//! Postgres terminal, the PEL empty, every entry delivered. Then the
//! guarantees are checked on the live state ([`crate::Env::audit`]: S1–S10
//! and every process's protocol trace against the model), and every run's
//! outcome against what its job does.
//!
//! The schedule is a pure function of the [`Plan`] (seed included), printed
//! on failure so that the same faults can be thrown again; the exact
//! interleaving with real processes is, of course, not reproducible.

use crate::{Cluster, Database, Env, Finding, Guarantee, Proc, round};
use pelican_model::ids::RunId;
use pelican_model::invariants;
use pelican_model::status::{ErrorClass, RunStatus};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Runs submitted through the API.
    pub jobs: u32,
    /// Worker processes.
    pub workers: u32,
    /// Length of the fault phase, in seconds (submissions are spread over
    /// it).
    pub seconds: u32,
    /// The nemesis's and the workload's seed.
    pub seed: u64,
    /// Attempts per run (the API's `--attempts-max`).
    pub attempts_max: u32,
    /// How long to wait for quiescence after healing, in seconds.
    pub settle_seconds: u32,
    /// Run every process with this mutant (a `pelican` built with
    /// `mutants`): the soak must then fail.
    pub mutant: Option<String>,
}

impl Default for Plan {
    /// The default soak: 20,000 jobs, 4 workers, 150 s of faults.
    fn default() -> Plan {
        Plan {
            jobs: 20_000,
            workers: 4,
            seconds: 150,
            seed: 1,
            attempts_max: 5,
            settle_seconds: 240,
            mutant: None,
        }
    }
}

impl Plan {
    /// The short soak `cargo xtask test` runs: 2,000 jobs, 3 workers, 35 s
    /// of faults (≥ 20 kills, a Redis restart, a wipe, a Postgres restart,
    /// every kind of bad input).
    #[must_use]
    pub fn short() -> Plan {
        Plan {
            jobs: 2_000,
            workers: 3,
            seconds: 35,
            seed: 7,
            ..Plan::default()
        }
    }

    /// How many faults of each kind the schedule throws.
    #[must_use]
    pub fn fault_counts(&self) -> FaultCounts {
        let s = self.seconds;
        FaultCounts {
            // About one kill every 1.3 s of the fault phase.
            kills: (s * 10).div_ceil(13).max(20),
            pauses: (s / 6).max(2),
            redis_restarts: (s / 45).max(1),
            redis_wipes: 1,
            pg_restarts: (s / 60).max(1),
            trims: (s / 8).max(2),
            // Every kind at least twice.
            bad_inputs: (s * 2).max(2 * BadInput::ALL.len() as u32),
            duplicate_publishes: (s / 2).max(5),
        }
    }
}

/// Fault counts of a schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// kill -9 of a worker.
    pub kills: u32,
    /// SIGSTOP of a worker past its lease.
    pub pauses: u32,
    /// Redis killed and restarted on its AOF.
    pub redis_restarts: u32,
    /// Redis killed and restarted empty.
    pub redis_wipes: u32,
    /// Postgres shut down immediately and restarted.
    pub pg_restarts: u32,
    /// XTRIM MINID / XDEL below pending IDs.
    pub trims: u32,
    /// Bad input sent.
    pub bad_inputs: u32,
    /// An existing job entry published again.
    pub duplicate_publishes: u32,
}

/// One kind of bad input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BadInput {
    /// A stream entry with none of the job fields.
    EntryWithoutFields,
    /// `run_id` not a number.
    EntryNonNumericRun,
    /// `dispatch` missing.
    EntryWithoutDispatch,
    /// A run id Postgres has never seen.
    EntryUnknownRun,
    /// A field the job format does not have.
    EntryExtraField,
    /// A run id beyond 64 bits.
    EntryRunOverflow,
    /// A negative dispatch.
    EntryNegativeDispatch,
    /// Values that are not UTF-8.
    EntryNotUtf8,
    /// Empty values.
    EntryEmptyValues,
    /// `POST /runs` without a token.
    ApiNoToken,
    /// `POST /runs` with the wrong token.
    ApiWrongToken,
    /// A body that is not JSON.
    ApiNotJson,
    /// A body without `kind`.
    ApiNoKind,
    /// A body with a field the API does not know.
    ApiUnknownField,
    /// A kind outside `[a-z0-9_.-]{1,64}`.
    ApiBadKind,
    /// A body over the limit.
    ApiOversized,
    /// `POST /runs/abc/cancel`.
    ApiCancelBadId,
    /// Cancel of a run that does not exist.
    ApiCancelUnknown,
    /// `GET` of a run that does not exist.
    ApiGetUnknown,
    /// `GET /runs/abc`.
    ApiGetBadId,
    /// A route the API does not have.
    ApiNoRoute,
}

impl BadInput {
    /// Every kind.
    pub const ALL: [BadInput; 21] = [
        BadInput::EntryWithoutFields,
        BadInput::EntryNonNumericRun,
        BadInput::EntryWithoutDispatch,
        BadInput::EntryUnknownRun,
        BadInput::EntryExtraField,
        BadInput::EntryRunOverflow,
        BadInput::EntryNegativeDispatch,
        BadInput::EntryNotUtf8,
        BadInput::EntryEmptyValues,
        BadInput::ApiNoToken,
        BadInput::ApiWrongToken,
        BadInput::ApiNotJson,
        BadInput::ApiNoKind,
        BadInput::ApiUnknownField,
        BadInput::ApiBadKind,
        BadInput::ApiOversized,
        BadInput::ApiCancelBadId,
        BadInput::ApiCancelUnknown,
        BadInput::ApiGetUnknown,
        BadInput::ApiGetBadId,
        BadInput::ApiNoRoute,
    ];

    /// The raw fields of a malformed stream entry, or `None` for an API
    /// request.
    fn entry(self) -> Option<Vec<(&'static [u8], Vec<u8>)>> {
        let f = |pairs: &[(&'static str, &[u8])]| {
            pairs
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.to_vec()))
                .collect::<Vec<_>>()
        };
        Some(match self {
            BadInput::EntryWithoutFields => f(&[("garbage", b"1")]),
            BadInput::EntryNonNumericRun => f(&[("run_id", b"not-a-number"), ("dispatch", b"1")]),
            BadInput::EntryWithoutDispatch => f(&[("run_id", b"5")]),
            BadInput::EntryUnknownRun => f(&[("run_id", b"987654321"), ("dispatch", b"1")]),
            BadInput::EntryExtraField => {
                f(&[("run_id", b"1"), ("dispatch", b"1"), ("extra", b"x")])
            }
            BadInput::EntryRunOverflow => {
                f(&[("run_id", b"184467440737095516160000"), ("dispatch", b"1")])
            }
            BadInput::EntryNegativeDispatch => f(&[("run_id", b"1"), ("dispatch", b"-1")]),
            BadInput::EntryNotUtf8 => f(&[("run_id", b"\xff\xfe\x01"), ("dispatch", b"\xc3")]),
            BadInput::EntryEmptyValues => f(&[("run_id", b""), ("dispatch", b"")]),
            _ => return None,
        })
    }

    /// An API request: method, path, token, body, and the statuses that are
    /// a right answer (503 where the answer needs Postgres, which the
    /// nemesis may be restarting).
    fn request(self) -> Option<Request> {
        let ok = Some(TOKEN);
        let post = "POST";
        Some(match self {
            BadInput::ApiNoToken => (
                post,
                "/runs".into(),
                None,
                r#"{"kind":"noop"}"#.into(),
                &[401],
            ),
            BadInput::ApiWrongToken => (
                post,
                "/runs".into(),
                Some("wrong"),
                r#"{"kind":"noop"}"#.into(),
                &[401],
            ),
            BadInput::ApiNotJson => (post, "/runs".into(), ok, "{not json".into(), &[400]),
            BadInput::ApiNoKind => (post, "/runs".into(), ok, r#"{"input":{}}"#.into(), &[422]),
            BadInput::ApiUnknownField => (
                post,
                "/runs".into(),
                ok,
                r#"{"kind":"noop","surprise":1}"#.into(),
                &[422],
            ),
            BadInput::ApiBadKind => (
                post,
                "/runs".into(),
                ok,
                r#"{"kind":"Bad Kind!"}"#.into(),
                &[400],
            ),
            BadInput::ApiOversized => (
                post,
                "/runs".into(),
                ok,
                format!(r#"{{"kind":"noop","input":"{}"}}"#, "x".repeat(10_000)),
                &[413],
            ),
            BadInput::ApiCancelBadId => {
                (post, "/runs/abc/cancel".into(), ok, String::new(), &[400])
            }
            BadInput::ApiCancelUnknown => (
                post,
                "/runs/987654321/cancel".into(),
                ok,
                String::new(),
                &[404, 503],
            ),
            BadInput::ApiGetUnknown => (
                "GET",
                "/runs/987654321".into(),
                None,
                String::new(),
                &[404, 503],
            ),
            BadInput::ApiGetBadId => ("GET", "/runs/abc".into(), None, String::new(), &[400]),
            BadInput::ApiNoRoute => (post, "/nowhere".into(), ok, String::new(), &[404]),
            _ => return None,
        })
    }
}

/// A bad API request: method, path, token, body, the right answers.
type Request = (
    &'static str,
    String,
    Option<&'static str>,
    String,
    &'static [u16],
);

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
        0..400 => ("noop", json!({})),
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
        "fail" | "panic" if times >= u64::from(attempts_max) => RunStatus::Dead,
        _ => RunStatus::Succeeded,
    }
}

/// What the soak did and found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The plan.
    pub plan: Plan,
    /// Runs the API accepted.
    pub jobs: u64,
    /// Submissions answered 5xx or not at all (retried; their runs may
    /// exist).
    pub submit_errors: u64,
    /// Cancels requested.
    pub cancels: u64,
    /// Faults thrown.
    pub faults: FaultCounts,
    /// Distinct kinds of bad input sent.
    pub bad_input_kinds: u32,
    /// Entries removed by the trims.
    pub trimmed_entries: u64,
    /// Accepted runs not terminal (or missing) after the settle phase.
    pub lost: u64,
    /// Side effects applied under more than one key.
    pub duplicate_effects: u64,
    /// Runs whose rows show a write Postgres should have fenced off.
    pub stale_writes_accepted: u64,
    /// Deliveries still pending at the end.
    pub pel_leftover: u64,
    /// Dead runs whose job would have succeeded or failed, with attempts
    /// to spare.
    pub unexpected_dead: u64,
    /// Runs whose outcome is not one their job allows (other than dead).
    pub wrong_outcome: u64,
    /// Runs whose attempts the faults used up (dead, class `exhausted`):
    /// allowed, reported.
    pub exhausted_by_faults: u64,
    /// Bad API requests answered with the wrong status.
    pub bad_input_mishandled: u64,
    /// Run rows nobody submitted.
    pub phantom_runs: u64,
    /// Processes whose protocol trace the model rejects.
    pub trace_violations: u64,
    /// Every other broken guarantee (S6, S10).
    pub other_broken: u64,
    /// Trace files checked.
    pub traces_checked: u64,
    /// Seconds of faults, of settling, and in all.
    pub fault_seconds: f64,
    /// Seconds from healing to quiescence.
    pub settle_seconds: f64,
    /// Wall time of the whole soak.
    pub seconds: f64,
    /// What went wrong, one line each (at most 50 kept).
    pub failures: Vec<String>,
    /// Allowed but worth a look: the attempt history of runs the faults
    /// exhausted (at most 10 kept).
    pub notes: Vec<String>,
    /// Where the process logs and traces are (kept on failure).
    pub logs: String,
}

impl Report {
    /// Whether every loss counter is 0 and nothing else broke.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicate_effects == 0
            && self.stale_writes_accepted == 0
            && self.pel_leftover == 0
            && self.unexpected_dead == 0
            && self.wrong_outcome == 0
            && self.bad_input_mishandled == 0
            && self.phantom_runs == 0
            && self.trace_violations == 0
            && self.other_broken == 0
    }

    /// The JSON summary (`--json`'s last line).
    #[must_use]
    pub fn json(&self) -> Value {
        json!({
            "jobs": self.jobs,
            "kills": self.faults.kills,
            "pauses": self.faults.pauses,
            "redis_restarts": self.faults.redis_restarts,
            "redis_wipes": self.faults.redis_wipes,
            "pg_restarts": self.faults.pg_restarts,
            "trims": self.faults.trims,
            "bad_inputs": self.faults.bad_inputs,
            "bad_input_kinds": self.bad_input_kinds,
            "duplicate_publishes": self.faults.duplicate_publishes,
            "cancels": self.cancels,
            "submit_errors": self.submit_errors,
            "lost": self.lost,
            "duplicate_effects": self.duplicate_effects,
            "stale_writes_accepted": self.stale_writes_accepted,
            "pel_leftover": self.pel_leftover,
            "unexpected_dead": self.unexpected_dead,
            "wrong_outcome": self.wrong_outcome,
            "exhausted_by_faults": self.exhausted_by_faults,
            "bad_input_mishandled": self.bad_input_mishandled,
            "phantom_runs": self.phantom_runs,
            "trace_violations": self.trace_violations,
            "traces_checked": self.traces_checked,
            "seed": self.plan.seed,
            "workers": self.plan.workers,
            "settle_seconds": round(self.settle_seconds, 1),
            "seconds": round(self.seconds, 1),
            "passed": self.passed(),
        })
    }

    /// A table for people.
    #[must_use]
    pub fn table(&self) -> String {
        let f = &self.faults;
        let rows: Vec<(&str, String)> = vec![
            ("jobs accepted", self.jobs.to_string()),
            ("submissions retried", self.submit_errors.to_string()),
            ("cancels", self.cancels.to_string()),
            ("workers killed (-9)", f.kills.to_string()),
            ("workers paused past lease", f.pauses.to_string()),
            ("Redis restarts", f.redis_restarts.to_string()),
            ("Redis wipes", f.redis_wipes.to_string()),
            ("Postgres restarts", f.pg_restarts.to_string()),
            (
                "trims below pending",
                format!("{} ({} entries)", f.trims, self.trimmed_entries),
            ),
            (
                "bad inputs",
                format!("{} ({} kinds)", f.bad_inputs, self.bad_input_kinds),
            ),
            ("duplicate publishes", f.duplicate_publishes.to_string()),
            ("exhausted by faults", self.exhausted_by_faults.to_string()),
            ("traces checked", self.traces_checked.to_string()),
            ("lost runs", self.lost.to_string()),
            ("duplicate effects", self.duplicate_effects.to_string()),
            (
                "stale writes accepted",
                self.stale_writes_accepted.to_string(),
            ),
            ("PEL leftovers", self.pel_leftover.to_string()),
            ("unexpected dead letters", self.unexpected_dead.to_string()),
            ("wrong outcomes", self.wrong_outcome.to_string()),
            (
                "bad inputs mishandled",
                self.bad_input_mishandled.to_string(),
            ),
            ("phantom runs", self.phantom_runs.to_string()),
            ("trace violations", self.trace_violations.to_string()),
            ("other guarantees broken", self.other_broken.to_string()),
            (
                "time",
                format!(
                    "{:.1} s faults + {:.1} s to quiescence = {:.1} s",
                    self.fault_seconds, self.settle_seconds, self.seconds
                ),
            ),
        ];
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("  {k:<28} {v}\n"));
        }
        out
    }
}

/// The API's bearer token in the soak.
const TOKEN: &str = "chaos";

/// Progress reported while the soak runs.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// "faults" or "settling".
    pub phase: &'static str,
    /// Milliseconds into the phase.
    pub elapsed_ms: u64,
    /// Runs accepted so far.
    pub jobs: u64,
    /// Faults thrown so far.
    pub faults: u64,
    /// Runs not terminal yet (settling only).
    pub open: u64,
}

/// What the submitters share with the nemesis.
#[derive(Default)]
struct Shared {
    /// Accepted runs and their cancel requests.
    accepted: Mutex<Vec<RunId>>,
    cancel_requested: Mutex<BTreeSet<RunId>>,
    submit_errors: AtomicU64,
    accepted_n: AtomicU64,
    stop: AtomicBool,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// Submits jobs `lane, lane + lanes, …` through the API on their pace, and
/// cancels the ones the workload cancels.
fn submitter(plan: &Plan, base: &str, lane: u32, lanes: u32, shared: &Shared, started: Instant) {
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
            .send_json(&body);
        let accepted = match answer {
            Ok(mut resp) if resp.status().as_u16() == 202 => resp
                .body_mut()
                .read_json::<Value>()
                .ok()
                .and_then(|v| v["run_id"].as_u64())
                .map(RunId),
            _ => None,
        };
        let Some(run) = accepted else {
            // Postgres restarting, or the answer lost: the run may or may
            // not exist; a client retries (a new run).
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

/// A worker slot: its process, if running, and its state.
struct Slot {
    proc: Option<Proc>,
    paused_until: Option<Instant>,
    restart_at: Option<Instant>,
}

const WORKER_FLAGS: &[&str] = &["--in-flight-max", "32"];

/// Runs the soak described by `plan`, reporting progress to `progress`.
///
/// # Panics
/// When a service cannot be started at all (no `redis-server`, no
/// `initdb`, no `PELICAN_BIN`): the report is for the system under test.
pub fn run(plan: &Plan, progress: &dyn Fn(&Progress)) -> Report {
    let started = Instant::now();
    let cluster = Cluster::start();
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), plan.mutant.as_deref());
    env.settle_timeout = Duration::from_secs(u64::from(plan.settle_seconds));
    let (_api, base) = env.api_with(TOKEN, plan.attempts_max);
    let mut slots: Vec<Slot> = (0..plan.workers)
        .map(|w| Slot {
            proc: Some(env.worker(w + 1, None, WORKER_FLAGS)),
            paused_until: None,
            restart_at: None,
        })
        .collect();
    let shared = Arc::new(Shared::default());
    let phase_start = Instant::now();
    let lanes = 3;
    let submitters: Vec<_> = (0..lanes)
        .map(|lane| {
            let (plan, base, shared) = (plan.clone(), base.clone(), Arc::clone(&shared));
            std::thread::spawn(move || submitter(&plan, &base, lane, lanes, &shared, phase_start))
        })
        .collect();

    let mut report = Report {
        plan: plan.clone(),
        logs: env.logs.display().to_string(),
        ..Report::default()
    };
    let mut bad_kinds = BTreeSet::new();
    let mut malformed = Vec::new();
    let agent = agent();
    let faults = schedule(plan);
    let mut next = 0;
    let span = Duration::from_secs(u64::from(plan.seconds));
    let mut thrown = 0u64;
    loop {
        let now = Instant::now();
        let t = now.duration_since(phase_start);
        // Resumes and restarts that are due.
        for (w, slot) in slots.iter_mut().enumerate() {
            if slot.paused_until.is_some_and(|u| u <= now) {
                slot.paused_until = None;
                if let Some(p) = &slot.proc {
                    p.cont();
                }
            }
            if slot.restart_at.is_some_and(|u| u <= now) {
                slot.restart_at = None;
                slot.proc = Some(env.worker(w as u32 + 1, None, WORKER_FLAGS));
            }
        }
        while next < faults.len() && Duration::from_millis(faults[next].0) <= t {
            let fault = faults[next].1.clone();
            next += 1;
            thrown += 1;
            throw(
                &fault,
                &mut env,
                &cluster,
                &mut slots,
                &agent,
                &base,
                &mut report,
                &mut bad_kinds,
                &mut malformed,
            );
        }
        let submitting = submitters.iter().any(|s| !s.is_finished());
        if t >= span && next >= faults.len() && !submitting {
            break;
        }
        if t >= span + Duration::from_secs(600) {
            report
                .failures
                .push("submissions did not finish within 10 minutes of the fault phase".into());
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        progress(&Progress {
            phase: "faults",
            elapsed_ms: t.as_millis() as u64,
            jobs: shared.accepted_n.load(Ordering::Relaxed),
            faults: thrown,
            open: 0,
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in submitters {
        let _ = s.join();
    }
    report.fault_seconds = phase_start.elapsed().as_secs_f64();
    // Heal: every worker running and resumed.
    for (w, slot) in slots.iter_mut().enumerate() {
        if slot.paused_until.take().is_some()
            && let Some(p) = &slot.proc
        {
            p.cont();
        }
        if slot.proc.is_none() {
            slot.restart_at = None;
            slot.proc = Some(env.worker(w as u32 + 1, None, WORKER_FLAGS));
        }
    }
    let accepted: Vec<RunId> = shared.accepted.lock().expect("not poisoned").clone();
    let cancel_requested = shared
        .cancel_requested
        .lock()
        .expect("not poisoned")
        .clone();
    report.jobs = accepted.len() as u64;
    report.cancels = cancel_requested.len() as u64;
    report.submit_errors = shared.submit_errors.load(Ordering::Relaxed);
    report.bad_input_kinds = bad_kinds.len() as u32;

    // Settle: every row terminal, the PEL empty, every entry delivered.
    let settle_start = Instant::now();
    let settle_timeout = Duration::from_secs(u64::from(plan.settle_seconds));
    let mut last_open;
    loop {
        let db = env.db();
        last_open = db.runs.values().filter(|r| !r.status.is_terminal()).count() as u64;
        let done = last_open == 0 && env.pel_len() == 0 && !env.undelivered();
        if done || settle_start.elapsed() > settle_timeout {
            break;
        }
        progress(&Progress {
            phase: "settling",
            elapsed_ms: settle_start.elapsed().as_millis() as u64,
            jobs: report.jobs,
            faults: thrown,
            open: last_open,
        });
        std::thread::sleep(Duration::from_millis(250));
    }
    report.settle_seconds = settle_start.elapsed().as_secs_f64();
    if last_open > 0 {
        report.failures.push(format!(
            "not quiescent within {} s: {last_open} runs not terminal",
            plan.settle_seconds
        ));
    }

    // The final check.
    for run in &accepted {
        env.accepted.insert(*run);
    }
    let db = env.db();
    for (run, r) in &db.runs {
        env.effects
            .insert(*run, pelican_real::jobs::effects_of(&r.kind, &r.input));
    }
    // Malformed entries that are still in the stream must be quarantined
    // (trims and the wipe may have removed some first).
    let present = env.present(&malformed);
    let found = env.audit(&present);
    report.traces_checked = env.traces.iter().filter(|t| t.exists()).count() as u64;
    report.pel_leftover = env.pel_len();
    let note = |report: &mut Report, line: String| {
        if report.failures.len() < 50 {
            report.failures.push(line);
        }
    };
    for finding in &found {
        match finding {
            Finding::Broken(b) => match b.guarantee {
                // Counted (and noted) below from the rows, for runs the API
                // never acknowledged too.
                Guarantee::S1 => continue,
                Guarantee::S2 | Guarantee::S3 => report.stale_writes_accepted += 1,
                // Counted elsewhere: duplicate effect keys below, the PEL's
                // leftovers above.
                Guarantee::S5 | Guarantee::S9 => {}
                Guarantee::S4 | Guarantee::S6 | Guarantee::S7 | Guarantee::S8 | Guarantee::S10 => {
                    report.other_broken += 1;
                }
            },
            Finding::Nonconforming(_) => report.trace_violations += 1,
        }
        note(&mut report, finding.to_string());
    }
    let accepted_set: BTreeSet<RunId> = accepted.iter().copied().collect();
    for run in &accepted_set {
        if !db.runs.contains_key(run) {
            report.lost += 1;
            note(
                &mut report,
                format!("lost: {run} was accepted but has no row"),
            );
        }
    }
    let mut outcomes: BTreeMap<RunStatus, u64> = BTreeMap::new();
    for (run, r) in &db.runs {
        *outcomes.entry(r.status).or_default() += 1;
        if !r.status.is_terminal() {
            report.lost += 1;
            note(
                &mut report,
                format!("lost: {run} ({} {}) is {}", r.kind, r.input, r.status),
            );
            continue;
        }
        if r.status == RunStatus::Succeeded {
            for call in 0..pelican_real::jobs::effects_of(&r.kind, &r.input) {
                if invariants::effect_keys(&db, *run, call).len() > 1 {
                    report.duplicate_effects += 1;
                }
            }
        }
        let designed = designed_outcome(&r.kind, &r.input, r.attempts_max);
        let cancelled_ok = r.status == RunStatus::Cancelled && cancel_requested.contains(run);
        let exhausted = r.status == RunStatus::Dead
            && r.error
                .as_ref()
                .is_some_and(|(c, _)| *c == ErrorClass::Exhausted)
            && r.attempts >= r.attempts_max;
        if r.status == designed || cancelled_ok {
            continue;
        }
        if exhausted {
            report.exhausted_by_faults += 1;
            if report.notes.len() < 10 {
                let history: Vec<String> = db
                    .read_attempts(*run)
                    .iter()
                    .map(|(n, a)| format!("#{} {} {:?}", n.0, a.worker, a.outcome))
                    .collect();
                report.notes.push(format!(
                    "{run} ({} {}) exhausted by faults: {}",
                    r.kind,
                    r.input,
                    history.join(", ")
                ));
            }
            continue;
        }
        let line = format!(
            "{run} ({} {}) ended {} ({:?}) after {} attempts; its job makes it {designed}",
            r.kind, r.input, r.status, r.error, r.attempts
        );
        if r.status == RunStatus::Dead {
            report.unexpected_dead += 1;
        } else {
            report.wrong_outcome += 1;
        }
        note(&mut report, line);
    }
    let phantom = db.runs.keys().filter(|r| !accepted_set.contains(r)).count() as u64;
    report.phantom_runs = phantom.saturating_sub(report.submit_errors);
    if report.phantom_runs > 0 {
        let line = format!(
            "{phantom} runs nobody was told were accepted, but only {} submissions failed",
            report.submit_errors
        );
        note(&mut report, line);
    }
    report.seconds = started.elapsed().as_secs_f64();
    if !report.passed() {
        env.keep_logs = true;
    }
    drop(slots);
    drop(env);
    drop(cluster);
    report
}

/// Throws one fault.
#[allow(clippy::too_many_arguments)]
fn throw(
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
                    agent.get(&url).call()
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

/// Runs the soak and prints what it did; `Err` with the report when it
/// failed (after printing the seed and the schedule).
///
/// # Errors
/// When any loss counter is not 0 or any other check failed.
pub fn run_and_print(plan: &Plan, quiet: bool) -> Result<Report, Box<Report>> {
    use indicatif::{ProgressBar, ProgressStyle};
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(u64::from(plan.seconds) * 1000)
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:30}] {elapsed:>4} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let n = plan.fault_counts();
    eprintln!(
        "chaos: seed {}, {} jobs, {} workers, {} s of faults: {} kills, {} pauses, {} Redis restarts, {} wipe, {} Postgres restarts, {} trims, {} bad inputs, {} duplicate publishes",
        plan.seed,
        plan.jobs,
        plan.workers,
        plan.seconds,
        n.kills,
        n.pauses,
        n.redis_restarts,
        n.redis_wipes,
        n.pg_restarts,
        n.trims,
        n.bad_inputs,
        n.duplicate_publishes
    );
    let report = run(plan, &|p| {
        bar.set_prefix(p.phase);
        if p.phase == "faults" {
            bar.set_position(p.elapsed_ms);
            bar.set_message(format!("{} jobs accepted, {} faults", p.jobs, p.faults));
        } else {
            bar.set_message(format!("{} runs still open", p.open));
        }
    });
    bar.finish_and_clear();
    eprint!("{}", report.table());
    for n in &report.notes {
        eprintln!("  note: {n}");
    }
    if report.passed() {
        eprintln!("chaos: PASSED (seed {})", plan.seed);
        Ok(report)
    } else {
        eprintln!("chaos: FAILED (seed {})", plan.seed);
        for f in &report.failures {
            eprintln!("  {f}");
        }
        eprintln!(
            "the schedule of seed {} (milliseconds into the fault phase):",
            plan.seed
        );
        for (t, fault) in schedule(plan) {
            eprintln!("  {t:>7} {fault}");
        }
        eprintln!(
            "re-run: cargo xtask chaos --jobs {} --workers {} --seconds {} --seed {}{}",
            plan.jobs,
            plan.workers,
            plan.seconds,
            plan.seed,
            plan.mutant
                .as_deref()
                .map(|m| format!(" --mutant {m}"))
                .unwrap_or_default()
        );
        eprintln!("process logs and traces: {}", report.logs);
        Err(Box::new(report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_a_function_of_the_plan_and_has_the_counts() {
        for plan in [Plan::default(), Plan::short()] {
            let s = schedule(&plan);
            assert_eq!(s, schedule(&plan));
            let n = plan.fault_counts();
            let count = |p: fn(&Fault) -> bool| s.iter().filter(|(_, f)| p(f)).count() as u32;
            assert_eq!(count(|f| matches!(f, Fault::Kill { .. })), n.kills);
            assert_eq!(
                count(|f| matches!(f, Fault::RedisRestart)),
                n.redis_restarts
            );
            assert_eq!(count(|f| matches!(f, Fault::RedisWipe)), 1);
            assert_eq!(count(|f| matches!(f, Fault::PgRestart)), n.pg_restarts);
            let kinds: BTreeSet<_> = s
                .iter()
                .filter_map(|(_, f)| match f {
                    Fault::Bad(b) => Some(*b),
                    _ => None,
                })
                .collect();
            assert_eq!(kinds.len(), BadInput::ALL.len());
            assert!(s.iter().all(|(t, _)| *t < u64::from(plan.seconds) * 1000));
            assert_ne!(
                schedule(&Plan {
                    seed: 2,
                    ..plan.clone()
                }),
                s
            );
        }
        let d = Plan::default().fault_counts();
        assert!(d.kills >= 100 && d.redis_restarts >= 3, "{d:?}");
        let s = Plan::short().fault_counts();
        assert!(
            s.kills >= 20 && s.redis_restarts >= 1 && s.pg_restarts >= 1,
            "{s:?}"
        );
    }

    #[test]
    fn designed_outcomes() {
        assert_eq!(designed_outcome("noop", "{}", 5), RunStatus::Succeeded);
        let fail = |class: &str, times: u32| format!(r#"{{"class":"{class}","times":{times}}}"#);
        assert_eq!(
            designed_outcome("fail", &fail("retryable", 2), 5),
            RunStatus::Succeeded
        );
        assert_eq!(
            designed_outcome("fail", &fail("retryable", 99), 5),
            RunStatus::Dead
        );
        assert_eq!(
            designed_outcome("fail", &fail("terminal", 99), 5),
            RunStatus::Failed
        );
        assert_eq!(
            designed_outcome("panic", r#"{"times":99}"#, 5),
            RunStatus::Dead
        );
        assert_eq!(
            designed_outcome("panic", r#"{"times":1}"#, 5),
            RunStatus::Succeeded
        );
        // Every job of the workload is one of these.
        let plan = Plan::short();
        let kinds: BTreeSet<&str> = (0..plan.jobs).map(|i| job(&plan, i).kind).collect();
        assert_eq!(
            kinds,
            ["effect", "fail", "noop", "panic", "sleep"]
                .into_iter()
                .collect()
        );
        assert!((0..plan.jobs).any(|i| job(&plan, i).cancel_after_ms.is_some()));
    }

    #[test]
    fn every_bad_input_is_an_entry_or_a_request() {
        for b in BadInput::ALL {
            assert!(b.entry().is_some() != b.request().is_some(), "{b:?}");
        }
    }
}
