//! The steady-state soak: a real API and workers at a steady submission
//! rate for minutes or hours, with retention on a short keep, SSE
//! watchers, a dashboard's polling, `kill -9` of workers and of the API at
//! intervals and one Redis wipe in the middle. Every period it samples
//! what grows if anything falls behind (tables, streams, the PEL,
//! connections, commits, each process's memory, latencies); at the end it
//! requires every series flat, nothing lost, no answer of 500 or above,
//! and the wipe's backlog recovered within [`WIPE_RECOVERY_BOUND_S`].
//!
//! Retention deletes runs as the soak goes, so the soak keeps its own
//! record of every run it saw finished ([`Sampler::finished_since`], read
//! more often than the keep): an accepted run must end either present and
//! terminal or deleted after it was seen finished.

use crate::{Cluster, Database, Env, Proc};
use pelican_model::ids::RunId;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod load;
mod plot;
mod sample;

pub use load::{Load, job};
pub use plot::plot;
pub use sample::{Sample, Sampler, TABLES, connections_ceiling, noise, not_flat, quantile};

/// The API's bearer token in the soak.
const TOKEN: &str = "soak";
/// Its read-only token (the dashboard's).
const READ_TOKEN: &str = "soak-read";

/// The longest a wipe's backlog may take to be recovered: the sweeper's
/// grace (4 s) after the backlog's publication, the reclaim of the paused
/// workers' deliveries, then the sweep and the outbox at their pace, a
/// round a second, with room for the kills around it.
pub const WIPE_RECOVERY_BOUND_S: f64 = 20.0;

/// How long the workers are paused before the wipe.
const WIPE_PAUSE: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Seconds of steady load.
    pub seconds: u32,
    /// Runs submitted a second.
    pub rate_per_s: u32,
    /// Worker processes.
    pub workers: u32,
    /// SSE watchers following runs to their end.
    pub watchers: u32,
    /// Workers' `--keep-finished-ms` (and stream `--retention-ms`).
    pub keep_finished_ms: u64,
    /// Seconds between samples.
    pub sample_every_s: u32,
    /// Seconds between `kill -9`s of a worker (restarted a second later).
    pub worker_kill_every_s: u32,
    /// Seconds between `kill -9`s of the API (restarted at once).
    pub api_kill_every_s: u32,
    /// The workload's seed.
    pub seed: u64,
}

impl Plan {
    /// The two minutes `cargo xtask test` runs.
    #[must_use]
    pub fn short() -> Plan {
        Plan {
            seconds: 120,
            rate_per_s: 100,
            workers: 3,
            watchers: 200,
            keep_finished_ms: 20_000,
            sample_every_s: 10,
            worker_kill_every_s: 20,
            api_kill_every_s: 45,
            seed: 1,
        }
    }

    /// The twenty minutes `cargo xtask bench` runs.
    #[must_use]
    pub fn long() -> Plan {
        Plan {
            seconds: 1_200,
            rate_per_s: 200,
            watchers: 500,
            keep_finished_ms: 60_000,
            worker_kill_every_s: 60,
            api_kill_every_s: 180,
            ..Plan::short()
        }
    }
}

/// What the soak saw, and its verdict.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The plan.
    pub plan: Option<Plan>,
    /// The samples, in order.
    pub samples: Vec<Sample>,
    /// Runs the API accepted.
    pub accepted: u64,
    /// Of those, deleted by retention after the soak saw them finished.
    pub retired: u64,
    /// Answers by HTTP status (0: none, the API was down).
    pub statuses: BTreeMap<u16, u64>,
    /// Seconds into the load when Redis was wiped.
    pub wipe_at_s: f64,
    /// Runs unfinished at the wipe.
    pub wipe_backlog: u64,
    /// Seconds from the wipe until each of them was finished.
    pub wipe_recovery_s: Option<f64>,
    /// Series that rose beyond their noise: (name, middle, last).
    pub not_flat: Vec<(String, f64, f64)>,
    /// Kills thrown: workers, the API.
    pub kills: (u32, u32),
    /// Everything that failed the soak.
    pub failures: Vec<String>,
    /// Wall-clock seconds, all told.
    pub seconds: f64,
}

