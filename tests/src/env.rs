//! One test's world, [`Env`]: its Redis, its database and stream names,
//! the runs it submitted, and the wait for quiescence.

use crate::{Database, Redis, rt, scratch};
use pelican_model::Db;
use pelican_model::ids::RunId;
use pelican_model::protocol::{KindPolicy, Policy, SubmitterEnd};
use pelican_real::live::{PgDb, RedisAddr, RedisStream, StreamNames};
use pelican_real::{Config, Entropy, Io, NoProbe, submit};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One test's world: its Redis, its database, its stream names.
pub struct Env {
    /// Redis.
    pub redis: Redis,
    /// Postgres URL.
    pub database_url: String,
    /// Stream prefix.
    pub stream: String,
    /// Job stream partitions (`--partitions`): one on a single server, one
    /// per master on a cluster.
    pub partitions: u16,
    /// Where process logs go.
    pub logs: PathBuf,
    _db: Option<Database>,
    pub(crate) procs: Vec<String>,
    /// Runs submitted and accepted.
    pub accepted: BTreeSet<RunId>,
    /// The mutant every process of this test runs with, if any.
    pub mutant: Option<String>,
    /// The protocol traces the processes write.
    pub traces: Vec<PathBuf>,
    /// How long [`Env::settle`] waits.
    pub settle_timeout: Duration,
    /// Side effects each run's job makes when it succeeds.
    pub effects: BTreeMap<RunId, u32>,
    /// Keep the process logs and traces when dropped (a panicking test
    /// keeps them anyway).
    pub keep_logs: bool,
    /// Give every process a `--trace-file` (on by default; the benchmarks
    /// measure without).
    pub trace: bool,
    /// The `pelican` binary its processes run, when not `PELICAN_BIN` (the
    /// benchmarks' baseline runs a build with the `mutants` feature).
    pub bin: Option<PathBuf>,
    /// The `--unknown-retries-max` its workers run with, for the audit.
    pub unknown_retries_max: u32,
    /// The kinds' policies its submissions follow (give workers the same,
    /// [`Env::kind_policy_args`]).
    pub kinds: BTreeMap<String, KindPolicy>,
}

impl Env {
    /// A fresh Redis and database, migrated.
    #[must_use]
    pub fn new() -> Env {
        Env::mutated(None)
    }

    /// A fresh Redis and database, migrated; every process runs `mutant`.
    #[must_use]
    pub fn mutated(mutant: Option<&str>) -> Env {
        let db = Database::create();
        let url = db.url().to_owned();
        Env::with_database(url, Some(db), mutant)
    }

    /// A fresh Redis, and the database at `url`, migrated.
    #[must_use]
    pub fn with_database(database_url: String, db: Option<Database>, mutant: Option<&str>) -> Env {
        Env::with_services(database_url, db, Redis::start(), mutant)
    }

    /// A fresh Redis Cluster (three masters with a replica each) and
    /// database, migrated; every process runs `mutant`.
    #[must_use]
    pub fn on_cluster(mutant: Option<&str>) -> Env {
        let db = Database::create();
        let url = db.url().to_owned();
        Env::with_services(url, Some(db), Redis::cluster(), mutant)
    }

