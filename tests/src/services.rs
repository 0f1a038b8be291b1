//! Throwaway services: Redis servers (AOF everysec), databases on the
//! shared Postgres server, and Postgres clusters of their own.

use crate::{free_port, rt, scratch, unique, wait_until};
use pelican_real::live::PgDb;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The masters of a test's Redis Cluster (each with a replica).
pub const CLUSTER_MASTERS: u16 = 3;

/// A throwaway Redis: one server with AOF (`appendfsync everysec`) on its
/// own port and directory, or a Redis Cluster of such servers (three
/// masters, each with a replica), as `redis-cli --cluster create` makes it.
pub struct Redis {
    nodes: Vec<Node>,
    cluster: bool,
}

/// One `redis-server` process.
struct Node {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    cluster: bool,
}

/// A connection to a [`Redis`]: the server's, or a cluster connection that
/// sends each command to its key's master.
pub enum RedisConnection {
    /// One server.
    Server(redis::Connection),
    /// A cluster.
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl redis::ConnectionLike for RedisConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            RedisConnection::Server(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            RedisConnection::Server(c) => c.req_packed_commands(cmd, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            RedisConnection::Server(c) => c.req_command(cmd),
            RedisConnection::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Server(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }

    fn supports_pipelining(&self) -> bool {
        match self {
            RedisConnection::Server(c) => c.supports_pipelining(),
            RedisConnection::Cluster(c) => c.supports_pipelining(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            RedisConnection::Server(c) => c.check_connection(),
            RedisConnection::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            RedisConnection::Server(c) => c.is_open(),
            RedisConnection::Cluster(c) => c.is_open(),
        }
    }
}

impl Node {
    fn start(cluster: bool) -> Node {
        let mut n = Node {
            child: None,
            port: free_port(),
            dir: scratch("pelican_redis"),
            cluster,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .arg("--dir")
            .arg(&self.dir);
        if self.cluster {
            // A second without its master and a replica takes over, however
            // long it was cut off (validity factor 0).
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
            ]);
        }
        let child = cmd
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

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection whose calls give up after a few seconds: a node can be
    /// stopped (SIGSTOP), and a stopped node accepts connections but
    /// answers nothing.
    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let c =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        c.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(c)
    }

    fn kill(&mut self) {
        self.thaw();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            crate::processes::signal(c.id(), sig);
        }
    }

    fn thaw(&self) {
        self.signal("-CONT");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Redis {
    /// `INFO section` of every running server, in node order.
    ///
    /// # Panics
    /// When a running server does not answer.
    #[must_use]
    pub fn info_each(&self, section: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| {
                n.conn()
                    .and_then(|mut c| redis::cmd("INFO").arg(section).query::<String>(&mut c))
                    .unwrap_or_else(|e| panic!("INFO {section} of {}: {e}", n.url()))
            })
            .collect()
    }

    /// The running servers' process ids.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// Starts one server.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start.
    #[must_use]
    pub fn start() -> Redis {
        Redis {
            nodes: vec![Node::start(false)],
            cluster: false,
        }
    }

    /// Starts a Redis Cluster: six servers, made three masters with a
    /// replica each by `redis-cli --cluster create`; returns once every
    /// node reports the cluster ok and every master has its replica.
    ///
    /// # Panics
    /// When a server does not start or the cluster does not form.
    #[must_use]
    pub fn cluster() -> Redis {
        let nodes: Vec<Node> = (0..2 * CLUSTER_MASTERS)
            .map(|_| Node::start(true))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install Redis >= 7"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let r = Redis {
            nodes,
            cluster: true,
        };
        r.wait_healthy(Duration::from_secs(30));
        r
    }

    /// Whether this is a cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Its URL: the server's, or every node's, separated by commas (as
    /// `--redis-url` takes a cluster's with `--redis-cluster`).
    #[must_use]
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(Node::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A connection, or `None` when Redis does not answer.
    #[must_use]
    pub fn try_conn(&self) -> Option<RedisConnection> {
        if self.cluster {
            let urls: Vec<String> = self.nodes.iter().map(Node::url).collect();
            redis::cluster::ClusterClient::builder(urls)
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(5))
                .build()
                .and_then(|c| c.get_connection())
                .ok()
                .map(|c| RedisConnection::Cluster(Box::new(c)))
        } else {
            self.nodes[0].conn().ok().map(RedisConnection::Server)
        }
    }

    /// A connection.
    ///
    /// # Panics
    /// When Redis does not answer.
    #[must_use]
    pub fn conn(&self) -> RedisConnection {
        self.try_conn().expect("the test's Redis answers")
    }

    fn single(&mut self, what: &str) -> &mut Node {
        assert!(
            !self.cluster,
            "{what} is for a single server, not a cluster"
        );
        &mut self.nodes[0]
    }

    /// kill -9 and start again on the same directory: Redis replays its AOF
    /// (up to a second of writes may be lost).
    pub fn restart(&mut self) {
        let n = self.single("restart");
        n.kill();
        n.spawn();
    }

    /// SIGSTOP: the server holds its connections and answers nothing.
    pub fn freeze(&mut self) {
        self.single("freeze").signal("-STOP");
    }

    /// SIGCONT after [`Redis::freeze`].
    pub fn thaw(&mut self) {
        self.single("thaw").thaw();
    }

    /// kill -9 and start with nothing: the streams and the group are gone.
    pub fn wipe(&mut self) {
        let n = self.single("wipe");
        n.kill();
        let _ = std::fs::remove_dir_all(&n.dir);
        std::fs::create_dir_all(&n.dir).expect("the temp dir is writable");
        n.spawn();
    }

    /// `CLUSTER NODES` of `key`'s slot, read off a node that answers:
    /// the slot and the node table.
    fn slot_and_nodes(&self, key: &str) -> Option<(u16, String)> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find_map(|n| {
                let mut c = n.conn().ok()?;
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut c)
                    .ok()?;
                let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
                Some((slot, nodes))
            })
    }

    /// The port of the master that serves `key`'s slot.
    /// The port of the master that serves `key`'s slot now.
    #[must_use]
    pub fn master_of(&self, key: &str) -> Option<u16> {
        let (slot, nodes) = self.slot_and_nodes(key)?;
        master_serving(&nodes, slot).map(|(port, _)| port)
    }

    fn node_at(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a port of one of the test's nodes")
    }

    /// Holds back the replica of `key`'s master: stops it (SIGSTOP) and
    /// has the master drop its link, so that what the master acknowledges
    /// from now on reaches no replica, and a failover
    /// ([`Redis::fail_over`], which resumes the replica) loses it.
    ///
    /// # Panics
    /// On a single server, or when the cluster does not answer.
    pub fn hold_replica(&mut self, key: &str) {
        assert!(self.cluster, "hold_replica needs a cluster");
        let (slot, nodes) = self
            .slot_and_nodes(key)
            .expect("a node of the cluster answers CLUSTER NODES");
        let (master_port, master) = master_serving(&nodes, slot).expect("the slot has a master");
        let port = nodes
            .lines()
            .find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (f.get(2)?.contains("slave") && *f.get(3)? == master).then(|| node_port(f[1]))?
            })
            .expect("the master has a replica");
        let at = self.node_at(port);
        self.nodes[at].signal("-STOP");
        // Close the master's side of the link too: what it had written
        // into the socket would still reach the replica when it resumes.
        let closed = self.nodes[self.node_at(master_port)]
            .conn()
            .ok()
            .and_then(|mut c| {
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("replica")
                    .query::<u64>(&mut c)
                    .ok()
            });
        assert_eq!(closed, Some(1), "the master drops its replica's link");
    }

    /// Fails over the master of `key`'s slot the hard way: kill -9, resume
    /// a replica held back by [`Redis::hold_replica`], wait until the
    /// replica has taken the slot and the cluster is ok again, then start
    /// the old master on its directory (it rejoins as the new master's
    /// replica). Writes the old master acknowledged but had not yet sent
    /// to its replica are lost: replication is asynchronous. Returns how
    /// long the slot had no master.
    ///
    /// # Panics
    /// On a single server, or when no replica takes over within 30 s.
    pub fn fail_over(&mut self, key: &str) -> Duration {
        assert!(self.cluster, "fail_over needs a cluster");
        let port = self
            .master_of(key)
            .expect("a node of the cluster answers CLUSTER NODES");
        let at = self.node_at(port);
        let start = std::time::Instant::now();
        self.nodes[at].kill();
        for n in &self.nodes {
            n.thaw();
        }
        wait_until(
            "a replica takes over the killed master's slots",
            Duration::from_secs(30),
            || self.master_of(key).is_some_and(|p| p != port),
        );
        self.wait_healthy(Duration::from_secs(30));
        let outage = start.elapsed();
        self.nodes[at].spawn();
        self.wait_healthy(Duration::from_secs(30));
        outage
    }

    /// Waits until every running node reports `cluster_state:ok` and
    /// agrees who serves every slot.
    fn wait_healthy(&self, timeout: Duration) {
        wait_until("the cluster is ok", timeout, || {
            self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                n.conn()
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
    }
}

/// The port in a `CLUSTER NODES` address (`ip:port@cport`).
fn node_port(addr: &str) -> Option<u16> {
    addr.split('@').next()?.rsplit_once(':')?.1.parse().ok()
}

/// The port and id of the master in `nodes` (`CLUSTER NODES`' text) that
/// serves `slot` and is not marked failed.
fn master_serving(nodes: &str, slot: u16) -> Option<(u16, &str)> {
    nodes.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags = f.get(2)?;
        if !flags.contains("master") || flags.contains("fail") {
            return None;
        }
        let serves = f.iter().skip(8).any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
        });
        if !serves {
            return None;
        }
        Some((node_port(f.get(1)?)?, *f.first()?))
    })
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
    /// `name=value` settings given at every start.
    settings: Vec<String>,
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
        Cluster::start_with(&[])
    }

    /// initdb and start, with these `name=value` settings beside the fixed
    /// ones (the bench's preloaded statement counters).
    ///
    /// # Panics
    /// When initdb or pg_ctl are missing or fail.
    #[must_use]
    pub fn start_with(settings: &[&str]) -> Cluster {
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
            settings: settings.iter().map(|s| format!("-c {s}")).collect(),
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
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on {} {}",
            self.port,
            self.dir.display(),
            self.settings.join(" "),
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

    /// The postmaster's process id (the first line of `postmaster.pid`).
    #[must_use]
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
    }

    /// The admin URL (database `postgres`).
    #[must_use]
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Immediate shutdown (as a crash) and start again: committed data stays.
    pub fn restart(&self) {
        self.stop();
        std::thread::sleep(Duration::from_millis(500));
        self.resume();
    }

    /// Stops the server (immediate shutdown): every session is cut.
    pub fn stop(&self) {
        self.pg_ctl("stop");
    }

    /// Starts the stopped server again, on the same port and data.
    pub fn resume(&self) {
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
