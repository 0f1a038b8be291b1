//! Housekeeping and recovery at scale, each on throwaway servers of its
//! own: how fast retention deletes against how fast a worker drains, how
//! soon a wiped backlog is back in the stream, how fast the outbox and the
//! promotion of due retries go, and what an API's events watchers cost
//! Postgres.

use crate::{Cluster, Database, Env, Proc, rt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct SteadyPlan {
    /// Runs behind the retention and the wipe figures.
    pub runs: u32,
    /// Open events streams in the watchers' figure.
    pub watchers: u32,
    /// Each worker's --in-flight-max and --batch-max (the drain's).
    pub in_flight: u32,
    /// As above.
    pub batch_max: u32,
}

/// A fresh Postgres cluster, database, Redis and environment, with no
/// protocol traces (they would be the biggest cost measured).
fn fresh() -> (Cluster, Env) {
    let cluster = Cluster::start();
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), None);
    env.trace = false;
    (cluster, env)
}

/// A connection pool of one to the bench's database.
fn pool(env: &Env) -> sqlx::PgPool {
    let url = env.database_url.clone();
    rt().block_on(async move {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("the bench's Postgres answers")
    })
}

/// One number from the bench's database.
fn scalar(pg: &sqlx::PgPool, sql: &str) -> i64 {
    let sql = sql.to_owned();
    rt().block_on(async move {
        let v: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(pg)
            .await
            .expect("the bench's query runs");
        v.unwrap_or(0)
    })
}

