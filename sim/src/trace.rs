//! Trace files: one failing seed each, under `traces/`, enough to re-run it
//! exactly and to read what happened.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A trace: what to re-run, and what happened when it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// The madsim seed.
    pub seed: u64,
    /// The scenario's name.
    pub scenario: String,
    /// The scenario as it was (for reading; re-runs use the name).
    pub configuration: crate::Scenario,
    /// The mutant injected, if any.
    pub mutant: Option<String>,
    /// The git commit of the build that failed.
    pub commit: String,
    /// The guarantees broken, "S4 AckBeforeDurable(..)" etc.
    pub broken: Vec<String>,
    /// Hash of every event.
    pub digest: u64,
    /// Every event, in order.
    pub events: Vec<Event>,
}

/// One event of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Simulated milliseconds since the seed started.
    pub t_ms: u64,
    /// Which node.
    pub node: String,
    /// What happened.
    pub event: String,
}

impl Trace {
    /// The file this trace is written to: `<dir>/<scenario>[-<mutant>]-<seed>.json`.
    #[must_use]
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        let name = match &self.mutant {
            Some(m) => format!("{}-{m}-{}.json", self.scenario, self.seed),
            None => format!("{}-{}.json", self.scenario, self.seed),
        };
        dir.join(name)
    }

    /// Reads a trace file.
    ///
    /// # Errors
    /// The file cannot be read or is not a trace.
    pub fn read(path: &Path) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a trace: {e}", path.display()))
    }

    /// Writes the trace under `dir`, returning the file's path.
    ///
    /// # Errors
    /// The directory or file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = self.path_in(dir);
        let text = serde_json::to_string_pretty(self).expect("traces serialize");
        std::fs::write(&path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }
}