    /// `redis`, and the database at `url`, migrated.
    #[must_use]
    pub fn with_services(
        database_url: String,
        db: Option<Database>,
        redis: Redis,
        mutant: Option<&str>,
    ) -> Env {
        let env = Env {
            mutant: mutant.map(str::to_owned),
            traces: Vec::new(),
            settle_timeout: if mutant.is_some() {
                Duration::from_secs(25)
            } else {
                Duration::from_secs(60)
            },
            partitions: if redis.is_cluster() {
                crate::services::CLUSTER_MASTERS
            } else {
                1
            },
            redis,
            database_url,
            stream: "pelican".into(),
            logs: scratch("pelican_logs"),
            _db: db,
            procs: Vec::new(),
            accepted: BTreeSet::new(),
            effects: BTreeMap::new(),
            keep_logs: false,
            trace: true,
            bin: None,
            unknown_retries_max: Policy::default().unknown_retries_max,
            kinds: BTreeMap::new(),
        };
        let out = env.cli(&["migrate"]);
        assert!(
            out.status.success(),
            "pelican migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        env
    }

    /// The clients, for submitting directly (as the API does).
    #[must_use]
    pub fn io(&self, attempts_max: u32) -> Io<RedisStream, PgDb, NoProbe> {
        let redis = RedisAddr::new(&self.redis.url(), self.redis.is_cluster());
        let db = self.database_url.clone();
        let names = self.names();
        let (stream, db) = rt().block_on(async move {
            let s = RedisStream::connect(&redis, names, 100, Duration::from_secs(2))
                .await
                .expect("the test's Redis answers");
            let d = PgDb::connect(&db, 2, Duration::from_secs(5))
                .await
                .expect("the test's Postgres answers");
            (s, d)
        });
        let config = Config {
            policy: Policy {
                attempts_max,
                kinds: self.kinds.clone(),
                partitions: self.partitions,
                mutant: self
                    .mutant
                    .as_deref()
                    .map(|m| m.parse().expect("a known mutant")),
                ..Policy::default()
            },
            ..Config::default()
        };
        Io {
            stream,
            db,
            probe: NoProbe,
            entropy: std::sync::Arc::new(Fixed),
            config,
        }
    }

    /// The stream names its processes use.
    #[must_use]
    pub fn names(&self) -> StreamNames {
        StreamNames::partitioned(&self.stream, "pelican", self.partitions)
            .expect("the test's prefix has no braces")
    }

    /// Submits `kind`/`input` with `attempts_max` attempts (as `POST /runs`).
    pub fn submit(&mut self, kind: &str, input: &str, attempts_max: u32) -> RunId {
        let io = self.io(attempts_max);
        let run = rt().block_on(submit_new(&io, kind, input));
        self.accepted.insert(run);
        self.effects
            .insert(run, pelican_real::jobs::effects_of(kind, input));
        run
    }

    /// Submits `n` no-op runs (inputs `{"i": 0}` on) with `pelican submit
    /// --from-file`, as an operator would load a backlog.
    ///
    /// # Panics
    /// When the command fails.
    pub fn submit_noops_from_file(&self, n: usize) {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(n * 40);
        for i in 0..n {
            let _ = writeln!(text, r#"{{"kind":"noop","input":{{"i":{i}}}}}"#);
        }
        let path = self.logs.join("noops.jsonl");
        std::fs::write(&path, text).expect("the log dir is writable");
        let out = self.cli(&["submit", "--from-file", &path.to_string_lossy()]);
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "submit --from-file: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `--kind-policy KIND:field=N,...` for each of [`Env::kinds`].
    #[must_use]
    pub fn kind_policy_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (kind, p) in &self.kinds {
            let fields = [
                ("attempts_max", p.attempts_max.map(u64::from)),
                ("backoff_base_ms", p.backoff_base_ms),
                ("backoff_cap_ms", p.backoff_cap_ms),
                ("attempt_timeout_ms", p.attempt_timeout_ms),
                ("budget_ms", p.budget_ms),
            ];
            let set: Vec<String> = fields
                .iter()
                .filter_map(|(name, v)| v.map(|v| format!("{name}={v}")))
                .collect();
            args.push("--kind-policy".to_owned());
            args.push(format!("{kind}:{}", set.join(",")));
        }
        args
    }

    /// Postgres, as the model's `Db`.
    #[must_use]
    pub fn db(&self) -> Db {
        let url = self.database_url.clone();
        rt().block_on(async move {
            let db = PgDb::connect(&url, 1, Duration::from_secs(5))
                .await
                .expect("the test's Postgres answers");
            db.snapshot().await.expect("a snapshot of the database")
        })
    }

    /// Waits until every accepted run is terminal, every entry delivered
    /// and the PEL empty.
    ///
    /// # Panics
    /// After `timeout`, with the runs still open and the process logs.
    pub fn settle(&self) -> Db {
        let timeout = self.settle_timeout;
        let start = Instant::now();
        loop {
            let db = self.db();
            let open: Vec<String> = self
                .accepted
                .iter()
                .filter_map(|r| match db.runs.get(r) {
                    Some(row) if row.status.is_terminal() => None,
                    Some(row) => Some(format!("{r} {}", row.status)),
                    None => Some(format!("{r} missing")),
                })
                .collect();
            // Runs not in `accepted` (a bulk submission's) count through
            // the stream alone.
            if open.is_empty() && self.stream_drained() {
                return db;
            }
            if start.elapsed() > timeout {
                let pel = self.pel_len();
                panic!(
                    "not settled within {timeout:?}: open runs [{}], {pel} pending; logs: {:?}",
                    open.join(", "),
                    self.procs
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Where the process logs are.
    #[must_use]
    pub fn log_files(&self) -> &[String] {
        &self.procs
    }
}

/// Submits a new run of `kind`/`input` through the protocol's submit path
/// (as `POST /runs`: a fresh run id, the row, the entry, the published mark).
///
/// # Panics
/// When the submission is not accepted. (`published: false` is accepted:
/// a worker claimed the run before the publication was marked; the run is in
/// the stream either way.)
pub async fn submit_new(io: &Io<RedisStream, PgDb, NoProbe>, kind: &str, input: &str) -> RunId {
    let run = match io
        .db
        .execute(&pelican_model::protocol::DbOp::NextRunId)
        .await
    {
        Ok(pelican_model::protocol::DbReply::NewRun(r)) => r,
        other => panic!("next run id: {other:?}"),
    };
    let end = submit(io, run, &pelican_real::NewRun::new(kind, input)).await;
    assert!(
        matches!(end, SubmitterEnd::Accepted { .. }),
        "submission of {run}: {end:?}"
    );
    run
}

impl Drop for Env {
    fn drop(&mut self) {
        // Keep the process logs of a failed test; their paths are in the
        // failure message.
        if !std::thread::panicking() && !self.keep_logs {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

pub(crate) struct Fixed;
impl Entropy for Fixed {
    fn next_u64(&self) -> u64 {
        4
    }
}
