//! Instructions per delivery: the worker's CPU as a count that the
//! machine's other load does not change (valgrind counts instructions, not
//! seconds). `xtask/worker-instructions.sh` drains `runs` and then
//! `3 × runs` no-op runs under valgrind on the bench's own servers; the
//! difference over the `2 × runs` between is one delivery's cost times
//! their number, with the worker's start and end left out.

use crate::services::{Cluster, Redis};
use std::path::Path;
use std::process::Command;

/// The worker's instructions per delivery (see the module's notes), or why
/// they could not be counted.
///
/// # Errors
/// When valgrind, psql or redis-cli is missing, or the script fails.
pub fn per_delivery(cluster: &Cluster, runs: u32) -> Result<f64, String> {
    let redis = Redis::start();
    let small = count(cluster, &redis, runs)?;
    let large = count(cluster, &redis, 3 * runs)?;
    let per = (large - small) / (2.0 * f64::from(runs));
    eprintln!(
        "bench: worker instructions: {small:.0} for {runs} runs, {large:.0} for {}: {per:.0} a delivery",
        3 * runs
    );
    Ok(per)
}

/// The instructions the worker took to drain `runs` runs.
fn count(cluster: &Cluster, redis: &Redis, runs: u32) -> Result<f64, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/worker-instructions.sh");
    let admin = cluster.admin_url();
    let server = admin.trim_end_matches("/postgres");
    let out = Command::new("bash")
        .arg(&script)
        .arg(crate::pelican_bin())
        .arg(runs.to_string())
        .env("PG_URL", server)
        .env("REDIS_URL", redis.url())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} {runs}: {}\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // "N runs: I instructions"
    stdout
        .split_whitespace()
        .rev()
        .nth(1)
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| format!("{}: no count in {stdout:?}", script.display()))
}
