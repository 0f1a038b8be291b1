//! The end-of-test audit: the guarantees on the live state and the
//! processes' protocol traces, as a list of [`Finding`]s.

use crate::{Broken, Env, Guarantee};
use pelican_model::Db;
use pelican_model::ids::{EntryId, RunId};
use pelican_model::invariants;
use pelican_model::protocol::Policy;
use pelican_model::world::World;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What [`Env::audit`] finds wrong on a live state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A guarantee was broken.
    Broken(Broken),
    /// A process's protocol trace does not conform to the model.
    Nonconforming(String),
}

/// "S1 run-3 is stuck queued (dispatch 1)", "trace ... does not conform".
impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Broken(b) => b.fmt(f),
            Finding::Nonconforming(detail) => write!(f, "trace {detail}"),
        }
    }
}

impl Env {
    /// The guarantees on the final state (after [`Env::settle`]), as a list
    /// of what is wrong (empty when everything holds): the state guarantees
    /// ([`invariants::state`]: S6 and the like); S1 every accepted run
    /// terminal ([`invariants::terminal_row`]); what every level checks of
    /// the final database ([`invariants::outcomes`]: S2 a succeeded run has
    /// exactly one succeeded attempt, S3 no stale write left its mark in the
    /// rows, S5 each side effect of a succeeded run requested under one key,
    /// S6 attempts within bounds and dead runs exactly those with dead
    /// letters); S9 the PEL empty; S3 no stale write in the processes'
    /// traces ([`stale_writes_in_traces`]); S10 each entry in `malformed`
    /// quarantined on the dead-letter stream; and every process's protocol
    /// trace conforms to the model.
    #[must_use]
    pub fn audit(&self, malformed: &[EntryId]) -> Vec<Finding> {
        let world = World {
            db: self.db().into(),
            accepted: self.accepted.clone(),
            ..World::default()
        };
        let db = &world.db;
        let policy = Policy {
            attempts_max: u32::MAX,
            unknown_retries_max: self.unknown_retries_max,
            ..Policy::default()
        };
        let effects = |run: RunId| self.effects.get(&run).copied().unwrap_or(0);
        let mut broken = invariants::state(&world, &policy);
        broken.extend(
            self.accepted
                .iter()
                .filter_map(|run| invariants::terminal_row(db, *run).err()),
        );
        broken.extend(invariants::outcomes(db, &effects));
        let pel = self.pel_len();
        if pel != 0 {
            broken.push(Broken {
                guarantee: Guarantee::S9,
                detail: format!("{pel} deliveries left pending"),
            });
        }
        // A process that had not started yet wrote no trace.
        let traces: Vec<PathBuf> = self.traces.iter().filter(|t| t.exists()).cloned().collect();
        for detail in stale_writes_in_traces(&traces) {
            broken.push(Broken {
                guarantee: Guarantee::S3,
                detail,
            });
        }
        let quarantined = self.quarantined();
        for id in malformed {
            if !quarantined.contains(id) {
                broken.push(Broken {
                    guarantee: Guarantee::S10,
                    detail: format!("malformed entry {id} was not quarantined"),
                });
            }
        }
        let mut found: Vec<Finding> = broken.into_iter().map(Finding::Broken).collect();
        for t in &traces {
            if let Err(r) = pelican_real::trace::check_file(t) {
                found.push(Finding::Nonconforming(format!(
                    "{} does not conform: {r}",
                    t.display()
                )));
            }
        }
        found
    }

    /// [`Env::audit`], asserted: the end of every live scenario.
    ///
    /// # Panics
    /// Listing every guarantee broken, with the process logs.
    pub fn check(&self, malformed: &[EntryId]) -> Db {
        let found = self.audit(malformed);
        assert!(
            found.is_empty(),
            "guarantees broken:\n  {}\nlogs: {:?}",
            found
                .iter()
                .map(Finding::to_string)
                .collect::<Vec<_>>()
                .join("\n  "),
            self.procs
        );
        self.db()
    }
}

/// Stale writes Postgres accepted, read off the processes' protocol traces:
/// a fenced write (any database command carrying a fence) answered with
/// rows changed, sent by a role whose own claim had fence `f`, after some
/// role had already received the claim of the same run with a fence above
/// `f`. Sound on one host: a role sends a command only after the input
/// received before it, whose time the trace records, so the write left
/// after the newer claim had committed, and a fenced database must have
/// refused it. (With one wall clock for all processes; the comparison is
/// strict, in milliseconds, after each trace's times are moved back by
/// its process's clock shift, from its header.)
#[must_use]
pub fn stale_writes_in_traces(paths: &[PathBuf]) -> Vec<String> {
    use serde_json::Value;
    #[derive(Default)]
    struct Role {
        last_now: u64,
        own_fence: Option<u64>,
        // A fenced write waiting for its answer: (run, fence, sent after).
        pending_write: Option<(u64, u64, u64, String)>,
        claiming: Option<u64>,
    }
    // run -> [(fence, received at)]
    let mut claims: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    // (run, own fence, sent after, what)
    let mut writes: Vec<(u64, u64, u64, String)> = Vec::new();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let mut roles: BTreeMap<String, Role> = BTreeMap::new();
        let mut offset: i64 = 0;
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(header) = v.get("header") {
                offset = header["clock_offset_ms"].as_i64().unwrap_or(0);
            } else if let Some(sent) = v.get("sent") {
                let role = roles.entry(sent["role"].to_string()).or_default();
                let Some(db) = sent["command"].get("Db").and_then(Value::as_object) else {
                    continue;
                };
                for (op, args) in db {
                    let run = args["run"].as_u64();
                    if op == "Claim" {
                        role.claiming = run;
                    } else if let (Some(run), Some(fence)) = (run, args["fence"].as_u64()) {
                        let own = role.own_fence.unwrap_or(fence);
                        role.pending_write =
                            Some((run, own, role.last_now, format!("{op} {args}")));
                    }
                }
            } else if let Some(recv) = v.get("received") {
                let role = roles.entry(recv["role"].to_string()).or_default();
                let now = recv["now"]
                    .as_u64()
                    .map_or(role.last_now, |t| t.saturating_add_signed(-offset));
                role.last_now = now;
                let db = recv["input"].get("Db");
                if let Some(run) = role.claiming.take()
                    && let Some(fence) = db
                        .and_then(|d| d.get("Claimed"))
                        .and_then(|c| c["claimed"]["fence"].as_u64())
                {
                    role.own_fence = Some(fence);
                    claims.entry(run).or_default().push((fence, now));
                }
                if let Some(w) = role.pending_write.take()
                    && db
                        .and_then(|d| d.get("Rows"))
                        .and_then(Value::as_u64)
                        .is_some_and(|n| n > 0)
                {
                    writes.push(w);
                }
            }
        }
    }
    writes
        .into_iter()
        .filter_map(|(run, fence, sent_after, what)| {
            let newer = claims
                .get(&run)?
                .iter()
                .find(|(g, at)| *g > fence && *at < sent_after)?;
            Some(format!(
                "run {run}: {what} by the holder of fence {fence} was accepted, sent after {sent_after} ms, when fence {} had been claimed at {} ms",
                newer.0, newer.1
            ))
        })
        .collect()
}