impl Report {
    /// Whether the soak passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The soak's processes: the API (on a fixed port, so that its clients
/// find it again) and the workers.
struct Fleet {
    api: Proc,
    port: u16,
    workers: Vec<Option<Proc>>,
}

impl Fleet {
    fn api_flags(plan: &Plan) -> Vec<String> {
        let keys_keep = (plan.keep_finished_ms * 2).to_string();
        vec![
            "--api-read-token".into(),
            READ_TOKEN.into(),
            "--submit-keys-keep-ms".into(),
            keys_keep,
        ]
    }

    fn start_api(env: &mut Env, plan: &Plan, port: u16) -> Proc {
        let flags = Fleet::api_flags(plan);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        env.api_on(TOKEN, 3, &flags, port).0
    }

    fn start_worker(env: &mut Env, plan: &Plan, w: u32) -> Proc {
        let keep = plan.keep_finished_ms.to_string();
        env.worker(
            w,
            None,
            &[
                "--in-flight-max",
                "64",
                "--keep-finished-ms",
                &keep,
                "--retention-ms",
                &keep,
                "--sweep-grace-ms",
                "4000",
                "--maintenance-every-ms",
                "1000",
                "--provider-limit",
                "soak:concurrent=4,per_second=200,burst=20",
            ],
        )
    }

    fn pids(&self) -> Vec<(String, u32)> {
        let mut out = vec![("api".to_owned(), self.api.pid())];
        for (w, p) in self.workers.iter().enumerate() {
            if let Some(p) = p {
                out.push((format!("worker-{}", w + 1), p.pid()));
            }
        }
        out
    }
}

/// Everything one soak holds while it runs.
struct Soak {
    plan: Plan,
    env: Env,
    fleet: Fleet,
    load: Arc<Load>,
    sampler: Sampler,
    seen: Seen,
    report: Report,
}

/// Runs the soak; `progress` hears what it does.
///
/// # Panics
/// When a service cannot be started at all.
pub fn run(plan: &Plan, progress: &dyn Fn(&str)) -> Report {
    let started = Instant::now();
    let cluster = Cluster::start_with(&["autovacuum_naptime=5"]);
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_services(url.clone(), Some(db), crate::Redis::start(), None);
    env.trace = false;
    let port = crate::free_port();
    let mut fleet = Fleet {
        api: Fleet::start_api(&mut env, plan, port),
        port,
        workers: Vec::new(),
    };
    for w in 1..=plan.workers {
        fleet
            .workers
            .push(Some(Fleet::start_worker(&mut env, plan, w)));
    }
    let base = format!("http://127.0.0.1:{port}");
    let load = Arc::new(Load::default());
    let threads = start_load(plan, &base, &load);
    let mut soak = Soak {
        plan: plan.clone(),
        env,
        fleet,
        load,
        sampler: Sampler::new(&url),
        seen: Seen::default(),
        report: Report {
            plan: Some(plan.clone()),
            ..Report::default()
        },
    };
    soak.steady(progress);
    soak.load.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    progress("settling");
    soak.settle();
    soak.verdict();
    let Soak {
        env,
        fleet,
        mut report,
        ..
    } = soak;
    let mut env = env;
    report.seconds = started.elapsed().as_secs_f64();
    if !report.passed() {
        env.keep_logs = true;
        report
            .failures
            .push(format!("process logs: {}", env.logs.display()));
    }
    drop(fleet);
    drop(env);
    drop(cluster);
    report
}

/// Starts the submitters, the dashboard poller and the watchers (on the
/// shared runtime).
fn start_load(plan: &Plan, base: &str, load: &Arc<Load>) -> Vec<std::thread::JoinHandle<()>> {
    let lanes = 4;
    let mut threads: Vec<_> = (0..lanes)
        .map(|lane| {
            let (plan, base, load) = (plan.clone(), base.to_owned(), Arc::clone(load));
            std::thread::spawn(move || load::submitter(&plan, &base, lane, lanes, &load))
        })
        .collect();
    let (b, l) = (base.to_owned(), Arc::clone(load));
    threads.push(std::thread::spawn(move || load::dashboard(&b, &l)));
    for _ in 0..plan.watchers {
        crate::rt().spawn(load::watcher(base.to_owned(), Arc::clone(load)));
    }
    threads
}

/// The runs the soak saw finished, and where its reading of them is.
#[derive(Default)]
struct Seen {
    finished: BTreeSet<RunId>,
    since_ms: i64,
}

impl Seen {
    /// Reads the runs finished since the last read (with an overlap wider
    /// than any statement's time between its clock and its commit).
    fn read(&mut self, sampler: &Sampler) {
        for (run, at) in sampler.finished_since(self.since_ms - 5_000) {
            self.finished.insert(RunId(run));
            self.since_ms = self.since_ms.max(at);
        }
    }
}

/// A repeating deadline: due every `every`, from `every` on.
struct Every {
    next: Duration,
    every: Duration,
}

impl Every {
    fn new(seconds: u32) -> Every {
        let every = Duration::from_secs(u64::from(seconds.max(1)));
        Every { next: every, every }
    }

