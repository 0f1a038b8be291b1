//! What a drain asked of its servers, per run: each Redis command's calls
//! and Redis's time in it (`INFO commandstats`, summed over every node),
//! and each Postgres statement's calls and execution time
//! (`pg_stat_statements`, which the bench's Postgres preloads). Where
//! [`super::cpu`] says how much each server worked, this says for what:
//! the drainers' gaps in Postgres and Redis, split by statement and
//! command.

use pelican_real::live::PgDb;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The settings under which the bench's Postgres counts its statements:
/// top-level statements only (the count triggers' own statements are part
/// of the statement that fired them).
pub const PG_SETTINGS: [&str; 2] = [
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track=top",
];

/// Counters at one moment: by name, calls and µs spent so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally(BTreeMap<String, (u64, f64)>);

impl Tally {
    /// Parses `INFO commandstats` (`cmdstat_xack:calls=3,usec=12,...`)
    /// and adds it in: a cluster's nodes are summed. Lines it does not
    /// know are skipped; a malformed counter reads as zero.
    pub fn add_commandstats(&mut self, info: &str) {
        for line in info.lines() {
            let Some((name, fields)) = line
                .trim()
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == key)
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let e = self.0.entry(name.to_ascii_uppercase()).or_default();
            e.0 += field("calls");
            e.1 += field("usec") as f64;
        }
    }

    /// Adds one statement's counters (`pg_stat_statements`'s normalized
    /// text, calls, execution ms): the text is named by
    /// [`statement_name`].
    pub fn add_statement(&mut self, query: &str, calls: i64, exec_ms: f64) {
        let e = self.0.entry(statement_name(query)).or_default();
        e.0 += u64::try_from(calls).unwrap_or(0);
        e.1 += exec_ms * 1e3;
    }
}

/// A statement's name in the tables: its text with whitespace collapsed,
/// cut at 72 characters, enough to tell Pelican's statements apart.
#[must_use]
pub fn statement_name(query: &str) -> String {
    let words = query.split_whitespace().collect::<Vec<_>>().join(" ");
    match words.char_indices().nth(72) {
        Some((cut, _)) => format!("{}…", &words[..cut]),
        None => words,
    }
}

/// Reads the drain database's statement counters.
///
/// # Errors
/// When `pg_stat_statements` cannot be created or read (the server does
/// not preload it).
pub async fn postgres(db: &PgDb) -> Result<Tally, String> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
    ))
    .execute(db.pool())
    .await
    .map_err(|e| format!("creating pg_stat_statements: {e}"))?;
    let rows: Vec<(String, i64, f64)> = sqlx::query_as(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(db.pool())
    .await
    .map_err(|e| format!("reading pg_stat_statements (is it preloaded?): {e}"))?;
    let mut t = Tally::default();
    for (query, calls, ms) in rows {
        t.add_statement(&query, calls, ms);
    }
    Ok(t)
}

/// Both servers' counters now: Redis's commands (every node's), and the
/// statements of `db`'s database.
///
/// # Panics
/// When a Redis node does not answer or Postgres does not count
/// statements ([`PG_SETTINGS`]).
#[must_use]
pub fn tally(rt: &tokio::runtime::Runtime, redis: &crate::Redis, db: &PgDb) -> (Tally, Tally) {
    let mut commands = Tally::default();
    for info in redis.info_each("commandstats") {
        commands.add_commandstats(&info);
    }
    let statements = rt
        .block_on(postgres(db))
        .unwrap_or_else(|e| panic!("the bench's Postgres counts statements: {e}"));
    (commands, statements)
}

/// One name's calls and time per run over a drain.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// The command or statement.
    pub name: String,
    /// Calls per run.
    pub calls: f64,
    /// µs per run, the server's own time in it.
    pub us: f64,
}

/// A drain's work per run: Redis's commands and Postgres's statements,
/// each list by time, the costliest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Work {
    /// Redis commands.
    pub redis: Vec<Line>,
    /// Postgres statements.
    pub postgres: Vec<Line>,
}

/// What grew from `before` to `after`, per run, the costliest first.
fn per_run(before: &Tally, after: &Tally, runs: u32) -> Vec<Line> {
    let runs = f64::from(runs.max(1));
    let mut lines: Vec<Line> = after
        .0
        .iter()
        .filter_map(|(name, &(calls, us))| {
            let (c0, u0) = before.0.get(name).copied().unwrap_or_default();
            let calls = calls.saturating_sub(c0);
            (calls > 0).then(|| Line {
                name: name.clone(),
                calls: calls as f64 / runs,
                us: (us - u0).max(0.0) / runs,
            })
        })
        .collect();
    lines.sort_by(|a, b| b.us.total_cmp(&a.us).then_with(|| a.name.cmp(&b.name)));
    lines
}

impl Work {
    /// The counters' growth over a drain of `runs`.
    #[must_use]
    pub fn between(before: &(Tally, Tally), after: &(Tally, Tally), runs: u32) -> Work {
        Work {
            redis: per_run(&before.0, &after.0, runs),
            postgres: per_run(&before.1, &after.1, runs),
        }
    }

