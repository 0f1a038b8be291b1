//! The harness of Pelican's live tests: throwaway Redis servers (AOF
//! everysec) and Postgres databases or clusters, real `pelican` processes
//! (the binary named by `PELICAN_BIN`, built with the `failpoints` feature),
//! and the end-of-test check of the guarantees on the live state.
//!
//! Services: `redis-server` must be on `PATH`; Postgres must accept
//! connections at `PELICAN_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), where each test creates
//! its own database; the Postgres-restart test also needs `initdb` and
//! `pg_ctl` to run a cluster of its own. A missing service fails the test
//! with what to do, never skips it. `cargo xtask test` builds the binary and
//! `.ci/run` installs and starts the services.

use pelican_model::ids::{EntryId, RunId};
use pelican_model::protocol::{Policy, SubmitterEnd};
use pelican_model::status::{AttemptOutcome, RunStatus};
use pelican_model::world::World;
use pelican_model::{Db, invariants};
use pelican_real::live::{PgDb, RedisStream, StreamNames};
use pelican_real::{Config, Entropy, Io, NoProbe, submit};
use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod conformance;
pub mod scenarios;

/// The shared async runtime the harness talks to Postgres and Redis with.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    })
}

/// The `pelican` binary under test.
///
/// # Panics
/// When `PELICAN_BIN` is unset or wrong: say how to run the tests.
pub fn pelican_bin() -> PathBuf {
    let bin = std::env::var_os("PELICAN_BIN").unwrap_or_else(|| {
        panic!(
            "PELICAN_BIN is not set: run the live tests with `cargo xtask test` (it builds \
             `pelican` with the failpoints feature and sets PELICAN_BIN)"
        )
    });
    let bin = PathBuf::from(bin);
    assert!(bin.is_file(), "PELICAN_BIN={} is not a file", bin.display());
    bin
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name no other test of this process uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh scratch directory (removed by its owner's drop).
pub fn scratch(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(prefix));
    std::fs::create_dir_all(&dir).expect("the temp dir is writable");
    dir
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding an ephemeral port")
        .port()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A throwaway Redis server with AOF (`appendfsync everysec`), on its own
/// port and directory.
pub struct Redis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts one.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start.
    #[must_use]
    pub fn start() -> Redis {
        let mut r = Redis {
            child: None,
            port: free_port(),
            dir: scratch("pelican_redis"),
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install Redis >= 7 (.ci/run does)")
            });
        self.child = Some(child);
        let url = self.url();
        wait_until("redis-server answers PING", Duration::from_secs(10), || {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection.
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("the test's Redis answers")
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9 and start again on the same directory: Redis replays its AOF
    /// (up to a second of writes may be lost).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// kill -9 and start with nothing: the streams and the group are gone.
    pub fn wipe(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).expect("the temp dir is writable");
        self.spawn();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shared Postgres server's admin URL.
#[must_use]
pub fn pg_admin_url() -> String {
    std::env::var("PELICAN_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn admin_exec(admin_url: &str, sql: &str) {
    let url = admin_url.to_owned();
    let sql = sql.to_owned();
    rt().block_on(async move {
        let db = PgDb::connect(&url, 1, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| {
                panic!("cannot reach Postgres at {url} ({e}): start it, or set PELICAN_TEST_PG (.ci/run starts one)")
            });
        sqlx_exec(&db, &sql).await;
    });
}

async fn sqlx_exec(db: &PgDb, sql: &str) {
    use pelican_real::live::pg::raw_execute;
    raw_execute(db, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A database of its own on the shared Postgres server, dropped at the end.
pub struct Database {
    admin: String,
    name: String,
    url: String,
}

impl Database {
    /// Creates one.
    #[must_use]
    pub fn create() -> Database {
        Database::create_on(&pg_admin_url())
    }

    /// Creates one on the server of `admin` (a URL of an existing database).
    #[must_use]
    pub fn create_on(admin: &str) -> Database {
        let name = unique("pelican_t");
        admin_exec(admin, &format!("CREATE DATABASE {name}"));
        let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
        Database {
            admin: admin.to_owned(),
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let _ = std::panic::catch_unwind(|| admin_exec(&admin, &sql));
        })
        .join();
    }
}

/// A Postgres cluster of its own (initdb in a scratch directory), for the
/// test that restarts Postgres. Root runs it as the `postgres` user.
pub struct Cluster {
    dir: PathBuf,
    port: u16,
}

fn as_postgres(cmd: &str, args: &[&str]) -> Command {
    let root = std::env::var("USER").is_ok_and(|u| u == "root")
        || Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", cmd]).args(args);
        c
    } else {
        let mut c = Command::new(cmd);
        c.args(args);
        c
    }
}

fn pg_tool(name: &str) -> String {
    // Debian keeps the server tools out of PATH.
    if let Ok(dirs) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut found: Vec<PathBuf> = dirs
            .filter_map(|d| d.ok().map(|d| d.path().join("bin").join(name)))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return p.display().to_string();
        }
    }
    name.to_owned()
}

impl Cluster {
    /// initdb and start.
    ///
    /// # Panics
    /// When initdb or pg_ctl are missing or fail.
    #[must_use]
    pub fn start() -> Cluster {
        let dir = scratch("pelican_pg");
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status();
        let data = dir.join("data");
        let data_s = data.display().to_string();
        let ok = as_postgres(
            &pg_tool("initdb"),
            &["-D", &data_s, "-A", "trust", "-U", "postgres"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
        assert!(ok, "initdb failed: install PostgreSQL (.ci/run does)");
        let c = Cluster {
            dir,
            port: free_port(),
        };
        c.pg_ctl("start");
        c
    }

    fn pg_ctl(&self, action: &str) {
        let data = self.dir.join("data").display().to_string();
        let log = self.dir.join("log").display().to_string();
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.display()
        );
        let mut args = vec!["-D", &data, "-l", &log, "-w", "-m", "immediate"];
        if action != "stop" {
            args.extend(["-o", &opts]);
        }
        args.push(action);
        let ok = as_postgres(&pg_tool("pg_ctl"), &args)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pg_ctl {action} failed; see {log}");
    }

    /// The admin URL (database `postgres`).
    #[must_use]
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Immediate shutdown (as a crash) and start again: committed data stays.
    pub fn restart(&self) {
        self.pg_ctl("stop");
        std::thread::sleep(Duration::from_millis(500));
        self.pg_ctl("start");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let _ = as_postgres(
            &pg_tool("pg_ctl"),
            &["-D", &data, "-m", "immediate", "stop"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

thread_local! {
    static TRACES: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The trace files of the processes this thread started since the last
/// call (a scenario that panicked still leaves them on disk).
#[must_use]
pub fn take_traces() -> Vec<PathBuf> {
    TRACES.with(|t| std::mem::take(&mut *t.borrow_mut()))
}

/// One test's world: its Redis, its database, its stream names.
pub struct Env {
    /// Redis.
    pub redis: Redis,
    /// Postgres URL.
    pub database_url: String,
    /// Stream prefix.
    pub stream: String,
    /// Where process logs go.
    pub logs: PathBuf,
    _db: Option<Database>,
    procs: Vec<String>,
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
        let env = Env {
            mutant: mutant.map(str::to_owned),
            traces: Vec::new(),
            settle_timeout: if mutant.is_some() {
                Duration::from_secs(25)
            } else {
                Duration::from_secs(60)
            },
            redis: Redis::start(),
            database_url,
            stream: "pelican".into(),
            logs: scratch("pelican_logs"),
            _db: db,
            procs: Vec::new(),
            accepted: BTreeSet::new(),
            effects: BTreeMap::new(),
        };
        let out = env.cli(&["migrate"]);
        assert!(
            out.status.success(),
            "pelican migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        env
    }

    fn command(&self) -> Command {
        let mut c = Command::new(pelican_bin());
        c.env("REDIS_URL", self.redis.url())
            .env("DATABASE_URL", &self.database_url)
            .env("PELICAN_STREAM", &self.stream)
            .env("PELICAN_CALL_TIMEOUT_MS", "1000")
            .env_remove("FAILPOINTS");
        match &self.mutant {
            Some(m) => c.env("PELICAN_MUTANT", m),
            None => c.env_remove("PELICAN_MUTANT"),
        };
        c
    }

    /// Runs a `pelican` command to its end.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.command()
            .args(args)
            .output()
            .expect("the pelican binary runs")
    }

    /// Starts a worker with the test timings (lease 2 s, heartbeat 400 ms,
    /// reclaim after 2.5 s idle, sweep grace 3 s), plus `flags`, with the
    /// crash point `failpoint` armed if given.
    pub fn worker(&mut self, id: u32, failpoint: Option<&str>, flags: &[&str]) -> Proc {
        let mut c = self.command();
        c.args(["worker", "--id", &id.to_string()]);
        let defaults = [
            ("--lease-ms", "2000"),
            ("--heartbeat-ms", "400"),
            ("--reclaim-min-idle-ms", "2500"),
            ("--reclaim-every-ms", "500"),
            ("--backoff-base-ms", "100"),
            ("--backoff-cap-ms", "400"),
            ("--sweep-grace-ms", "3000"),
            ("--maintenance-every-ms", "300"),
            ("--read-block-ms", "200"),
            ("--shutdown-grace-ms", "5000"),
        ];
        for (flag, value) in defaults {
            if !flags.contains(&flag) {
                c.args([flag, value]);
            }
        }
        c.args(flags);
        let trace = self
            .logs
            .join(format!("{:02}-worker-{id}.trace.jsonl", self.procs.len()));
        c.arg("--trace-file").arg(&trace);
        self.traces.push(trace.clone());
        TRACES.with(|t| t.borrow_mut().push(trace));
        if let Some(fp) = failpoint {
            c.env("FAILPOINTS", format!("{fp}=return"));
        }
        self.spawn(&format!("worker-{id}"), c)
    }

    /// Starts the API on a free port with bearer token `token`.
    pub fn api(&mut self, token: &str) -> (Proc, String) {
        let port = free_port();
        let mut c = self.command();
        c.args(["api", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--api-token", token, "--body-limit-bytes", "4096"])
            .args(["--attempts-max", "3"]);
        let trace = self
            .logs
            .join(format!("{:02}-api.trace.jsonl", self.procs.len()));
        c.arg("--trace-file").arg(&trace);
        self.traces.push(trace.clone());
        TRACES.with(|t| t.borrow_mut().push(trace));
        let p = self.spawn("api", c);
        let base = format!("http://127.0.0.1:{port}");
        let health = format!("{base}/healthz");
        wait_until("the API answers /healthz", Duration::from_secs(15), || {
            ureq::get(&health).call().is_ok()
        });
        (p, base)
    }

    fn spawn(&mut self, name: &str, mut c: Command) -> Proc {
        let n = self.procs.len();
        let log = self.logs.join(format!("{n:02}-{name}.log"));
        let file = std::fs::File::create(&log).expect("the log dir is writable");
        let child = c
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the pelican binary starts");
        self.procs.push(log.display().to_string());
        Proc {
            child,
            name: name.to_owned(),
            log,
        }
    }

    /// The clients, for submitting directly (as the API does).
    #[must_use]
    pub fn io(&self, attempts_max: u32) -> Io<RedisStream, PgDb, NoProbe> {
        let (redis, db) = (self.redis.url(), self.database_url.clone());
        let stream = self.stream.clone();
        let (stream, db) = rt().block_on(async move {
            let s = RedisStream::connect(
                &redis,
                StreamNames::new(&stream, "pelican"),
                100,
                Duration::from_secs(2),
            )
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

    /// Submits `kind`/`input` with `attempts_max` attempts (as `POST /runs`).
    pub fn submit(&mut self, kind: &str, input: &str, attempts_max: u32) -> RunId {
        let io = self.io(attempts_max);
        let (k, i) = (kind.to_owned(), input.to_owned());
        let run = rt().block_on(async move {
            let run = match io
                .db
                .execute(&pelican_model::protocol::DbOp::NextRunId)
                .await
            {
                Ok(pelican_model::protocol::DbReply::NewRun(r)) => r,
                other => panic!("next run id: {other:?}"),
            };
            // `published: false` when a worker claimed the run before the
            // publication was marked: the run is in the stream either way.
            let end = submit(&io, run, &k, &i).await;
            assert!(matches!(end, SubmitterEnd::Accepted { .. }), "{end:?}");
            run
        });
        self.accepted.insert(run);
        self.effects
            .insert(run, pelican_real::jobs::effects_of(kind, input));
        run
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

    /// The stream key.
    #[must_use]
    pub fn jobs_key(&self) -> String {
        format!("{}:jobs", self.stream)
    }

    /// Pending deliveries (0 when the group is gone).
    #[must_use]
    pub fn pel_len(&self) -> u64 {
        let mut c = self.redis.conn();
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(self.jobs_key())
            .arg("pelican")
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        match v {
            redis::Value::Array(parts) => match parts.first() {
                Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            },
            _ => 0,
        }
    }

    /// Whether the stream holds entries the group has not delivered yet.
    #[must_use]
    pub fn undelivered(&self) -> bool {
        let mut c = self.redis.conn();
        let newest: redis::Value = redis::cmd("XREVRANGE")
            .arg(self.jobs_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let id_text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse::<EntryId>().ok(),
            _ => None,
        };
        let newest = match &newest {
            redis::Value::Array(es) => es.first().and_then(|e| match e {
                redis::Value::Array(p) => p.first().and_then(id_text),
                _ => None,
            }),
            _ => None,
        };
        let Some(newest) = newest else { return false };
        let groups: redis::Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(self.jobs_key())
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let last = match &groups {
            redis::Value::Array(gs) => gs.iter().find_map(|g| match g {
                redis::Value::Array(kv) => kv
                    .chunks(2)
                    .find(|p| matches!(&p[0], redis::Value::BulkString(k) if k == b"last-delivered-id"))
                    .and_then(|p| id_text(&p[1])),
                redis::Value::Map(kv) => kv
                    .iter()
                    .find(|(k, _)| matches!(k, redis::Value::BulkString(k) if k == b"last-delivered-id"))
                    .and_then(|(_, v)| id_text(v)),
                _ => None,
            }),
            _ => None,
        };
        last.is_none_or(|last| newest > last)
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
            let pel = self.pel_len();
            if open.is_empty() && pel == 0 && !self.undelivered() {
                return db;
            }
            if start.elapsed() > timeout {
                panic!(
                    "not settled within {timeout:?}: open runs [{}], {pel} pending; logs: {:?}",
                    open.join(", "),
                    self.procs
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The guarantees on the final state (after [`Env::settle`]): S1 every
    /// accepted run terminal; S2 a succeeded run has exactly one succeeded
    /// attempt; S5 each side effect of a succeeded run requested under one
    /// key only, and applied; S6 the state invariants (attempts within
    /// bounds, dead runs have dead letters); S9 the PEL empty; S10 each
    /// entry in `malformed` quarantined on the dead-letter stream.
    ///
    /// # Panics
    /// Listing every guarantee broken.
    pub fn check(&self, malformed: &[EntryId]) -> Db {
        let db = self.db();
        let mut broken = Vec::new();
        let world = World {
            db: db.clone(),
            accepted: self.accepted.clone(),
            ..World::default()
        };
        let policy = Policy {
            attempts_max: u32::MAX,
            ..Policy::default()
        };
        for b in invariants::state(&world, &policy) {
            broken.push(format!("{} {}", b.guarantee, b.detail));
        }
        for run in &self.accepted {
            let Some(r) = db.runs.get(run) else {
                broken.push(format!("S1 {run} has no row"));
                continue;
            };
            if !r.status.is_terminal() {
                broken.push(format!("S1 {run} is {}", r.status));
            }
            if r.attempts > r.attempts_max {
                broken.push(format!(
                    "S6 {run} ran {} of {} attempts",
                    r.attempts, r.attempts_max
                ));
            }
            let succeeded = db
                .read_attempts(*run)
                .iter()
                .filter(|(_, a)| a.outcome == Some(AttemptOutcome::Succeeded))
                .count();
            let want = usize::from(r.status == RunStatus::Succeeded);
            if succeeded != want {
                broken.push(format!(
                    "S2 {run} is {} with {succeeded} succeeded attempts",
                    r.status
                ));
            }
            if r.status == RunStatus::Succeeded {
                for call in 0..self.effects.get(run).copied().unwrap_or(0) {
                    let prefix = format!("{run}/{call}");
                    let keys: Vec<&String> = db
                        .effects
                        .keys()
                        .filter(|k| *k == &prefix || k.starts_with(&format!("{prefix}/")))
                        .collect();
                    if keys.len() != 1 {
                        broken.push(format!(
                            "S5 effect {prefix} applied under {} keys: {keys:?}",
                            keys.len()
                        ));
                    }
                }
            }
        }
        let pel = self.pel_len();
        if pel != 0 {
            broken.push(format!("S9 {pel} deliveries left pending"));
        }
        // A process that had not started yet wrote no trace.
        for t in self.traces.iter().filter(|t| t.exists()) {
            if let Err(r) = pelican_real::trace::check_file(t) {
                broken.push(format!("trace {} does not conform: {r}", t.display()));
            }
        }
        let quarantined = self.quarantined();
        for id in malformed {
            if !quarantined.contains(id) {
                broken.push(format!("S10 malformed entry {id} was not quarantined"));
            }
        }
        assert!(
            broken.is_empty(),
            "guarantees broken:\n  {}\nlogs: {:?}",
            broken.join("\n  "),
            self.procs
        );
        db
    }

    /// The job entries quarantined on the dead-letter stream.
    #[must_use]
    pub fn quarantined(&self) -> BTreeSet<EntryId> {
        let mut c = self.redis.conn();
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(format!("{}:jobs:dead", self.stream))
            .arg("-")
            .arg("+")
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let mut out = BTreeSet::new();
        if let redis::Value::Array(entries) = v {
            for e in entries {
                let redis::Value::Array(parts) = e else {
                    continue;
                };
                let Some(redis::Value::Array(fields)) = parts.get(1) else {
                    continue;
                };
                let text = |v: &redis::Value| match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                };
                let kv: Vec<(String, String)> = fields
                    .chunks(2)
                    .filter_map(|p| match p {
                        [k, v] => Some((text(k), text(v))),
                        _ => None,
                    })
                    .collect();
                let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
                if get("kind").as_deref() == Some("quarantined")
                    && let Some(id) = get("source").and_then(|s| s.parse().ok())
                {
                    out.insert(id);
                }
            }
        }
        out
    }

    /// XADDs raw fields to the job stream (for malformed entries and
    /// duplicate publications).
    pub fn xadd(&self, fields: &[(&str, &str)]) -> EntryId {
        let mut c = self.redis.conn();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        let id: String = cmd.query(&mut c).expect("XADD to the test's Redis");
        id.parse().expect("Redis answers an entry ID")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Keep the process logs of a failed test; their paths are in the
        // failure message.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

struct Fixed;
impl Entropy for Fixed {
    fn next_u64(&self) -> u64 {
        4
    }
}

/// A running `pelican` process.
pub struct Proc {
    child: Child,
    /// Its name in the logs.
    pub name: String,
    /// Its stderr.
    pub log: PathBuf,
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

impl Proc {
    /// kill -9.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM.
    pub fn term(&self) {
        signal(self.child.id(), "-TERM");
    }

    /// SIGSTOP (a pause: the process keeps its connections and leases
    /// expire).
    pub fn stop(&self) {
        signal(self.child.id(), "-STOP");
    }

    /// SIGCONT.
    pub fn cont(&self) {
        signal(self.child.id(), "-CONT");
    }

    /// Waits for the process to exit.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("waiting on a child") {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "{} did not exit within {timeout:?}; log {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