    /// Whether it is due at `t`; if so, the next is one period on.
    fn due(&mut self, t: Duration) -> bool {
        let due = t >= self.next;
        if due {
            self.next += self.every;
        }
        due
    }
}

impl Soak {
    /// The steady phase: the load runs, the nemesis kills on its intervals
    /// and wipes Redis once halfway, and the sampler samples.
    fn steady(&mut self, progress: &dyn Fn(&str)) {
        let start = Instant::now();
        let span = Duration::from_secs(u64::from(self.plan.seconds));
        let mut sample = Every::new(self.plan.sample_every_s);
        let mut kill = Every::new(self.plan.worker_kill_every_s);
        let mut api_kill = Every::new(self.plan.api_kill_every_s);
        let mut restarts: Vec<(Instant, usize)> = Vec::new();
        let mut wipe: Option<(Instant, BTreeSet<RunId>)> = None;
        while start.elapsed() < span {
            let t = start.elapsed();
            self.seen.read(&self.sampler);
            for (_, w) in restarts.extract_if(.., |(at, _)| *at <= Instant::now()) {
                self.restart_worker(w);
            }
            if kill.due(t) {
                let w = (self.report.kills.0 as usize) % self.fleet.workers.len();
                if let Some(mut p) = self.fleet.workers[w].take() {
                    p.kill9();
                    restarts.push((Instant::now() + Duration::from_secs(1), w));
                    self.report.kills.0 += 1;
                }
            }
            if api_kill.due(t) {
                self.fleet.api.kill9();
                self.fleet.api = Fleet::start_api(&mut self.env, &self.plan, self.fleet.port);
                self.report.kills.1 += 1;
            }
            if wipe.is_none() && t >= span / 2 {
                wipe = Some(self.wipe(t));
            }
            if let Some((at, backlog)) = &mut wipe
                && self.report.wipe_recovery_s.is_none()
            {
                backlog.retain(|r| !self.seen.finished.contains(r));
                if backlog.is_empty() {
                    self.report.wipe_recovery_s = Some(at.elapsed().as_secs_f64());
                }
            }
            if sample.due(t) {
                let pids = self.fleet.pids();
                let s = self
                    .sampler
                    .sample(t.as_secs_f64(), &self.env, &pids, &self.load);
                self.report.samples.push(s);
                progress(&format!(
                    "{:>5.0} s: {} runs accepted, {} kills",
                    t.as_secs_f64(),
                    self.load.accepted_n.load(Ordering::Relaxed),
                    self.report.kills.0 + self.report.kills.1
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for (_, w) in restarts {
            self.restart_worker(w);
        }
    }

    fn restart_worker(&mut self, w: usize) {
        let p = Fleet::start_worker(&mut self.env, &self.plan, w as u32 + 1);
        self.fleet.workers[w] = Some(p);
    }

    /// Wipes Redis at `t`, its workers paused for [`WIPE_PAUSE`] first
    /// (SIGSTOP, past their lease) so that a queue builds up to be lost:
    /// the runs unfinished then are its backlog.
    fn wipe(&mut self, t: Duration) -> (Instant, BTreeSet<RunId>) {
        let paused: Vec<&Proc> = self.fleet.workers.iter().flatten().collect();
        for p in &paused {
            p.stop();
        }
        std::thread::sleep(WIPE_PAUSE);
        let db = self.env.db();
        let backlog: BTreeSet<RunId> = self
            .load
            .accepted
            .lock()
            .expect("not poisoned")
            .keys()
            .filter(|r| db.runs.get(r).is_some_and(|row| !row.status.is_terminal()))
            .copied()
            .collect();
        self.env.redis.wipe();
        for p in self.fleet.workers.iter().flatten() {
            p.cont();
        }
        self.report.wipe_at_s = (t + WIPE_PAUSE).as_secs_f64();
        self.report.wipe_backlog = backlog.len() as u64;
        (Instant::now(), backlog)
    }

    /// After the load: waits (two minutes at most) until every accepted
    /// run was seen finished and every entry is delivered.
    fn settle(&mut self) {
        let accepted: Vec<RunId> = self.accepted();
        self.report.accepted = accepted.len() as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        let open = loop {
            self.seen.read(&self.sampler);
            let open: Vec<RunId> = accepted
                .iter()
                .filter(|r| !self.seen.finished.contains(r))
                .copied()
                .collect();
            if (open.is_empty() && self.env.stream_drained()) || Instant::now() > deadline {
                break open;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        // Quiescent for the audit: retention deletes nothing between its
        // reads.
        for p in self.fleet.workers.iter_mut().flatten() {
            p.term();
            let _ = p.wait(Duration::from_secs(30));
        }
        if !open.is_empty() {
            let some: Vec<String> = open.iter().take(10).map(ToString::to_string).collect();
            self.report.failures.push(format!(
                "{} accepted runs never seen finished (lost): {}",
                open.len(),
                some.join(", ")
            ));
        }
    }

    fn accepted(&self) -> Vec<RunId> {
        let accepted = self.load.accepted.lock().expect("not poisoned");
        accepted.keys().copied().collect()
    }

    /// The audit of the state left (S1–S15 over every run still kept), and
    /// the judgement of the answers, the samples and the wipe.
    fn verdict(&mut self) {
        let db = self.env.db();
        for run in self.accepted() {
            if db.runs.contains_key(&run) {
                self.env.accepted.insert(run);
            } else {
                self.report.retired += 1;
            }
        }
        for (run, r) in &db.runs {
            let effects = pelican_real::jobs::effects_of(&r.kind, &r.input);
            self.env.effects.insert(*run, effects);
        }
        let report = &mut self.report;
        for finding in self.env.audit(&[]) {
            if report.failures.len() < 50 {
                report.failures.push(finding.to_string());
            }
        }
        report.statuses = self.load.statuses.lock().expect("not poisoned").clone();
        let errors = self.load.server_errors();
        if errors > 0 {
            let s = &report.statuses;
            report
                .failures
                .push(format!("{errors} answers of 500 or above: {s:?}"));
        }
        let ceiling = connections_ceiling(self.plan.workers + 1);
        let most = (report.samples.iter())
            .filter_map(|s| s.values.get("pg.connections").copied())
            .fold(0.0, f64::max);
        if most > ceiling {
            report.failures.push(format!(
                "{most} Postgres connections, above the {ceiling} the pools and the soak may hold"
            ));
        }
        report.not_flat = not_flat(&report.samples);
        for (name, middle, last) in &report.not_flat {
            report.failures.push(format!(
                "{name} is not flat: {middle:.1} held before, {last:.1} in the last third"
            ));
        }
        let backlog = report.wipe_backlog;
        match report.wipe_recovery_s {
            Some(s) if s <= WIPE_RECOVERY_BOUND_S => {}
            Some(s) => report.failures.push(format!(
                "the wipe's backlog of {backlog} runs took {s:.1} s (bound {WIPE_RECOVERY_BOUND_S} s)"
            )),
            None => report.failures.push(format!(
                "the wipe's backlog of {backlog} runs was not recovered before the load ended"
            )),
        }
    }
}
