//! What the soak samples every period, and the rule a series must keep:
//! flat, its last third no higher than its middle third beyond its noise.

use super::load::Load;
use crate::Env;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Pelican's tables, sampled for rows and size. (`effects` is the demo
/// tool service's own table, an outside system's: not Pelican's to keep.)
pub const TABLES: [&str; 8] = [
    "runs",
    "attempts",
    "run_events",
    "steps",
    "submit_keys",
    "dead_letters",
    "provider_slots",
    "provider_rates",
];

/// One sample: seconds into the soak, and each series' value.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Series name → value.
    pub values: BTreeMap<String, f64>,
}

/// Reads the samples' sources: Postgres (its own pool), Redis, the
/// processes, and what the load recorded since the last sample.
pub struct Sampler {
    pool: sqlx::PgPool,
    commits: Option<(Instant, f64)>,
}

impl Sampler {
    /// A sampler of the soak's database at `url`.
    ///
    /// # Panics
    /// When Postgres does not answer.
    #[must_use]
    pub fn new(url: &str) -> Sampler {
        let pool = crate::rt()
            .block_on(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url),
            )
            .expect("the soak's Postgres answers");
        Sampler {
            pool,
            commits: None,
        }
    }

    /// Takes one sample at `t_s`; `procs` are the live processes by name.
    pub fn sample(&mut self, t_s: f64, env: &Env, procs: &[(String, u32)], load: &Load) -> Sample {
        let mut values = BTreeMap::new();
        self.postgres(&mut values);
        redis(env, &mut values);
        for (name, pid) in procs {
            if let Some(kib) = rss_kib(*pid) {
                values.insert(format!("rss_mib.{name}"), kib as f64 / 1024.0);
            }
        }
        let take = |m: &std::sync::Mutex<Vec<f64>>| std::mem::take(&mut *m.lock().expect("ok"));
        for (name, mut xs) in [
            ("submit_ms", take(&load.submit_ms)),
            ("watch_lag_ms", take(&load.watch_lag_ms)),
        ] {
            if !xs.is_empty() {
                xs.sort_by(f64::total_cmp);
                values.insert(format!("{name}.p50"), quantile(&xs, 0.5));
                values.insert(format!("{name}.p99"), quantile(&xs, 0.99));
            }
        }
        Sample { t_s, values }
    }

    fn postgres(&mut self, values: &mut BTreeMap<String, f64>) {
        let pool = &self.pool;
        let (tables, connections, commits) = crate::rt().block_on(async {
            let tables: Vec<(String, i64, i64)> = sqlx::query_as(
                "SELECT relname::text, n_live_tup, pg_total_relation_size(relid) \
                 FROM pg_stat_user_tables",
            )
            .fetch_all(pool)
            .await
            .unwrap_or_default();
            let connections: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
            )
            .fetch_one(pool)
            .await
            .unwrap_or(0);
            let commits: i64 = sqlx::query_scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(pool)
            .await
            .unwrap_or(0);
            (tables, connections, commits)
        });
        for (table, rows, bytes) in tables {
            if TABLES.contains(&table.as_str()) {
                values.insert(format!("pg.rows.{table}"), rows as f64);
                values.insert(format!("pg.mib.{table}"), bytes as f64 / 1_048_576.0);
            }
        }
        values.insert("pg.connections".into(), connections as f64);
        let now = (Instant::now(), commits as f64);
        if let Some((then, before)) = self.commits.replace(now) {
            let secs = now.0.duration_since(then).as_secs_f64().max(1e-3);
            values.insert("pg.commits_per_s".into(), (now.1 - before) / secs);
        }
    }

    /// Runs finished since `since_ms` (Postgres's clock), with the latest
    /// finish seen: the soak's record of what retention may delete.
    pub fn finished_since(&self, since_ms: i64) -> Vec<(u64, i64)> {
        crate::rt()
            .block_on(
                sqlx::query_as::<_, (i64, i64)>(
                    "SELECT run_id, finished_at FROM runs WHERE finished_at >= $1",
                )
                .bind(since_ms)
                .fetch_all(&self.pool),
            )
            .unwrap_or_default()
            .into_iter()
            .map(|(run, at)| (run as u64, at))
            .collect()
    }
}

