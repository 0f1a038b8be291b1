//! The `pelican` processes a test starts: [`Env`]'s commands, workers and
//! API, [`Proc`] to signal and wait on them, and the traces they write.

use crate::{Env, free_port, pelican_bin, wait_until};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

thread_local! {
    static TRACES: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The trace files of the processes this thread started since the last
/// call (a scenario that panicked still leaves them on disk).
#[must_use]
pub fn take_traces() -> Vec<PathBuf> {
    TRACES.with(|t| std::mem::take(&mut *t.borrow_mut()))
}

/// A running `pelican` process.
pub struct Proc {
    child: Child,
    /// Its name in the logs.
    pub name: String,
    /// Its stderr.
    pub log: PathBuf,
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

impl Proc {
    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

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

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
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

    /// Its peak resident set so far, KiB (`VmHWM` of `/proc/PID/status`);
    /// `None` once it has exited, or where there is no `/proc`.
    #[must_use]
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
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

impl Env {
    fn command(&self) -> Command {
        self.command_in(false)
    }

    /// `pelican`, or, `contained`, `pelican` as the first process of a PID
    /// namespace of its own (process id 1, as in a container; killed with
    /// its `unshare`).
    fn command_in(&self, contained: bool) -> Command {
        let bin = self.bin.clone().unwrap_or_else(pelican_bin);
        let mut c = if contained {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        c.env("REDIS_URL", self.redis.url())
            .env("PELICAN_REDIS_CLUSTER", self.redis.is_cluster().to_string())
            .env("DATABASE_URL", &self.database_url)
            .env("PELICAN_STREAM", &self.stream)
            .env("PELICAN_PARTITIONS", self.partitions.to_string())
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

    /// Runs `pelican <args>`, which must succeed (else the test fails with
    /// its stderr).
    pub fn cli_ok(&self, args: &[&str]) -> std::process::Output {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "pelican {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Starts a worker with the test timings (lease 2 s, heartbeat 400 ms,
    /// reclaim after 2.5 s idle, sweep grace 3 s), plus `flags`, with the
    /// crash point `failpoint` armed if given (or, for `name=action`, that
    /// failpoint with that action, e.g. `before_write=1*sleep(6000)`).
    pub fn worker(&mut self, id: u32, failpoint: Option<&str>, flags: &[&str]) -> Proc {
        self.spawn_worker(Some(id), failpoint, flags)
    }

    /// Starts a worker as a container would: process id 1 in a PID
    /// namespace of its own, and no `--id` (it registers for a number).
    pub fn contained_worker(&mut self, flags: &[&str]) -> Proc {
        self.spawn_worker(None, None, flags)
    }

    fn spawn_worker(&mut self, id: Option<u32>, failpoint: Option<&str>, flags: &[&str]) -> Proc {
        let mut c = self.command_in(id.is_none());
        c.arg("worker");
        if let Some(id) = id {
            c.args(["--id", &id.to_string()]);
        }
        let id = id.map_or_else(|| format!("c{}", self.procs.len()), |n| n.to_string());
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
        self.trace_into(&mut c, &format!("worker-{id}"));
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
        self.api_with_flags(token, attempts_max, &[])
    }

    /// As [`Env::api_with`], with `flags` added to `pelican api`'s.
    pub fn api_with_flags(
        &mut self,
        token: &str,
        attempts_max: u32,
        flags: &[&str],
    ) -> (Proc, String) {
        self.api_on(token, attempts_max, flags, free_port())
    }

    /// As [`Env::api_with_flags`], listening on `port` (an API restarted
    /// where its clients expect it).
    pub fn api_on(
        &mut self,
        token: &str,
        attempts_max: u32,
        flags: &[&str],
        port: u16,
    ) -> (Proc, String) {
        let mut c = self.command();
        c.args(["api", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--api-token", token])
            .args(["--attempts-max", &attempts_max.to_string()]);
        if !flags.contains(&"--body-limit-bytes") {
            c.args(["--body-limit-bytes", "4096"]);
        }
        c.args(flags);
        self.trace_into(&mut c, "api");
        let p = self.spawn("api", c);
        let base = format!("http://127.0.0.1:{port}");
        let health = format!("{base}/healthz");
        wait_until("the API answers /healthz", Duration::from_secs(15), || {
            ureq::get(&health).call().is_ok()
        });
        (p, base)
    }

    /// With [`Env::trace`] on, gives the process `c` will start, named
    /// `name`, a `--trace-file` of its own among the test's traces.
    fn trace_into(&mut self, c: &mut Command, name: &str) {
        if !self.trace {
            return;
        }
        let trace = self
            .logs
            .join(format!("{:02}-{name}.trace.jsonl", self.procs.len()));
        c.arg("--trace-file").arg(&trace);
        self.traces.push(trace.clone());
        TRACES.with(|t| t.borrow_mut().push(trace));
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
}
