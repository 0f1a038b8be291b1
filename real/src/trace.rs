//! Protocol traces: what a live worker or API did, as JSON lines, and the
//! check that every transition in them is one the core allows.
//!
//! [`TraceProbe`] writes one line per event: a header with the policy, then
//! `started` (a role instance and what it was built with), `sent` (a command)
//! and `received` (an input, with the time it was handled at). [`check`]
//! replays the lines through the protocol's own state machines, built with
//! the correct protocol (no mutant): each input is fed to its role instance
//! and each command must be the one that instance emits next. The first
//! command the model would not have sent rejects the trace. Reader and
//! cancel and retention events are outside the role machines and are skipped. A trace cut
//! short (a worker killed mid-write) is a prefix of a valid trace and
//! conforms.

use crate::driver::{Probe, RoleId, Start};
use pelican_model::protocol::{
    Command, Delivery, Input, Maintenance, Policy, Reclaimer, Submitter,
};
use pelican_model::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Mutex;

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// The first line: the process's policy and clock.
    Header {
        /// The policy (its `mutant` is ignored by the check).
        policy: Policy,
        /// How far the process's clock, which every `now` of the trace
        /// reads, is shifted (`Config::clock_offset_ms`; 0 but in tests of
        /// skewed clocks): subtract it to compare times across traces.
        ///
        /// [`Config::clock_offset_ms`]: crate::Config::clock_offset_ms
        #[serde(default)]
        clock_offset_ms: i64,
    },
    /// A role instance started.
    Started {
        /// Which.
        role: RoleId,
        /// With what.
        start: Start,
    },
    /// A role sent a command.
    Sent {
        /// Which.
        role: RoleId,
        /// What.
        command: Command,
    },
    /// A role received an input at `now`.
    Received {
        /// Which.
        role: RoleId,
        /// When it handled it.
        now: Timestamp,
        /// What.
        input: Input,
    },
}

/// Writes a trace (opt-in: `pelican worker --trace-file`).
pub struct TraceProbe {
    out: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl TraceProbe {
    /// Creates (or truncates) `path` and writes the header: `policy`, and
    /// the shift of the process's clock.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn create(
        path: &Path,
        policy: &Policy,
        clock_offset_ms: i64,
    ) -> std::io::Result<TraceProbe> {
        let file = std::fs::File::create(path)?;
        let probe = TraceProbe {
            out: Mutex::new(std::io::BufWriter::new(file)),
        };
        probe.write(&Line::Header {
            policy: policy.clone(),
            clock_offset_ms,
        });
        Ok(probe)
    }

    fn write(&self, line: &Line) {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let text = serde_json::to_string(line).expect("trace lines serialize");
        // Flushed per line: a killed process leaves a valid prefix.
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }
}

fn traced(role: &RoleId) -> bool {
    !matches!(
        role,
        RoleId::Reader(..) | RoleId::Cancel(_) | RoleId::Retention(_)
    )
}

impl Probe for TraceProbe {
    fn sent(&self, role: &RoleId, command: &Command) {
        if traced(role) {
            self.write(&Line::Sent {
                role: role.clone(),
                command: command.clone(),
            });
        }
    }
    fn received(&self, role: &RoleId, now: Timestamp, input: &Input) {
        if traced(role) {
            self.write(&Line::Received {
                role: role.clone(),
                now,
                input: input.clone(),
            });
        }
    }
    fn started(&self, role: &RoleId, start: &Start) {
        self.write(&Line::Started {
            role: role.clone(),
            start: start.clone(),
        });
    }
}

enum Machine {
    Delivery(Box<Delivery>),
    Reclaimer(Box<Reclaimer>),
    Maintenance(Box<Maintenance>),
    Submitter(Box<Submitter>),
}

impl Machine {
    fn poll(&mut self) -> Option<Command> {
        match self {
            Machine::Delivery(m) => m.poll(),
            Machine::Reclaimer(m) => m.poll(),
            Machine::Maintenance(m) => m.poll(),
            Machine::Submitter(m) => m.poll(),
        }
    }

    fn handle(&mut self, now: Timestamp, input: Input) {
        match self {
            Machine::Delivery(m) => m.handle(now, input),
            Machine::Reclaimer(m) => {
                m.handle(now, input);
                while m.poll_event().is_some() {}
            }
            Machine::Maintenance(m) => m.handle(now, input),
            Machine::Submitter(m) => m.handle(now, input),
        }
    }
}

/// Why a trace does not conform.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The line (1-based).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
    /// The role's earlier events, oldest first.
    pub before: Vec<String>,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "line {}: {}", self.line, self.reason)?;
        if !self.before.is_empty() {
            writeln!(f, "the role's events before it:")?;
            for e in &self.before {
                writeln!(f, "  {e}")?;
            }
        }
        Ok(())
    }
}