/// Waits until `sql` (a cheap probe: an `EXISTS`) answers 0; the seconds
/// it took, from `since`.
fn until_zero(pg: &sqlx::PgPool, sql: &str, since: Instant, limit: Duration) -> f64 {
    while scalar(pg, sql) > 0 {
        assert!(since.elapsed() < limit, "{sql}: not 0 within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    since.elapsed().as_secs_f64()
}

/// Any run not finished.
const LIVE: &str = "SELECT EXISTS (SELECT 1 FROM runs WHERE finished_at IS NULL)::int::bigint";

/// Any run at all.
const ANY: &str = "SELECT EXISTS (SELECT 1 FROM runs)::int::bigint";

fn worker(env: &mut Env, plan: &SteadyPlan, extra: &[&str]) -> Proc {
    let (f, b) = (plan.in_flight.to_string(), plan.batch_max.to_string());
    let mut flags = vec!["--in-flight-max", &f, "--batch-max", &b];
    flags.extend_from_slice(extra);
    env.worker(1, None, &flags)
}

/// Retention against the drain: one worker drains `runs` no-op runs and
/// keeps them; then one worker whose keep has passed deletes them all.
/// Answers (drained a second, deleted a second).
#[must_use]
pub fn retention(plan: &SteadyPlan) -> (f64, f64) {
    let (_cluster, mut env) = fresh();
    let pg = pool(&env);
    env.submit_noops_from_file(plan.runs as usize);
    let start = Instant::now();
    let mut w = worker(&mut env, plan, &["--keep-finished-ms", "0"]);
    let drained = until_zero(&pg, LIVE, start, Duration::from_secs(600));
    w.term();
    let _ = w.wait(Duration::from_secs(30));
    // From the worker's start, its first round's pause included.
    let start = Instant::now();
    let mut w = worker(&mut env, plan, &["--keep-finished-ms", "1"]);
    let deleted = until_zero(&pg, ANY, start, Duration::from_secs(600));
    w.term();
    let _ = w.wait(Duration::from_secs(30));
    (
        f64::from(plan.runs) / drained,
        f64::from(plan.runs) / deleted,
    )
}

/// A wipe of a backlog of `runs` queued runs: Redis loses them all, then a
/// worker (sweeper grace 1 s) starts. Answers the seconds from its start
/// until every run was published again (by Postgres's clock), and until
/// every run had finished.
#[must_use]
pub fn wipe(plan: &SteadyPlan) -> (f64, f64) {
    let (_cluster, mut env) = fresh();
    let pg = pool(&env);
    env.submit_noops_from_file(plan.runs as usize);
    env.redis.wipe();
    // The grace counts from each run's publication: let it pass for all.
    std::thread::sleep(Duration::from_secs(2));
    let now_ms = "SELECT pelican_now_ms()";
    let t0 = scalar(&pg, now_ms);
    let start = Instant::now();
    let mut w = worker(
        &mut env,
        plan,
        &[
            "--sweep-grace-ms",
            "1000",
            "--maintenance-every-ms",
            "1000",
            "--keep-finished-ms",
            "0",
        ],
    );
    let done = until_zero(&pg, LIVE, start, Duration::from_secs(1_800));
    let last = scalar(&pg, "SELECT max(published_at) FROM runs WHERE dispatch > 1");
    w.term();
    let _ = w.wait(Duration::from_secs(30));
    ((last - t0) as f64 / 1000.0, done)
}

/// Queued runs the outbox has yet to publish.
const UNPUBLISHED: &str = "SELECT EXISTS (SELECT 1 FROM runs \
     WHERE status = 'queued' AND published_at IS NULL)::int::bigint";

/// Runs waiting for their retry, or promoted and not yet published.
const UNPROMOTED: &str = "SELECT (EXISTS (SELECT 1 FROM runs WHERE status = 'retry_wait') \
     OR EXISTS (SELECT 1 FROM runs WHERE status = 'queued' AND published_at IS NULL))::int::bigint";

/// The outbox and the promotion of due retries at scale. First `runs`
/// queued runs whose publication was never confirmed (Redis wiped and
/// `published_at` cleared, as submissions whose XADD got no answer leave
/// them), and one worker from its start until the outbox has published
/// every one. Then the same runs, finished, put back to wait for a retry
/// already due (Redis wiped again), and one worker until every one was
/// promoted and published. Answers both rates, runs a second.
#[must_use]
pub fn outbox(plan: &SteadyPlan) -> (f64, f64) {
    let (_cluster, mut env) = fresh();
    let pg = pool(&env);
    env.submit_noops_from_file(plan.runs as usize);
    env.redis.wipe();
    scalar(
        &pg,
        "WITH u AS (UPDATE runs SET published_at = NULL RETURNING 1) SELECT count(*) FROM u",
    );
    let start = Instant::now();
    let mut w = worker(&mut env, plan, &["--keep-finished-ms", "0"]);
    let published = until_zero(&pg, UNPUBLISHED, start, Duration::from_secs(600));
    until_zero(&pg, LIVE, start, Duration::from_secs(600));
    w.term();
    let _ = w.wait(Duration::from_secs(30));
    env.redis.wipe();
    scalar(
        &pg,
        "WITH r AS (UPDATE runs SET status = 'retry_wait', retry_at = 0, finished_at = NULL, \
         result = NULL, dispatch = dispatch + 1 RETURNING 1) SELECT count(*) FROM r",
    );
    let start = Instant::now();
    let mut w = worker(&mut env, plan, &["--keep-finished-ms", "0"]);
    let promoted = until_zero(&pg, UNPROMOTED, start, Duration::from_secs(600));
    w.term();
    let _ = w.wait(Duration::from_secs(30));
    (
        f64::from(plan.runs) / published,
        f64::from(plan.runs) / promoted,
    )
}

/// Postgres's commits a second on an API and a worker with ten long runs
/// going: with no events stream open, then with `watchers` (spread over
/// the ten runs, raw HTTP clients reading and discarding). Answers (idle,
/// watched, the API's resident MiB with them open).
#[must_use]
pub fn watchers(plan: &SteadyPlan) -> (f64, f64, f64) {
    let (_cluster, mut env) = fresh();
    let cap = (plan.watchers + 10).to_string();
    let (api, base) = env.api_with_flags("bench", 3, &["--events-streams-max", &cap]);
    let _w = env.worker(1, None, &[]);
    let runs: Vec<u64> = (0..10)
        .map(|_| env.submit("sleep", r#"{"ms":600000}"#, 3).0)
        .collect();
    let pg = pool(&env);
    let running = "SELECT EXISTS (SELECT 1 FROM runs WHERE status <> 'running')::int::bigint";
    until_zero(&pg, running, Instant::now(), Duration::from_secs(60));
    let idle = commits_per_s(&pg);
    let addr: std::net::SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .expect("the API's address");
    let streams: Vec<_> = (0..plan.watchers)
        .map(|i| rt().spawn(follow(addr, runs[i as usize % runs.len()])))
        .collect();
    let open = format!("pelican_events_streams {}", plan.watchers);
    let started = Instant::now();
    while !metrics(&base).contains(&open) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} streams not open within 2 minutes",
            plan.watchers
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let watched = commits_per_s(&pg);
    let rss = rss_mib(api.pid());
    for s in streams {
        s.abort();
    }
    (idle, watched, rss)
}

/// Commits a second on the bench's database over ten seconds.
fn commits_per_s(pg: &sqlx::PgPool) -> f64 {
    let sql = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    // Let the sessions' counters reach the statistics first.
    std::thread::sleep(Duration::from_secs(2));
    let (a, t) = (scalar(pg, sql), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let b = scalar(pg, sql);
    (b - a) as f64 / t.elapsed().as_secs_f64()
}

/// One events stream of `run`, read and discarded until it ends.
async fn follow(addr: std::net::SocketAddr, run: u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    let req = format!(
        "GET /runs/{run}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer bench\r\nAccept: text/event-stream\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
}

fn metrics(base: &str) -> String {
    ureq::get(format!("{base}/metrics"))
        .header("Authorization", "Bearer bench")
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default()
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Every figure, as the bench's summary keys.
#[must_use]
pub fn run(plan: &SteadyPlan) -> Value {
    eprintln!("bench: retention against the drain, {} runs", plan.runs);
    let (drain, deletes) = retention(plan);
    eprintln!("bench: {drain:.0} runs/s drained, {deletes:.0} runs/s deleted");
    eprintln!("bench: a wiped backlog of {} runs", plan.runs);
    let (back, done) = wipe(plan);
    eprintln!("bench: back in the stream in {back:.1} s, all run in {done:.1} s");
    eprintln!("bench: the outbox and due retries, {} runs each", plan.runs);
    let (published, promoted) = outbox(plan);
    eprintln!(
        "bench: {published:.0} runs/s published, {promoted:.0} runs/s promoted and published"
    );
    eprintln!("bench: {} events streams on one API", plan.watchers);
    let (idle, watched, rss) = watchers(plan);
    eprintln!(
        "bench: {idle:.0} commits/s without watchers, {watched:.0} with; API RSS {rss:.0} MiB"
    );
    json!({
        "steady_runs": plan.runs,
        "retention_drain_per_s": crate::round(drain, 0),
        "retention_deletes_per_s": crate::round(deletes, 0),
        "wipe_back_in_stream_s": crate::round(back, 1),
        "wipe_all_run_s": crate::round(done, 1),
        "outbox_published_per_s": crate::round(published, 0),
        "retries_promoted_per_s": crate::round(promoted, 0),
        "watchers": plan.watchers,
        "pg_commits_per_s_0_watchers": crate::round(idle, 0),
        "pg_commits_per_s_watched": crate::round(watched, 0),
        "api_rss_mib_watched": crate::round(rss, 0),
    })
}
