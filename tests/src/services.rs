//! Throwaway services: Redis servers (AOF everysec), databases on the
//! shared Postgres server, and Postgres clusters of their own.

use crate::{free_port, rt, scratch, unique, wait_until};
use pelican_real::live::PgDb;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
        self.thaw();
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

    /// SIGSTOP: the server holds its connections and answers nothing.
    pub fn freeze(&self) {
        if let Some(c) = &self.child {
            crate::processes::signal(c.id(), "-STOP");
        }
    }

    /// SIGCONT after [`Redis::freeze`].
    pub fn thaw(&self) {
        if let Some(c) = &self.child {
            crate::processes::signal(c.id(), "-CONT");
        }
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
