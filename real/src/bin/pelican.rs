//! `pelican`: the worker, the API and the operator's commands, on live Redis
//! Streams and PostgreSQL. `pelican --help` lists the commands; every flag
//! has an environment variable.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use pelican_model::ids::{RunId, WorkerId};
use pelican_model::protocol::{DbOp, DbReply, Policy, SubmitterEnd};
use pelican_real::jobs::Registry;
use pelican_real::live::api::{self, ApiState};
use pelican_real::live::metrics::MetricsProbe;
use pelican_real::live::{PgDb, PgTools, RedisStream, StreamNames};
use pelican_real::{Batching, Config, Entropy, Io, NoProbe, Probe, Worker, cancel, submit};
use serde_json::json;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Durable jobs on Redis Streams with PostgreSQL as the source of truth.
#[derive(Parser)]
#[command(
    name = "pelican",
    version,
    about = "Durable jobs on Redis Streams, with PostgreSQL as the source of truth"
)]
struct Cli {
    #[command(flatten)]
    conn: Connection,
    /// Log format.
    #[arg(
        long,
        env = "PELICAN_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "PELICAN_LOG_LEVEL", default_value = "info", global = true)]
    log_level: tracing::Level,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args)]
struct Connection {
    /// Redis URL.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    redis_url: String,
    /// PostgreSQL URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/pelican",
        global = true
    )]
    database_url: String,
    /// Stream key prefix: jobs go to `<prefix>:jobs`, dead-letter
    /// notifications to `<prefix>:jobs:dead`.
    #[arg(long, env = "PELICAN_STREAM", default_value = "pelican", global = true)]
    stream: String,
    /// Consumer group.
    #[arg(long, env = "PELICAN_GROUP", default_value = "pelican", global = true)]
    group: String,
    /// How long any Redis or Postgres call may take before it counts as
    /// unavailable.
    #[arg(
        long,
        env = "PELICAN_CALL_TIMEOUT_MS",
        default_value_t = 5_000,
        global = true
    )]
    call_timeout_ms: u64,
    /// Inject a protocol bug into every role this process runs (testing
    /// only; exists only in builds with the `mutants` feature).
    #[cfg(feature = "mutants")]
    #[arg(long, env = "PELICAN_MUTANT", global = true)]
    mutant: Option<String>,
}