/// Stream lengths, the PEL and the consumers of the soak's Redis.
fn redis(env: &Env, values: &mut BTreeMap<String, f64>) {
    let Some(mut c) = env.redis.try_conn() else {
        return;
    };
    let names = env.names();
    let key = names.key(0).unwrap_or_default().to_owned();
    let len = |c: &mut crate::RedisConnection, k: &str| -> Option<f64> {
        redis::cmd("XLEN")
            .arg(k)
            .query::<i64>(c)
            .ok()
            .map(|n| n as f64)
    };
    if let Some(n) = len(&mut c, &key) {
        values.insert("redis.jobs_len".into(), n);
    }
    if let Some(n) = len(&mut c, &names.dead) {
        values.insert("redis.dead_len".into(), n);
    }
    let pending: Option<redis::Value> = redis::cmd("XPENDING")
        .arg(&key)
        .arg(&names.group)
        .query(&mut c)
        .ok();
    if let Some(redis::Value::Array(parts)) = pending
        && let Some(redis::Value::Int(n)) = parts.first()
    {
        values.insert("redis.pel".into(), *n as f64);
    }
    let consumers: Option<Vec<redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&key)
        .arg(&names.group)
        .query(&mut c)
        .ok();
    if let Some(cs) = consumers {
        values.insert("redis.consumers".into(), cs.len() as f64);
    }
}

/// The resident set of process `pid` now, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The `q` quantile of sorted `xs` (nearest rank).
#[must_use]
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let i = ((xs.len() as f64 * q).ceil() as usize).clamp(1, xs.len()) - 1;
    xs[i]
}

/// How much a series may rise from its middle third to its last before it
/// is not flat: (relative, absolute), by the series' kind. Postgres's
/// connections are not judged for flatness: each process's pool opens them
/// as its load needs and keeps them, so they climb after every restart to
/// a ceiling the deployment sets ([`connections_ceiling`]).
#[must_use]
pub fn noise(series: &str) -> (f64, f64) {
    match series {
        "pg.connections" => (f64::INFINITY, 0.0),
        "pg.commits_per_s" => (0.5, 100.0),
        "redis.consumers" => (0.0, 2.0),
        "redis.dead_len" => (0.25, 50.0),
        "redis.pel" => (0.5, 200.0),
        s if s.starts_with("pg.rows.") => (0.25, 500.0),
        s if s.starts_with("pg.mib.") => (0.25, 2.0),
        s if s.starts_with("redis.") => (0.25, 500.0),
        s if s.starts_with("rss_mib.") => (0.25, 16.0),
        s if s.starts_with("submit_ms.") => (1.0, 25.0),
        s if s.starts_with("watch_lag_ms.") => (1.0, 250.0),
        _ => (0.25, 0.0),
    }
}

/// The most Postgres connections `processes` of Pelican (each with its
/// pool) and the soak's own (its sampler and its checks) may hold.
#[must_use]
pub fn connections_ceiling(processes: u32) -> f64 {
    f64::from(processes * pelican_real::live::pg::POOL_MAX + 4)
}

/// The series whose last third of the samples rose beyond its [`noise`]
/// above the level held before (the larger of the first and middle
/// thirds' means): (name, that level, last mean).
#[must_use]
pub fn not_flat(samples: &[Sample]) -> Vec<(String, f64, f64)> {
    let n = samples.len();
    if n < 6 {
        return Vec::new();
    }
    let (a, b) = (n / 3, 2 * n / 3);
    let names: std::collections::BTreeSet<&String> =
        samples.iter().flat_map(|s| s.values.keys()).collect();
    let mean = |range: &[Sample], name: &str| {
        let xs: Vec<f64> = range
            .iter()
            .filter_map(|s| s.values.get(name).copied())
            .collect();
        (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
    };
    names
        .into_iter()
        .filter_map(|name| {
            let (middle, last) = (mean(&samples[a..b], name)?, mean(&samples[b..], name)?);
            // A level the soak held before: a wipe in the middle third
            // empties the streams for a while, and a series that grows
            // exceeds both earlier thirds anyway.
            let held = mean(&samples[..a], name).map_or(middle, |first| first.max(middle));
            let (rel, abs) = noise(name);
            (last > held * (1.0 + rel) + abs).then(|| (name.clone(), held, last))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, xs: &[f64]) -> Vec<Sample> {
        xs.iter()
            .enumerate()
            .map(|(i, x)| Sample {
                t_s: i as f64,
                values: [(name.to_owned(), *x)].into(),
            })
            .collect()
    }

    #[test]
    fn a_plateau_is_flat_and_a_climb_is_not() {
        let plateau = [0.0, 5e3, 9e3, 10e3, 10.5e3, 9.8e3, 10.2e3, 10e3, 9.9e3];
        assert!(not_flat(&series("pg.rows.runs", &plateau)).is_empty());
        let climb = [0.0, 5e3, 10e3, 15e3, 20e3, 25e3, 30e3, 35e3, 40e3];
        let found = not_flat(&series("pg.rows.runs", &climb));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "pg.rows.runs");
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.5), 50.0);
        assert_eq!(quantile(&xs, 0.99), 99.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
    }
}