    /// Medians over drains, name by name (a name a drain lacks counts as
    /// zero there), as `{"redis": {name: {calls, us}}, "postgres": ...}`.
    #[must_use]
    pub fn medians_json(drains: &[Work]) -> Value {
        if drains.is_empty() {
            return Value::Null;
        }
        let side = |lines: fn(&Work) -> &Vec<Line>| {
            let names: std::collections::BTreeSet<&str> = drains
                .iter()
                .flat_map(|d| lines(d).iter().map(|l| l.name.as_str()))
                .collect();
            let of = |name: &str, f: fn(&Line) -> f64| {
                let xs: Vec<f64> = drains
                    .iter()
                    .map(|d| lines(d).iter().find(|l| l.name == name).map_or(0.0, f))
                    .collect();
                super::median(&xs).map(|x| super::round(x, 3))
            };
            names
                .into_iter()
                .map(|n| {
                    let v = json!({"calls": of(n, |l| l.calls), "us": of(n, |l| l.us)});
                    (n.to_owned(), v)
                })
                .collect::<serde_json::Map<String, Value>>()
        };
        json!({"redis": side(|w| &w.redis), "postgres": side(|w| &w.postgres)})
    }
}

impl std::fmt::Display for Work {
    /// Each side's totals, then its lines, one a row: calls per 1,000 runs,
    /// µs per run, µs per call.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (server, lines) in [("Redis", &self.redis), ("Postgres", &self.postgres)] {
            let calls: f64 = lines.iter().map(|l| l.calls).sum();
            let us: f64 = lines.iter().map(|l| l.us).sum();
            write!(
                f,
                "\n  {server}: {:.2} calls per 1,000 runs, {us:.2} µs per run in all",
                calls * 1e3
            )?;
            for l in lines {
                write!(
                    f,
                    "\n    {:>10.2} /1k runs {:>7.2} µs/run {:>9.1} µs/call  {}",
                    l.calls * 1e3,
                    l.us,
                    l.us / l.calls,
                    l.name
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_parse_and_sum_over_nodes() {
        let mut t = Tally::default();
        t.add_commandstats(
            "# Commandstats\r\ncmdstat_xack:calls=10,usec=25,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\ncmdstat_xreadgroup:calls=2,usec=40,usec_per_call=20.00\r\nnot a counter\r\n",
        );
        t.add_commandstats("cmdstat_xack:calls=5,usec=5\ncmdstat_ping:calls=x,usec=1\n");
        assert_eq!(t.0["XACK"], (15, 30.0));
        assert_eq!(t.0["XREADGROUP"], (2, 40.0));
        assert_eq!(t.0["PING"], (0, 1.0), "a malformed counter reads as zero");
        assert_eq!(t.0.len(), 3);
    }

    #[test]
    fn statements_are_named_by_their_collapsed_text() {
        assert_eq!(
            statement_name("SELECT  1\n  FROM runs"),
            "SELECT 1 FROM runs"
        );
        let long = format!("UPDATE runs SET {}", "x = $1, ".repeat(20));
        let name = statement_name(&long);
        assert_eq!(name.chars().count(), 73);
        assert!(name.ends_with('…'));
        let mut t = Tally::default();
        t.add_statement("SELECT 1", 3, 0.5);
        t.add_statement("SELECT  1", 1, 0.5);
        assert_eq!(
            t.0["SELECT 1"],
            (4, 1000.0),
            "the same text after collapsing adds up"
        );
    }

    #[test]
    fn per_run_growth_costliest_first_and_new_names_count() {
        let mut before = Tally::default();
        before.add_commandstats("cmdstat_xack:calls=100,usec=100\ncmdstat_xadd:calls=7,usec=9");
        let mut after = before.clone();
        after.add_commandstats(
            "cmdstat_xack:calls=200,usec=300\ncmdstat_xautoclaim:calls=10,usec=1000",
        );
        let w = Work::between(&(before, Tally::default()), &(after, Tally::default()), 100);
        assert_eq!(
            w.redis,
            vec![
                Line {
                    name: "XAUTOCLAIM".into(),
                    calls: 0.1,
                    us: 10.0
                },
                Line {
                    name: "XACK".into(),
                    calls: 2.0,
                    us: 3.0
                },
            ],
            "XADD did not grow, so it is not listed"
        );
        assert!(w.postgres.is_empty());
    }

    #[test]
    fn medians_count_a_missing_name_as_zero() {
        let line = |name: &str, calls| Line {
            name: name.into(),
            calls,
            us: calls * 2.0,
        };
        let w = |lines: Vec<Line>| Work {
            redis: lines,
            postgres: vec![],
        };
        let drains = [
            w(vec![line("XACK", 1.0), line("XAUTOCLAIM", 0.5)]),
            w(vec![line("XACK", 3.0)]),
            w(vec![line("XACK", 2.0)]),
        ];
        let j = Work::medians_json(&drains);
        assert_eq!(j["redis"]["XACK"]["calls"], 2.0);
        assert_eq!(j["redis"]["XACK"]["us"], 4.0);
        assert_eq!(j["redis"]["XAUTOCLAIM"]["calls"], 0.0);
        assert_eq!(Work::medians_json(&[]), Value::Null);
    }
}