/// Checks a trace's lines. `Ok(n)`: it conforms, with `n` events.
///
/// # Errors
/// The first event the model does not allow (or a line that is not a trace
/// line).
pub fn check(lines: impl IntoIterator<Item = String>) -> Result<usize, Rejection> {
    let mut policy: Option<Policy> = None;
    let mut replay = Replay::default();
    let mut events = 0;
    for (i, text) in lines.into_iter().enumerate() {
        let n = i + 1;
        if text.trim().is_empty() {
            continue;
        }
        let reject = |(reason, role): Refusal, replay: &Replay| Rejection {
            line: n,
            reason,
            before: role
                .and_then(|r| replay.history.get(&r))
                .map(|h| h.iter().cloned().collect())
                .unwrap_or_default(),
        };
        let line: Line = match serde_json::from_str(&text) {
            Ok(l) => l,
            // The last line of a killed process may be cut mid-write.
            Err(_) if n > 1 && !text.ends_with('}') => continue,
            Err(e) => return Err(reject((format!("not a trace line: {e}"), None), &replay)),
        };
        events += 1;
        if let Line::Header { policy: p, .. } = line {
            policy = Some(Policy { mutant: None, ..p });
            continue;
        }
        let Some(policy) = &policy else {
            let why = ("no header line before the events".to_owned(), None);
            return Err(reject(why, &replay));
        };
        let done = match line {
            Line::Header { .. } => unreachable!("handled above"),
            Line::Started { role, start } => replay.started(policy, role, start),
            Line::Sent { role, command } => replay.sent(role, command),
            Line::Received { role, now, input } => replay.received(role, now, input),
        };
        if let Err(refusal) = done {
            return Err(reject(refusal, &replay));
        }
    }
    Ok(events)
}

/// Why a line is refused, and the role whose history to show with it.
type Refusal = (String, Option<RoleId>);

/// The roles a trace has started, each with its state machine and the
/// lines it has seen since its start.
#[derive(Default)]
struct Replay {
    machines: BTreeMap<RoleId, Machine>,
    history: BTreeMap<RoleId, VecDeque<String>>,
}

impl Replay {
    /// `role` starts as `start` says.
    fn started(&mut self, policy: &Policy, role: RoleId, start: Start) -> Result<(), Refusal> {
        // A new maintenance pass: the last one must have sent all it had
        // to (a pass that skips its query is a bug, e.g. an outbox that
        // never publishes).
        if matches!(role, RoleId::Maintenance(_))
            && let Some(skipped) = self.machines.get_mut(&role).and_then(Machine::poll)
        {
            let why = format!("{role:?} started a new pass without sending {skipped:?}");
            return Err((why, Some(role)));
        }
        let h = self.history.entry(role.clone()).or_default();
        h.clear();
        h.push_back(format!("started {start:?}"));
        let machines = &mut self.machines;
        match (&role, start) {
            (
                RoleId::Delivery(w, ..),
                Start::Delivery {
                    now,
                    entry,
                    job,
                    entropy,
                },
            ) => {
                let d = Delivery::new(now, policy, *w, entry, job, entropy);
                machines.insert(role, Machine::Delivery(Box::new(d)));
            }
            (RoleId::Reclaimer(w), Start::Reclaim { now, free }) => {
                let m = machines
                    .entry(role.clone())
                    .or_insert_with(|| Machine::Reclaimer(Box::new(Reclaimer::new(policy, *w))));
                if let Machine::Reclaimer(r) = m {
                    r.start(now, free);
                }
            }
            // One loop for the worker's life, as the driver keeps it: the
            // sweeper's cursor carries over from pass to pass.
            (RoleId::Maintenance(_), Start::Maintenance { task, now }) => {
                let m = machines
                    .entry(role.clone())
                    .or_insert_with(|| Machine::Maintenance(Box::new(Maintenance::new(policy))));
                if let Machine::Maintenance(m) = m {
                    m.start(task, now);
                }
            }
            (
                RoleId::Submitter(_),
                Start::Submit {
                    run,
                    kind,
                    input,
                    key,
                    trace,
                    delay,
                },
            ) => {
                let s = Submitter::new(policy, run, &kind, &input, key.as_deref());
                let s = s.traced(trace.as_deref().unwrap_or_default());
                let s = s.delayed(delay);
                machines.insert(role, Machine::Submitter(Box::new(s)));
            }
            (role, start) => return Err((format!("{role:?} cannot start as {start:?}"), None)),
        }
        Ok(())
    }

    /// `role` sent `command`: what its machine sends next.
    fn sent(&mut self, role: RoleId, command: Command) -> Result<(), Refusal> {
        if !traced(&role) {
            return Ok(());
        }
        let Some(m) = self.machines.get_mut(&role) else {
            return Err((format!("{role:?} sent {command:?} before it started"), None));
        };
        let expected = m.poll();
        if expected.as_ref() != Some(&command) {
            let why = format!(
                "{role:?} sent {command:?}, but the protocol sends {}",
                expected.map_or("nothing".to_owned(), |c| format!("{c:?}"))
            );
            return Err((why, Some(role)));
        }
        push(&mut self.history, &role, format!("sent {command:?}"));
        Ok(())
    }

    /// `role` received `input` at `now`.
    fn received(&mut self, role: RoleId, now: Timestamp, input: Input) -> Result<(), Refusal> {
        if !traced(&role) {
            return Ok(());
        }
        let Some(m) = self.machines.get_mut(&role) else {
            return Err((
                format!("{role:?} received {input:?} before it started"),
                None,
            ));
        };
        push(
            &mut self.history,
            &role,
            format!("received {input:?} at {}", now.0),
        );
        m.handle(now, input);
        Ok(())
    }
}

fn push(history: &mut BTreeMap<RoleId, VecDeque<String>>, role: &RoleId, event: String) {
    let h = history.entry(role.clone()).or_default();
    if h.len() == 12 {
        h.pop_front();
    }
    h.push_back(event);
}

/// Checks a trace file.
///
/// # Errors
/// As [`check`]; an unreadable file is a rejection at line 0.
pub fn check_file(path: &Path) -> Result<usize, Rejection> {
    let file = std::fs::File::open(path).map_err(|e| Rejection {
        line: 0,
        reason: format!("{}: {e}", path.display()),
        before: Vec::new(),
    })?;
    check(std::io::BufReader::new(file).lines().map_while(Result::ok))
}
