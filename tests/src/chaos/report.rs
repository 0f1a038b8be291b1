//! What a soak did and found: the [`Report`], and the final verdict on the
//! live state that fills it.

use super::{FaultCounts, Plan, designed_outcome};
use crate::{Env, Finding, Guarantee, round};
use pelican_model::ids::{EntryId, RunId};
use pelican_model::invariants;
use pelican_model::status::{ErrorClass, RunStatus};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

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
    /// Run rows no client was told about: every submission is retried
    /// under its idempotency key until the API names its run, so none.
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
    /// Runs submitted right after each Redis wipe.
    pub wipe_probes: Vec<RunId>,
    /// How long each master failover left the job stream's slot without
    /// a master, ms.
    pub failover_ms: Vec<u64>,
    /// The slowest of them, from its publication to its outcome (both by
    /// Postgres's clock), ms: how soon runs published after a wipe are
    /// delivered (the recreated group reads them; the sweeper's grace is
    /// not waited for).
    pub wipe_delivery_ms: Option<u64>,
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
            "failovers": self.faults.failovers,
            "failover_ms": self.failover_ms,
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
            "wipe_delivery_ms": self.wipe_delivery_ms,
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
            (
                "Redis wipes",
                match self.wipe_delivery_ms {
                    Some(ms) => format!(
                        "{} (a run published after it ran {ms} ms later)",
                        f.redis_wipes
                    ),
                    None => f.redis_wipes.to_string(),
                },
            ),
            (
                "master failovers",
                match self.failover_ms.iter().max() {
                    Some(ms) => {
                        format!("{} (the slot had no master for up to {ms} ms)", f.failovers)
                    }
                    None => f.failovers.to_string(),
                },
            ),
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

/// The final check, counted into `report`: the guarantees on the live state
/// ([`Env::audit`]), and every run's outcome against what its job does (runs
/// lost, phantom, dead or ended otherwise than designed).
pub(super) fn verdict(
    env: &mut Env,
    report: &mut Report,
    accepted: &[RunId],
    cancel_requested: &BTreeSet<RunId>,
    malformed: &[EntryId],
) {
    for run in accepted {
        env.accepted.insert(*run);
    }
    let db = env.db();
    report.wipe_delivery_ms = report
        .wipe_probes
        .iter()
        .filter_map(|run| {
            let r = db.runs.get(run)?;
            Some(r.finished_at?.0.saturating_sub(r.published_at?.0))
        })
        .max();
    for (run, r) in &db.runs {
        env.effects
            .insert(*run, pelican_real::jobs::effects_of(&r.kind, &r.input));
    }
    // Malformed entries that are still in the stream must be quarantined
    // (trims and the wipe may have removed some first).
    let present = env.present(malformed);
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
                Guarantee::S4
                | Guarantee::S6
                | Guarantee::S7
                | Guarantee::S8
                | Guarantee::S10
                | Guarantee::S11
                | Guarantee::S12
                | Guarantee::S13
                | Guarantee::S14
                | Guarantee::S15
                | Guarantee::S16 => {
                    report.other_broken += 1;
                }
            },
            Finding::Nonconforming(_) => report.trace_violations += 1,
        }
        note(report, finding.to_string());
    }
    let accepted_set: BTreeSet<RunId> = accepted.iter().copied().collect();
    for run in &accepted_set {
        if !db.runs.contains_key(run) {
            report.lost += 1;
            note(report, format!("lost: {run} was accepted but has no row"));
        }
    }
    let mut outcomes: BTreeMap<RunStatus, u64> = BTreeMap::new();
    for (run, r) in &db.runs {
        *outcomes.entry(r.status).or_default() += 1;
        if !r.status.is_terminal() {
            report.lost += 1;
            note(
                report,
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
        note(report, line);
    }
    let phantom: Vec<RunId> = db
        .runs
        .keys()
        .filter(|r| !accepted_set.contains(r))
        .copied()
        .collect();
    report.phantom_runs = phantom.len() as u64;
    if !phantom.is_empty() {
        let line = format!(
            "{} runs no client was told about (a keyed retry made a second run?): {:?}",
            phantom.len(),
            &phantom[..phantom.len().min(10)]
        );
        note(report, line);
    }
}
