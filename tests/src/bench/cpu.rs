//! Where a drain's CPU goes: the seconds each process spent on a CPU over
//! the drain, read from `/proc/<pid>/stat` (user and system time, every
//! thread), per run drained.
//!
//! A drain on this bench's two cores is CPU-bound, so its throughput is
//! the machine's cores over the sum of these. The split says which side a
//! change must make cheaper: the drainer, Postgres or Redis.

use serde_json::{Value, json};

/// CPU seconds of the processes a drain involves, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// The `pelican worker` processes.
    pub workers: f64,
    /// The bench process: its poller and, for a baseline drain, the
    /// drainer itself (it runs in the bench's runtime).
    pub bench: f64,
    /// The Postgres server: the postmaster and every backend, including
    /// those that ended (their time is in the postmaster's children's).
    pub postgres: f64,
    /// The Redis servers.
    pub redis: f64,
}

/// A drain's CPU time per run drained, µs (the difference of two
/// [`Sample`]s over the runs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerRun {
    /// See [`Sample::workers`].
    pub workers: f64,
    /// See [`Sample::bench`].
    pub bench: f64,
    /// See [`Sample::postgres`].
    pub postgres: f64,
    /// See [`Sample::redis`].
    pub redis: f64,
}

impl PerRun {
    /// From `before` to `after`, over `runs` runs.
    #[must_use]
    pub fn between(before: Sample, after: Sample, runs: u32) -> PerRun {
        let us = |a: f64, b: f64| (b - a).max(0.0) * 1e6 / f64::from(runs.max(1));
        PerRun {
            workers: us(before.workers, after.workers),
            bench: us(before.bench, after.bench),
            postgres: us(before.postgres, after.postgres),
            redis: us(before.redis, after.redis),
        }
    }

    /// Every process's time together, µs per run.
    #[must_use]
    pub fn total(&self) -> f64 {
        self.workers + self.bench + self.postgres + self.redis
    }

    /// The per-component medians of `drains`, as JSON (null for none).
    #[must_use]
    pub fn medians_json(drains: &[PerRun]) -> Value {
        let of = |f: fn(&PerRun) -> f64| {
            let xs: Vec<f64> = drains.iter().map(f).collect();
            super::median(&xs).map(|x| super::round(x, 2))
        };
        if drains.is_empty() {
            return Value::Null;
        }
        json!({
            "workers": of(|d| d.workers),
            "bench": of(|d| d.bench),
            "postgres": of(|d| d.postgres),
            "redis": of(|d| d.redis),
            "total": of(PerRun::total),
        })
    }
}

impl std::fmt::Display for PerRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU µs per run: workers {:.1}, bench {:.1}, Postgres {:.1}, Redis {:.1}",
            self.workers, self.bench, self.postgres, self.redis
        )
    }
}

/// Clock ticks per second of `/proc`'s times (`getconf CLK_TCK`; Linux
/// uses 100 everywhere this bench runs, which is the fallback).
fn ticks_per_s() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// A `/proc/<pid>/stat` line's fields after the command name: the parent
/// (`[1]`), and the user and system times of the process (`[11]`, `[12]`)
/// and of its waited-for children (`[13]`, `[14]`), in ticks.
fn stat_fields(stat: &str) -> Option<Vec<u64>> {
    // The command name is in parentheses and may hold anything, spaces and
    // parentheses included: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(1) // the state letter
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    (fields.len() >= 14).then(|| std::iter::once(0).chain(fields).collect())
}

fn stat(pid: u32) -> Option<Vec<u64>> {
    stat_fields(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds `pid` has used, every thread (0 when it is gone).
#[must_use]
pub fn process(pid: u32) -> f64 {
    stat(pid).map_or(0.0, |f| (f[11] + f[12]) as f64 / ticks_per_s())
}

/// CPU seconds of `root` and its children: its own, its waited-for
/// children's, and those of its living children (a server that forks a
/// process per connection, as Postgres does).
#[must_use]
pub fn tree(root: u32) -> f64 {
    let Some(f) = stat(root) else {
        return 0.0;
    };
    let mut ticks = f[11] + f[12] + f[13] + f[14];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if let Some(c) = stat(pid).filter(|c| c[1] == u64::from(root)) {
                ticks += c[11] + c[12];
            }
        }
    }
    ticks as f64 / ticks_per_s()
}

#[cfg(test)]
mod tests {
    use super::{PerRun, Sample, stat_fields};
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn stat_fields_start_after_the_last_parenthesis() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime ...
        let line = "42 (a (b) c) S 7 42 42 0 -1 4194560 10 0 0 0 150 25 300 40 20 0 1 0";
        let f = stat_fields(line).expect("a full line");
        assert_eq!(f[1], 7, "the parent");
        assert_eq!((f[11], f[12], f[13], f[14]), (150, 25, 300, 40));
        assert_eq!(stat_fields("42 (x) S 7 1"), None, "a short line");
    }

    /// Waits up to 10 s for `grown` to hold.
    fn eventually(what: &str, mut grown: impl FnMut() -> bool) {
        let start = Instant::now();
        while !grown() {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_process_counts_its_own_time() {
        let me = std::process::id();
        let before = super::process(me);
        let mut x = 0_u64;
        eventually("no CPU time counted after 10 s of spinning", || {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
            super::process(me) > before
        });
        assert_eq!(super::process(u32::MAX), 0.0, "no such process");
    }

    /// A child that spins until dropped (killed and waited for, so that a
    /// failed test leaves no spinner behind).
    struct Spinner(std::process::Child);

    impl Drop for Spinner {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_tree_counts_its_living_and_its_ended_children() {
        let me = std::process::id();
        let children = || super::tree(me) - super::process(me);
        let before = children();
        let spinner = Spinner(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("sh runs"),
        );
        // Its time shows while it runs; a tick or two of slack for this
        // process's own time, read apart from the tree's.
        eventually("a living child's time is not counted", || {
            children() > before + 0.05
        });
        drop(spinner);
        assert!(
            children() > before + 0.03,
            "an ended child's time stays counted, in its parent's"
        );
    }

    #[test]
    fn per_run_is_the_difference_over_the_runs() {
        let before = Sample {
            workers: 0.0,
            bench: 1.0,
            postgres: 2.0,
            redis: 3.0,
        };
        let after = Sample {
            workers: 1.0,
            bench: 1.5,
            postgres: 4.0,
            redis: 3.1,
        };
        let d = PerRun::between(before, after, 100_000);
        assert!((d.workers - 10.0).abs() < 1e-9);
        assert!((d.postgres - 20.0).abs() < 1e-9);
        assert!((d.total() - 36.0).abs() < 1e-6, "{d:?}");
        let json = PerRun::medians_json(&[d, d]);
        assert_eq!(json["postgres"], 20.0);
        assert_eq!(PerRun::medians_json(&[]), serde_json::Value::Null);
    }
}