impl Connection {
    fn mutant(&self) -> Result<Option<pelican_model::protocol::Mutant>> {
        #[cfg(feature = "mutants")]
        return self
            .mutant
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("{e}"));
        #[cfg(not(feature = "mutants"))]
        Ok(None)
    }

    /// The driver's defaults with this process's call timeout and mutant.
    fn config(&self, attempts_max: u32) -> Result<Config> {
        let mut config = Config::default();
        config.policy.attempts_max = attempts_max;
        config.policy.mutant = self.mutant()?;
        config.call_timeout_ms = self.call_timeout_ms;
        Ok(config)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Create or update the schema in Postgres and the consumer group in Redis.
    Migrate,
    /// Serve the HTTP API.
    Api(ApiArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Submit a run (as `POST /runs` does) and print its id.
    Submit {
        /// The job kind.
        kind: String,
        /// The job input (JSON).
        #[arg(default_value = "{}")]
        input: String,
        /// Attempts allowed.
        #[arg(long, env = "PELICAN_ATTEMPTS_MAX", default_value_t = 5)]
        attempts_max: u32,
    },
    /// Show one run, or the queue's state when no run is given.
    Status {
        /// A run id.
        run: Option<String>,
    },
    /// Cancel a run.
    Cancel {
        /// A run id.
        run: String,
    },
    /// The dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// Protocol traces (`--trace-file` of `worker` and `api`).
    #[command(subcommand)]
    Trace(TraceCmd),
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Replay traces through the protocol's state machines: each must
    /// conform, or the first event the model does not allow is shown.
    Check {
        /// Trace files (JSON lines).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum DlqCmd {
    /// List dead runs with their dead-letter records.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Run a dead run again, with more attempts (an explicit operator decision).
    Requeue {
        /// A run id.
        run: String,
        /// Attempts to allow from now on.
        #[arg(long, default_value_t = 1)]
        extra_attempts: u32,
    },
}

#[derive(Args)]
struct ApiArgs {
    /// Address to listen on.
    #[arg(long, env = "PELICAN_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Bearer token required on mutating routes (unset: no auth; do not
    /// expose such an API).
    #[arg(long, env = "PELICAN_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// Largest request body accepted.
    #[arg(long, env = "PELICAN_BODY_LIMIT_BYTES", default_value_t = 64 * 1024)]
    body_limit_bytes: usize,
    /// Attempts each submitted run allows.
    #[arg(long, env = "PELICAN_ATTEMPTS_MAX", default_value_t = 5)]
    attempts_max: u32,
    /// Write a protocol trace (JSON lines) of the submissions here.
    #[arg(long, env = "PELICAN_TRACE_FILE")]
    trace_file: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct WorkerArgs {
    /// This worker's number; its consumer name is `w<id>`. Give each
    /// running worker its own (default: the process id).
    #[arg(long, env = "PELICAN_WORKER_ID")]
    id: Option<u32>,
    /// Jobs run at once.
    #[arg(long, env = "PELICAN_IN_FLIGHT_MAX", default_value_t = 16)]
    in_flight_max: usize,
    /// Claims (and completions, and reads) of up to this many deliveries go to
    /// Postgres as one statement, and their acknowledgements to Redis as
    /// one pipeline; 1 sends each on its own.
    #[arg(long, env = "PELICAN_BATCH_MAX", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch_max: u32,
    /// How long a claim or heartbeat keeps a job's ownership.
    #[arg(long, env = "PELICAN_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    /// Heartbeat period (well below the lease).
    #[arg(long, env = "PELICAN_HEARTBEAT_MS", default_value_t = 10_000)]
    heartbeat_ms: u64,
    /// Deliveries idle this long are reclaimed (XAUTOCLAIM min-idle-time).
    #[arg(long, env = "PELICAN_RECLAIM_MIN_IDLE_MS", default_value_t = 60_000)]
    reclaim_min_idle_ms: u64,
    /// Reclaimer period.
    #[arg(long, env = "PELICAN_RECLAIM_EVERY_MS", default_value_t = 5_000)]
    reclaim_every_ms: u64,
    /// First retry back-off.
    #[arg(long, env = "PELICAN_BACKOFF_BASE_MS", default_value_t = 1_000)]
    backoff_base_ms: u64,
    /// Back-off cap.
    #[arg(long, env = "PELICAN_BACKOFF_CAP_MS", default_value_t = 60_000)]
    backoff_cap_ms: u64,
    /// How long a published run may wait, or a lease stay expired, before
    /// the sweeper checks its stream entry (the sweeper runs on the
    /// maintenance pass closest to every quarter of this).
    #[arg(long, env = "PELICAN_SWEEP_GRACE_MS", default_value_t = 120_000)]
    sweep_grace_ms: u64,
    /// Maintenance period (retries due, outbox, sweeper).
    #[arg(long, env = "PELICAN_MAINTENANCE_EVERY_MS", default_value_t = 1_000)]
    maintenance_every_ms: u64,
    /// How long an empty XREADGROUP blocks.
    #[arg(long, env = "PELICAN_READ_BLOCK_MS", default_value_t = 1_000)]
    read_block_ms: u64,
    /// On SIGTERM, how long in-flight jobs may take to finish.
    #[arg(long, env = "PELICAN_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// A job running longer fails retryably.
    #[arg(long, env = "PELICAN_JOB_TIMEOUT_MS", default_value_t = 3_600_000)]
    job_timeout_ms: u64,
    /// Stream retention: delivered, acknowledged entries older than this are
    /// trimmed by the maintenance pass (0: keep every entry).
    #[arg(long, env = "PELICAN_RETENTION_MS", default_value_t = 86_400_000)]
    retention_ms: u64,
    /// Do not run the retry scheduler, outbox and sweeper in this worker.
    #[arg(long, env = "PELICAN_NO_MAINTENANCE")]
    no_maintenance: bool,
    /// Serve this worker's Prometheus metrics here.
    #[arg(long, env = "PELICAN_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Write a protocol trace (JSON lines) here; `pelican trace check`
    /// replays it through the protocol.
    #[arg(long, env = "PELICAN_TRACE_FILE")]
    trace_file: Option<std::path::PathBuf>,
}

struct OsEntropy;
impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

fn init_logs(format: LogFormat, level: tracing::Level) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_id(s: &str) -> Result<RunId> {
    s.strip_prefix("run-")
        .unwrap_or(s)
        .parse::<u64>()
        .map(RunId)
        .with_context(|| format!("{s:?} is not a run id (a number, or run-<number>)"))
}

struct Clients {
    stream: RedisStream,
    db: PgDb,
}

async fn connect_db(c: &Connection) -> Result<PgDb> {
    PgDb::connect(
        &c.database_url,
        16,
        Duration::from_millis(c.call_timeout_ms),
    )
    .await
    .with_context(|| format!("connecting to Postgres at {}", redact(&c.database_url)))
}

async fn connect(c: &Connection, read_block_ms: u64) -> Result<Clients> {
    let db = connect_db(c).await?;
    let stream = RedisStream::connect(
        &c.redis_url,
        StreamNames::new(&c.stream, &c.group),
        read_block_ms,
        Duration::from_millis(c.call_timeout_ms),
    )
    .await
    .context("connecting to Redis")?;
    Ok(Clients { stream, db })
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn io<P: Probe>(clients: Clients, config: Config, probe: P) -> Io<RedisStream, PgDb, P> {
    Io {
        stream: clients.stream,
        db: clients.db,
        probe,
        entropy: Arc::new(OsEntropy),
        config,
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutdown requested");
}

fn install_metrics(
    listen: Option<SocketAddr>,
) -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    let mut builder = metrics_exporter_prometheus::PrometheusBuilder::new();
    if let Some(addr) = listen {
        builder = builder.with_http_listener(addr);
        let (recorder, exporter) = builder.build().context("building the metrics exporter")?;
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).context("installing the metrics recorder")?;
        tokio::spawn(exporter);
        Ok(handle)
    } else {
        builder
            .install_recorder()
            .context("installing the metrics recorder")
    }
}

fn print(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON values print")
    );
}

async fn worker(c: &Connection, a: WorkerArgs) -> Result<()> {
    let policy = Policy {
        lease_ms: a.lease_ms,
        heartbeat_ms: a.heartbeat_ms,
        reclaim_min_idle_ms: a.reclaim_min_idle_ms,
        reclaim_batch_max: a.in_flight_max.max(1),
        attempts_max: Policy::default().attempts_max,
        backoff_base_ms: a.backoff_base_ms,
        backoff_cap_ms: a.backoff_cap_ms,
        sweep_grace_ms: a.sweep_grace_ms,
        sweep_batch_max: 64,
        mutant: c.mutant()?,
    };
    let config = Config {
        policy,
        in_flight_max: a.in_flight_max,
        read_count_max: a.in_flight_max,
        idle_poll_ms: 100,
        call_timeout_ms: c.call_timeout_ms,
        reclaim_every_ms: a.reclaim_every_ms,
        maintenance_every_ms: a.maintenance_every_ms,
        shutdown_grace_ms: a.shutdown_grace_ms,
        job_timeout_ms: a.job_timeout_ms,
        retention_ms: if a.no_maintenance { 0 } else { a.retention_ms },
    };
    if c.call_timeout_ms <= a.read_block_ms {
        bail!(
            "--call-timeout-ms ({}) must exceed --read-block-ms ({}): a blocked read must answer in time",
            c.call_timeout_ms,
            a.read_block_ms
        );
    }
    config.validate().map_err(anyhow::Error::msg)?;
    install_metrics(a.metrics_listen)?;
    let id = WorkerId(a.id.unwrap_or_else(std::process::id));
    let clients = connect(c, a.read_block_ms).await?;
    let tools = Arc::new(PgTools(clients.db.clone()));
    let registry = Registry::with_builtins(tools, &config.policy)
        .with_tool_timeout(Duration::from_millis(c.call_timeout_ms));
    let trace = trace_probe(a.trace_file.as_deref(), &config.policy)?;
    let io = Arc::new(Io {
        stream: Batching::stream(
            clients.stream,
            a.batch_max as usize,
            Duration::from_millis(config.call_timeout_ms),
        ),
        db: Batching::db(
            clients.db,
            a.batch_max as usize,
            Duration::from_millis(config.call_timeout_ms),
        ),
        probe: (MetricsProbe::default(), trace),
        entropy: Arc::new(OsEntropy),
        config,
    });
    tracing::info!(worker = %id.consumer(), in_flight_max = a.in_flight_max, "worker started");
    let left = Worker::new(io, Arc::new(registry), id, !a.no_maintenance)
        .run(shutdown_signal())
        .await;
    if left > 0 {
        tracing::warn!(
            left,
            "shutdown grace over: jobs left pending for other workers"
        );
    }
    tracing::info!("worker stopped");
    Ok(())
}

async fn serve_api(c: &Connection, a: ApiArgs) -> Result<()> {
    let handle = install_metrics(None)?;
    let clients = connect(c, 0).await?;
    let config = c.config(a.attempts_max)?;
    if a.api_token.is_none() {
        tracing::warn!("no --api-token: mutating routes are open to anyone who can reach the API");
    }
    let trace = trace_probe(a.trace_file.as_deref(), &config.policy)?;
    let state = Arc::new(ApiState {
        io: io(clients, config, trace),
        token: a.api_token,
        metrics: handle,
    });
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    tracing::info!(listen = %a.listen, "api started");
    axum::serve(listener, api::router(state, a.body_limit_bytes))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving the API")?;
    Ok(())
}

fn trace_probe(
    path: Option<&std::path::Path>,
    policy: &Policy,
) -> Result<Option<pelican_real::trace::TraceProbe>> {
    path.map(|p| {
        pelican_real::trace::TraceProbe::create(p, policy)
            .with_context(|| format!("creating the trace file {}", p.display()))
    })
    .transpose()
}

async fn main_inner(cli: Cli) -> Result<()> {
    let c = &cli.conn;
    match cli.command {
        Cmd::Migrate => {
            let clients = connect(c, 0).await?;
            clients.db.migrate().await?;
            let io = io(clients, Config::default(), NoProbe);
            match io
                .stream
                .execute(pelican_model::protocol::StreamOp::EnsureGroup)
                .await
            {
                Ok(Ok(_)) => {}
                _ => bail!("creating the consumer group failed"),
            }
            println!("schema and consumer group ready");
        }
        Cmd::Api(a) => serve_api(c, a).await?,
        Cmd::Worker(a) => worker(c, a).await?,
        Cmd::Submit {
            kind,
            input,
            attempts_max,
        } => {
            api::validate_kind(&kind).map_err(anyhow::Error::msg)?;
            let input: serde_json::Value =
                serde_json::from_str(&input).context("the input is not JSON")?;
            let clients = connect(c, 0).await?;
            let io = io(clients, c.config(attempts_max)?, NoProbe);
            let run = match io.db.execute(&DbOp::NextRunId).await? {
                DbReply::NewRun(r) => r,
                other => bail!("unexpected answer {other:?}"),
            };
            match submit(&io, run, &kind, &input.to_string()).await {
                SubmitterEnd::Accepted { published } => {
                    print(&json!({ "run_id": run.0, "published": published }));
                }
                SubmitterEnd::Unavailable => {
                    bail!("Postgres did not accept the run; nothing was stored")
                }
            }
        }
        Cmd::Status { run } => {
            let db = connect_db(c).await?;
            match run {
                Some(r) => {
                    let view = api::run_view(&db, run_id(&r)?)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    print(&view);
                }
                None => {
                    let counts = match db.execute(&DbOp::CountRuns).await? {
                        DbReply::Counts(c) => c,
                        other => bail!("unexpected answer {other:?}"),
                    };
                    let clients = connect(c, 0).await?;
                    let mut conn = clients.stream.connection();
                    let names = clients.stream.names().clone();
                    let pending: redis::Value = redis::cmd("XPENDING")
                        .arg(&names.jobs)
                        .arg(&names.group)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(redis::Value::Nil);
                    let pel = match pending {
                        redis::Value::Array(v) => match v.first() {
                            Some(redis::Value::Int(n)) => *n,
                            _ => 0,
                        },
                        _ => 0,
                    };
                    let runs: serde_json::Map<String, serde_json::Value> = counts
                        .iter()
                        .map(|(s, n)| (s.as_str().to_owned(), json!(n)))
                        .collect();
                    print(
                        &json!({ "runs": runs, "pending_deliveries": pel, "stream": names.jobs, "group": names.group }),
                    );
                }
            }
        }
        Cmd::Cancel { run } => {
            let run = run_id(&run)?;
            let clients = connect(c, 0).await?;
            let io = io(clients, Config::default(), NoProbe);
            match cancel(&io, run).await {
                Ok(true) => print(&json!({ "run_id": run.0, "status": "cancelled" })),
                Ok(false) => bail!("run {} is unknown or already ended", run.0),
                Err(_) => {
                    bail!("Postgres did not answer; the cancel may not have happened, retry it")
                }
            }
        }
        Cmd::Trace(TraceCmd::Check { files }) => {
            let mut bad = 0;
            for f in &files {
                match pelican_real::trace::check_file(f) {
                    Ok(n) => println!("{}: conforms, {n} events", f.display()),
                    Err(r) => {
                        bad += 1;
                        println!("{}: does NOT conform\n{r}", f.display());
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} of {} traces do not conform", files.len());
            }
        }
        Cmd::Dlq(DlqCmd::List { limit }) => {
            let db = connect_db(c).await?;
            let letters = match db.execute(&DbOp::ListDeadLetters { limit }).await? {
                DbReply::DeadLetters(d) => d,
                other => bail!("unexpected answer {other:?}"),
            };
            let rows: Vec<serde_json::Value> = letters
                .iter()
                .map(|(run, d)| {
                    json!({
                        "run_id": run.0,
                        "class": d.class.as_str(),
                        "message": d.message,
                        "source_entry": d.source_entry.map(|e| e.to_string()),
                        "requeued": d.requeued,
                        "attempts": d.attempts.iter().map(|(n, f, o)| json!([n.0, f.0, o.map(|o| format!("{o:?}"))])).collect::<Vec<_>>(),
                    })
                })
                .collect();
            print(&json!(rows));
        }
        Cmd::Dlq(DlqCmd::Requeue {
            run,
            extra_attempts,
        }) => {
            let run = run_id(&run)?;
            if extra_attempts == 0 {
                bail!("--extra-attempts must be at least 1");
            }
            let db = connect_db(c).await?;
            match db
                .execute(&DbOp::DlqRequeue {
                    run,
                    extra_attempts,
                })
                .await?
            {
                DbReply::Rows(1) => print(
                    &json!({ "run_id": run.0, "status": "queued", "extra_attempts": extra_attempts }),
                ),
                _ => bail!("run {} is not dead (or was requeued already)", run.0),
            }
        }
    }
    Ok(())
}

// The worker allocates per delivery (futures, commands, replies); glibc's
// malloc was a fifth of its CPU time in the drain benchmark's profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format, cli.log_level);
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pelican: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_inner(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelican: {e:#}");
            ExitCode::FAILURE
        }
    }
}
