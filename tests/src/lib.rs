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
pub use pelican_model::invariants::{Broken, Guarantee};
use pelican_model::protocol::{Policy, SubmitterEnd};
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

pub mod bench;
pub mod chaos;
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

    /// Runs `pg_ctl`; the server gets `PELICAN_PG_OPTS` (extra `-c name=value`
    /// settings, for experiments) after the fixed ones.
    fn pg_ctl(&self, action: &str) {
        let data = self.dir.join("data").display().to_string();
        let log = self.dir.join("log").display().to_string();
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on {}",
            self.port,
            self.dir.display(),
            std::env::var("PELICAN_PG_OPTS").unwrap_or_default()
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
    /// Keep the process logs and traces when dropped (a panicking test
    /// keeps them anyway).
    pub keep_logs: bool,
    /// Give every process a `--trace-file` (on by default; the benchmarks
    /// measure without).
    pub trace: bool,
    /// The `pelican` binary its processes run, when not `PELICAN_BIN` (the
    /// benchmarks' baseline runs a build with the `mutants` feature).
    pub bin: Option<PathBuf>,
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
            keep_logs: false,
            trace: true,
            bin: None,
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
        let mut c = Command::new(self.bin.clone().unwrap_or_else(pelican_bin));
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
    /// crash point `failpoint` armed if given (or, for `name=action`, that
    /// failpoint with that action, e.g. `before_write=1*sleep(6000)`).
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
        if self.trace {
            let trace = self
                .logs
                .join(format!("{:02}-worker-{id}.trace.jsonl", self.procs.len()));
            c.arg("--trace-file").arg(&trace);
            self.traces.push(trace.clone());
            TRACES.with(|t| t.borrow_mut().push(trace));
        }
        if let Some(fp) = failpoint {
            // A bare name is a crash point; `name=action` is passed as is.
            let spec = if fp.contains('=') {
                fp.to_owned()
            } else {
                format!("{fp}=return")
            };
            c.env("FAILPOINTS", spec);
        }
        self.spawn(&format!("worker-{id}"), c)
    }

    /// Starts the API on a free port with bearer token `token` (runs get
    /// 3 attempts).
    pub fn api(&mut self, token: &str) -> (Proc, String) {
        self.api_with(token, 3)
    }

    /// Starts the API on a free port with bearer token `token`; its runs
    /// get `attempts_max` attempts.
    pub fn api_with(&mut self, token: &str, attempts_max: u32) -> (Proc, String) {
        let port = free_port();
        let mut c = self.command();
        c.args(["api", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--api-token", token, "--body-limit-bytes", "4096"])
            .args(["--attempts-max", &attempts_max.to_string()]);
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
        let run = rt().block_on(submit_new(&io, kind, input));
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
            db: self.db(),
            accepted: self.accepted.clone(),
            ..World::default()
        };
        let db = &world.db;
        let policy = Policy {
            attempts_max: u32::MAX,
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

    /// Where the process logs are.
    #[must_use]
    pub fn log_files(&self) -> &[String] {
        &self.procs
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

    /// XADDs raw bytes to the job stream; `None` when Redis does not answer.
    pub fn xadd_raw(&self, fields: &[(&[u8], Vec<u8>)]) -> Option<EntryId> {
        let mut c = redis::Client::open(self.redis.url())
            .and_then(|c| c.get_connection())
            .ok()?;
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(v.as_slice());
        }
        let id: String = cmd.query(&mut c).ok()?;
        id.parse().ok()
    }

    /// Which of `ids` are still entries of the job stream.
    #[must_use]
    pub fn present(&self, ids: &[EntryId]) -> Vec<EntryId> {
        let mut c = self.redis.conn();
        ids.iter()
            .copied()
            .filter(|id| {
                let v: redis::Value = redis::cmd("XRANGE")
                    .arg(self.jobs_key())
                    .arg(id.to_string())
                    .arg(id.to_string())
                    .query(&mut c)
                    .unwrap_or(redis::Value::Nil);
                matches!(v, redis::Value::Array(ref es) if !es.is_empty())
            })
            .collect()
    }

    /// Pending entry IDs (up to 1,000), oldest first.
    fn pending_ids(&self, c: &mut redis::Connection) -> Vec<String> {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(self.jobs_key())
            .arg("pelican")
            .arg("-")
            .arg("+")
            .arg(1000)
            .query(c)
            .unwrap_or(redis::Value::Nil);
        let redis::Value::Array(rows) = v else {
            return Vec::new();
        };
        rows.iter()
            .filter_map(|r| match r {
                redis::Value::Array(p) => match p.first() {
                    Some(redis::Value::BulkString(b)) => {
                        Some(String::from_utf8_lossy(b).into_owned())
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// Removes entries below pending IDs: XTRIM MINID at the median pending
    /// ID (everything older goes, pending or not), or, with `xdel`, XDEL of
    /// the oldest pending entry. Returns how many entries went (0 when
    /// nothing was pending or Redis did not answer).
    pub fn trim_below_pending(&self, xdel: bool) -> u64 {
        let Ok(mut c) = redis::Client::open(self.redis.url()).and_then(|c| c.get_connection())
        else {
            return 0;
        };
        let pending = self.pending_ids(&mut c);
        let removed: redis::RedisResult<u64> = if xdel {
            let Some(id) = pending.first() else { return 0 };
            redis::cmd("XDEL")
                .arg(self.jobs_key())
                .arg(id)
                .query(&mut c)
        } else {
            let Some(id) = pending.get(pending.len() / 2) else {
                return 0;
            };
            redis::cmd("XTRIM")
                .arg(self.jobs_key())
                .arg("MINID")
                .arg(id)
                .query(&mut c)
        };
        removed.unwrap_or(0)
    }

    /// XADDs a copy of one of the newest job entries (a publisher that
    /// retried after a lost reply); false when there was none or Redis did
    /// not answer.
    pub fn publish_again(&self) -> bool {
        let Ok(mut c) = redis::Client::open(self.redis.url()).and_then(|c| c.get_connection())
        else {
            return false;
        };
        let v: redis::Value = redis::cmd("XREVRANGE")
            .arg(self.jobs_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(20)
            .query(&mut c)
            .unwrap_or(redis::Value::Nil);
        let redis::Value::Array(entries) = v else {
            return false;
        };
        let job = entries.iter().rev().find_map(|e| {
            let redis::Value::Array(parts) = e else {
                return None;
            };
            let Some(redis::Value::Array(fields)) = parts.get(1) else {
                return None;
            };
            let kv: Vec<Vec<u8>> = fields
                .iter()
                .filter_map(|f| match f {
                    redis::Value::BulkString(b) => Some(b.clone()),
                    _ => None,
                })
                .collect();
            let is_job = kv.len() == 4 && kv[0] == b"run_id" && kv[2] == b"dispatch";
            is_job.then_some(kv)
        });
        let Some(kv) = job else { return false };
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.jobs_key()).arg("*");
        for f in &kv {
            cmd.arg(f.as_slice());
        }
        cmd.query::<String>(&mut c).is_ok()
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
    let end = submit(io, run, kind, input).await;
    assert!(
        matches!(end, SubmitterEnd::Accepted { .. }),
        "submission of {run}: {end:?}"
    );
    run
}

/// `x` rounded to `digits` decimals (for reports).
#[must_use]
pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Stale writes Postgres accepted, read off the processes' protocol traces:
/// a fenced write (any database command carrying a fence) answered with
/// rows changed, sent by a role whose own claim had fence `f`, after some
/// role had already received the claim of the same run with a fence above
/// `f`. Sound on one host: a role sends a command only after the input
/// received before it, whose time the trace records, so the write left
/// after the newer claim had committed, and a fenced database must have
/// refused it. (With one wall clock for all processes; the comparison is
/// strict, in milliseconds.)
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
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(sent) = v.get("sent") {
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
                let now = recv["now"].as_u64().unwrap_or(role.last_now);
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

#[cfg(test)]
mod tests {
    use super::stale_writes_in_traces;

    fn trace(lines: &[&str]) -> std::path::PathBuf {
        let path = super::scratch("pelican_trace_test").join("t.jsonl");
        std::fs::write(&path, lines.join("\n")).expect("writable");
        path
    }

    const A: &str = r#"{"Delivery":[1,{"ms":1,"seq":0},0]}"#;
    const B: &str = r#"{"Delivery":[2,{"ms":1,"seq":0},0]}"#;

    fn claim(role: &str, fence: u64, at: u64) -> [String; 2] {
        [
            format!(
                r#"{{"sent":{{"role":{role},"command":{{"Db":{{"Claim":{{"run":7,"dispatch":1}}}}}}}}}}"#
            ),
            format!(
                r#"{{"received":{{"role":{role},"now":{at},"input":{{"Db":{{"Claimed":{{"claimed":{{"fence":{fence}}}}}}}}}}}}}"#
            ),
        ]
    }

    fn write(role: &str, fence: u64, after: u64, rows: u64) -> [String; 3] {
        [
            format!(
                r#"{{"received":{{"role":{role},"now":{after},"input":{{"Executed":{{}}}}}}}}"#
            ),
            format!(
                r#"{{"sent":{{"role":{role},"command":{{"Db":{{"Complete":{{"run":7,"fence":{fence},"result":"null"}}}}}}}}}}"#
            ),
            format!(
                r#"{{"received":{{"role":{role},"now":{},"input":{{"Db":{{"Rows":{rows}}}}}}}}}"#,
                after + 1
            ),
        ]
    }

    fn lines(parts: &[&[String]]) -> Vec<String> {
        parts.iter().flat_map(|p| p.iter().cloned()).collect()
    }

    #[test]
    fn a_write_accepted_after_a_newer_claim_is_stale() {
        // A claims fence 1; B claims fence 2 at 100; A's write (with the
        // fence it read, as NoFence does) is accepted at 200.
        let a = lines(&[&claim(A, 1, 10), &write(A, 2, 200, 1)]);
        let b = lines(&[&claim(B, 2, 100)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let pb = trace(&b.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(stale_writes_in_traces(&[pa.clone(), pb.clone()]).len(), 1);
        // Refused (0 rows): fine.
        let a = lines(&[&claim(A, 1, 10), &write(A, 1, 200, 0)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(stale_writes_in_traces(&[pa, pb.clone()]).is_empty());
        // Accepted before the newer claim: fine.
        let a = lines(&[&claim(A, 1, 10), &write(A, 1, 50, 1)]);
        let pa = trace(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(stale_writes_in_traces(&[pa, pb]).is_empty());
    }
}
