// Over 600 lines: one function a command of the binary, with the connections they share.
//! What each command does: connecting, the worker, the API and the
//! operator's commands.

use super::args::*;
use super::output;
use crate::jobs::Registry;
use crate::live::api::{self, ApiState};
use crate::live::metrics::MetricsProbe;
use crate::live::otel::Otel;
use crate::live::{PgDb, PgTools, RedisAddr, RedisStream, StreamNames};
use crate::{
    Batching, Config, Entropy, Io, NoProbe, Probe, Requeued, Worker, cancel, requeue_dead, submit,
};
use anyhow::{Context, Result, bail};
use pelican_model::db::{Delay, query};
use pelican_model::ids::{RunId, WorkerId};
use pelican_model::protocol::{Policy, StreamOp, StreamReply, SubmitterEnd};
use pelican_model::status::RunStatus;
use pelican_model::time::Timestamp;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct OsEntropy;
impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

pub(crate) fn init_logs(format: LogFormat, level: tracing::Level) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub(crate) fn run_id(s: &str) -> Result<RunId> {
    s.strip_prefix("run-")
        .unwrap_or(s)
        .parse::<u64>()
        .map(RunId)
        .with_context(|| format!("{s:?} is not a run id (a number, or run-<number>)"))
}

pub(crate) struct Clients {
    pub(crate) stream: RedisStream,
    pub(crate) db: PgDb,
}

pub(crate) async fn connect_db(c: &Connection) -> Result<PgDb> {
    PgDb::connect(
        &c.database_url,
        crate::live::pg::POOL_MAX,
        Duration::from_millis(c.call_timeout_ms),
    )
    .await
    .with_context(|| format!("connecting to Postgres at {}", redact(&c.database_url)))
}

/// Connects to Postgres and Redis, with this process's partition count
/// agreed with the deployment's ([`super::deployment::agree`]).
pub(crate) async fn connect(c: &Connection, read_block_ms: u64) -> Result<Clients> {
    let clients = connect_unagreed(c, read_block_ms).await?;
    super::deployment::agree(&clients.db, c.partitions).await?;
    Ok(clients)
}

/// [`connect`] without the partition count's agreement: for `migrate`,
/// before the deployment's table exists, and for `partitions`.
pub(crate) async fn connect_unagreed(c: &Connection, read_block_ms: u64) -> Result<Clients> {
    let db = connect_db(c).await?;
    let stream = RedisStream::connect(
        &RedisAddr::new(&c.redis_url, c.redis_cluster),
        StreamNames::partitioned(&c.stream, &c.group, c.partitions).map_err(anyhow::Error::msg)?,
        read_block_ms,
        Duration::from_millis(c.call_timeout_ms),
    )
    .await
    .context("connecting to Redis")?;
    Ok(Clients { stream, db })
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
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

pub(crate) fn io<P: Probe>(clients: Clients, config: Config, probe: P) -> Io<RedisStream, PgDb, P> {
    Io {
        stream: clients.stream,
        db: clients.db,
        probe,
        entropy: Arc::new(OsEntropy),
        config,
    }
}

pub(crate) async fn shutdown_signal() {
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

/// Installs the metrics recorder, with its upkeep (draining histogram
/// samples every 5 s, so that they take bounded memory between scrapes).
pub(crate) fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The worker's own listener (`--metrics-listen`): `/metrics`, `/healthz`
/// (the process serves) and `/readyz` (200 while connected and reading,
/// else 503, with the parts as JSON).
async fn serve_worker_http(
    addr: SocketAddr,
    handle: metrics_exporter_prometheus::PrometheusHandle,
    readiness: Arc<crate::live::metrics::Readiness>,
) -> Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on --metrics-listen {addr}"))?;
    let app = axum::Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let (ready, reading, postgres, stopping) = readiness.state();
                let code = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let body = json!({ "ready": ready, "reading": reading, "postgres": postgres, "stopping": stopping });
                std::future::ready((code, axum::Json(body)))
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// The worker's driver configuration from its flags.
fn worker_config(c: &Connection, a: &WorkerArgs, handlers: fn(&mut Registry)) -> Result<Config> {
    let policy = Policy {
        lease_ms: a.lease_ms,
        heartbeat_ms: a.heartbeat_ms,
        reclaim_min_idle_ms: a.reclaim_min_idle_ms,
        reclaim_batch_max: a.in_flight_max.max(1),
        attempts_max: Policy::default().attempts_max,
        backoff_base_ms: a.backoff_base_ms,
        backoff_cap_ms: a.backoff_cap_ms,
        sweep_grace_ms: a.sweep_grace_ms,
        sweep_batch_max: a.maintenance_batch_max as usize,
        value_bytes_max: usize::try_from(a.value_bytes_max).unwrap_or(usize::MAX),
        keep_finished_ms: a.keep_finished_ms,
        unknown_retries_max: a.unknown_retries_max,
        catchup_after_ms: a.catchup_after_ms,
        partitions: c.partitions,
        kinds: c.kinds(handlers),
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
        promote_every_ms: a.promote_every_ms,
        shutdown_grace_ms: a.shutdown_grace_ms,
        job_timeout_ms: a.job_timeout_ms,
        retention_ms: if a.no_maintenance { 0 } else { a.retention_ms },
        clock_offset_ms: a.clock_offset_ms,
    };
    if c.call_timeout_ms <= a.read_block_ms {
        bail!(
            "--call-timeout-ms ({}) must exceed --read-block-ms ({}): a blocked read must answer in time",
            c.call_timeout_ms,
            a.read_block_ms
        );
    }
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// This worker's number: `--id`, or the next from the worker registry.
async fn worker_id(a: &WorkerArgs, db: &PgDb) -> Result<WorkerId> {
    Ok(match a.id {
        Some(n) => WorkerId(n),
        None => {
            let host = host_name();
            let q = query::RegisterWorker {
                host: host.clone(),
                pid: std::process::id(),
            };
            match db.query(q).await {
                Ok(id) => id,
                Err(e) => bail!("registering the worker (host {host}) in Postgres: {e}"),
            }
        }
    })
}

pub(crate) async fn worker(
    c: &Connection,
    a: WorkerArgs,
    handlers: fn(&mut Registry),
) -> Result<()> {
    let config = worker_config(c, &a, handlers)?;
    let handle = install_metrics()?;
    let probe = MetricsProbe::default();
    if let Some(addr) = a.metrics_listen {
        serve_worker_http(addr, handle, probe.readiness.clone()).await?;
    }
    let clients = connect(c, a.read_block_ms).await?;
    let id = worker_id(&a, &clients.db).await?;
    let tools = Arc::new(PgTools(clients.db.clone()));
    let ledger = Arc::new(clients.db.clone());
    let mut registry = Registry::new(tools, ledger, &config.policy)
        .with_tool_timeout(Duration::from_millis(c.call_timeout_ms));
    let otel = otel(c, "worker")?;
    if let Some(o) = &otel {
        registry = registry.with_step_hook(Arc::new(o.clone()));
    }
    handlers(&mut registry);
    for (provider, limit) in a.provider_limit {
        registry.limit(&provider, limit);
    }
    let trace = trace_probe(
        a.trace_file.as_deref(),
        &config.policy,
        config.clock_offset_ms,
    )?;
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
        probe: (probe, (trace, otel.clone())),
        entropy: Arc::new(OsEntropy),
        config,
    });
    tracing::info!(worker = %id.consumer(), in_flight_max = a.in_flight_max, "worker started");
    let readiness = io.probe.0.readiness.clone();
    let shutdown = async move {
        shutdown_signal().await;
        readiness.stop();
    };
    let left = Worker::new(io, Arc::new(registry), id, !a.no_maintenance)
        .run(shutdown)
        .await;
    if left > 0 {
        tracing::warn!(
            left,
            "shutdown grace over: jobs left pending for other workers"
        );
    }
    stop_otel(otel).await;
    tracing::info!("worker stopped");
    Ok(())
}

pub(crate) async fn serve_api(
    c: &Connection,
    a: ApiArgs,
    handlers: fn(&mut Registry),
) -> Result<()> {
    if a.api_token.is_none() && !a.insecure_no_auth {
        bail!(
            "refusing to serve the API without a token: set --api-token (PELICAN_API_TOKEN), \
             or pass --insecure-no-auth to serve every route to anyone who can reach it"
        );
    }
    if a.insecure_no_auth {
        tracing::warn!("--insecure-no-auth: every route is open to anyone who can reach the API");
    }
    let handle = install_metrics()?;
    let clients = connect(c, 0).await?;
    let config = c.config(a.attempts_max, handlers)?;
    let trace = trace_probe(a.trace_file.as_deref(), &config.policy, 0)?;
    let timeout = Duration::from_millis(config.call_timeout_ms);
    let bulk_max = a.bulk_max as usize;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let watchers =
        crate::live::watchers::Watchers::start(clients.db.clone(), a.events_streams_max as usize);
    let otel = otel(c, "api")?;
    let state = Arc::new(ApiState {
        stopping,
        watchers,
        otel: otel.clone(),
        io: Io {
            stream: Batching::stream(clients.stream, bulk_max, timeout),
            db: Batching::db(clients.db, bulk_max, timeout),
            probe: trace,
            entropy: Arc::new(OsEntropy),
            config,
        },
        bulk_max,
        token: a.api_token,
        read_token: a.api_read_token,
        metrics: handle,
    });
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    tracing::info!(listen = %a.listen, "api started");
    tokio::spawn(api::expire_keys(
        state.clone(),
        Duration::from_millis(a.submit_keys_keep_ms),
    ));
    let bounds = crate::live::serve::Bounds {
        connections_max: a.connections_max as usize,
        header_read: Duration::from_millis(a.header_read_timeout_ms),
    };
    let stopped = state.stopping.clone();
    let server = crate::live::serve::serve(
        listener,
        api::router(state, a.body_limit_bytes),
        bounds,
        stopped,
    );
    let grace = Duration::from_millis(a.shutdown_grace_ms);
    // The signal stops the server's accepting and ends the events streams
    // (their stream watches `stopping`); what is still in flight a grace
    // later is cut.
    let signalled = async move {
        shutdown_signal().await;
        let _ = stop.send(true);
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = server => {}
        () = signalled => tracing::warn!(grace_ms = a.shutdown_grace_ms,
            "shutdown grace over: requests still in flight were cut"),
    }
    stop_otel(otel).await;
    Ok(())
}

/// The span exporter of process `process`, if `--otlp-endpoint` is given.
fn otel(c: &Connection, process: &'static str) -> Result<Option<Otel>> {
    c.otlp_endpoint
        .as_deref()
        .map(|e| Otel::new(e, process))
        .transpose()
}

/// Sends the spans still queued, and stops the exporter.
async fn stop_otel(otel: Option<Otel>) {
    if let Some(o) = otel {
        let _ = tokio::task::spawn_blocking(move || o.shutdown()).await;
    }
}

pub(crate) fn trace_probe(
    path: Option<&std::path::Path>,
    policy: &Policy,
    clock_offset_ms: i64,
) -> Result<Option<crate::trace::TraceProbe>> {
    path.map(|p| {
        crate::trace::TraceProbe::create(p, policy, clock_offset_ms)
            .with_context(|| format!("creating the trace file {}", p.display()))
    })
    .transpose()
}

pub(crate) async fn main_inner(cli: Cli, handlers: fn(&mut Registry)) -> Result<()> {
    let c = &cli.conn;
    let json = cli.json;
    match cli.command {
        Cmd::Dev(a) => super::dev::dev(c, a).await,
        Cmd::Migrate => migrate(c).await,
        Cmd::Bench(a) => super::bench::bench(&a, json).await,
        Cmd::Partitions { set } => super::deployment::partitions(c, set).await,
        Cmd::Api(a) => serve_api(c, a, handlers).await,
        Cmd::Worker(a) => worker(c, a, handlers).await,
        Cmd::Submit {
            kind,
            input,
            attempts_max,
            key,
            delay,
            at,
            from_file,
            batch_max,
        } => {
            let config = c.config(attempts_max, handlers)?;
            match (from_file, kind) {
                (Some(path), _) => submit_file(c, config, &path, batch_max as usize, json).await,
                (None, Some(kind)) => {
                    let new = crate::NewRun {
                        key,
                        delay: Delay {
                            delay_ms: delay.unwrap_or(0),
                            at_ms: at.unwrap_or(0),
                        },
                        ..crate::NewRun::new(&kind, &input)
                    };
                    submit_one(c, config, new, json).await
                }
                (None, None) => bail!("name a KIND, or give --from-file"),
            }
        }
        Cmd::Status { run: Some(r) } => {
            let view = api::run_view(&connect_db(c).await?, run_id(&r)?)
                .await
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            output::show(json, &view, output::run);
            Ok(())
        }
        Cmd::Status { run: None } => status(c, json).await,
        Cmd::Cancel { run } => cancel_one(c, &run, json).await,
        Cmd::Watch {
            run,
            api_url,
            api_token,
        } => watch(&run, &api_url, api_token.as_deref(), json).await,
        Cmd::Trace(TraceCmd::Check { files }) => check_traces(&files),
        Cmd::Openapi => {
            println!("{}", api::openapi().to_pretty_json()?);
            Ok(())
        }
        Cmd::Schedule(cmd) => super::schedules::run(c, cmd, json).await,
        Cmd::Dlq(DlqCmd::List { limit }) => dlq_list(c, limit, json).await,
        Cmd::Dlq(DlqCmd::Requeue {
            run,
            extra_attempts,
        }) => dlq_requeue(c, &run, extra_attempts, handlers, json).await,
    }
}

/// `pelican migrate`: the schema, then the consumer group.
pub(crate) async fn migrate(c: &Connection) -> Result<()> {
    let clients = connect_unagreed(c, 0).await?;
    clients.db.migrate().await?;
    super::deployment::agree(&clients.db, c.partitions).await?;
    let io = io(clients, Config::default(), NoProbe);
    for partition in 0..c.partitions {
        match io.stream.execute(StreamOp::EnsureGroup { partition }).await {
            Ok(Ok(_)) => {}
            _ => bail!("creating the consumer group of partition {partition} failed"),
        }
    }
    println!("schema and consumer group ready");
    Ok(())
}

/// `pelican submit`: one run, through the submitter the API uses.
async fn submit_one(
    c: &Connection,
    config: Config,
    mut new: crate::NewRun,
    json: bool,
) -> Result<()> {
    api::validate_kind(&new.kind).map_err(anyhow::Error::msg)?;
    if let Some(k) = &new.key {
        api::validate_key(k).map_err(anyhow::Error::msg)?;
    }
    let input: serde_json::Value =
        serde_json::from_str(&new.input).context("the input is not JSON")?;
    new.input = input.to_string();
    let key = new.key.clone();
    let key = key.as_deref();
    let clients = connect(c, 0).await?;
    let io = io(clients, config, NoProbe);
    let run = io.db.query(query::NextRunId {}).await?;
    match submit(&io, run, &new).await {
        SubmitterEnd::Accepted { published } => {
            let answer = pelican_client::Submitted {
                run_id: run,
                status: Some(if new.delay.waits() {
                    RunStatus::Delayed
                } else {
                    RunStatus::Queued
                }),
                published: Some(published),
                existing: false,
            };
            output::show(json, &answer, output::submitted);
            Ok(())
        }
        SubmitterEnd::Existing(first) => {
            let answer = pelican_client::Submitted {
                run_id: first,
                status: None,
                published: None,
                existing: true,
            };
            output::show(json, &answer, output::submitted);
            Ok(())
        }
        SubmitterEnd::KeyConflict(first) => {
            bail!(
                "key {:?} was first used for run {} with another request; nothing was stored",
                key.unwrap_or_default(),
                first.0
            )
        }
        SubmitterEnd::Unavailable => {
            bail!(
                "Postgres did not answer: the run may or may not be stored; {}",
                if key.is_some() {
                    "retry with the same --key"
                } else {
                    "retrying may store a second run (use --key to retry safely)"
                }
            )
        }
        SubmitterEnd::Refused => {
            bail!("Postgres refused the run's values (text holding a NUL byte); nothing was stored")
        }
    }
}

/// How many batches of a `--from-file` submission are in flight at once:
/// while one inserts, another publishes and a third marks.
const FILE_BATCHES_IN_FLIGHT: usize = 4;

/// A line of a `--from-file` submission.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLine {
    kind: String,
    #[serde(default = "empty_object")]
    input: serde_json::Value,
    key: Option<String>,
    delay_ms: Option<u64>,
    run_at_ms: Option<u64>,
}

fn empty_object() -> serde_json::Value {
    json!({})
}

/// Line `text`, as a run to submit, or why it is not one.
fn file_line(text: &str) -> Result<crate::NewRun, String> {
    let line: FileLine = serde_json::from_str(text).map_err(|e| e.to_string())?;
    api::validate_kind(&line.kind)?;
    if let Some(k) = &line.key {
        api::validate_key(k)?;
    }
    Ok(crate::NewRun {
        kind: line.kind,
        input: line.input.to_string(),
        key: line.key,
        trace: None,
        delay: api::delay_of(line.delay_ms, line.run_at_ms)?,
    })
}

/// `pelican submit --from-file`: one JSON object a line (`{"kind", "input",
/// "key"}`), submitted `batch_max` lines at a time ([`crate::submit_many`]),
/// a few batches at once. A bad line, or a run Postgres refuses, fails
/// alone: every other line is stored. Prints what became of the lines.
/// A file's non-blank lines as runs, with the line number of each, and
/// the lines that are not runs, each with its error.
fn file_lines(text: &str) -> (Vec<crate::NewRun>, Vec<usize>, Vec<serde_json::Value>) {
    let (mut runs, mut line_of, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match file_line(line) {
            Ok(run) => {
                runs.push(run);
                line_of.push(i + 1);
            }
            Err(e) => failed.push(json!({ "line": i + 1, "error": e })),
        }
    }
    (runs, line_of, failed)
}

/// What a file's submissions came to, so far.
#[derive(Default)]
struct FileTally {
    accepted: u64,
    existing: u64,
    unpublished: u64,
}

impl FileTally {
    /// Counts a batch's ends, one a line of `lines`; a line not stored
    /// goes to `failed` with why.
    fn count(
        &mut self,
        lines: &[usize],
        ends: Vec<(RunId, SubmitterEnd)>,
        failed: &mut Vec<serde_json::Value>,
    ) {
        for (line, (run, end)) in lines.iter().zip(ends) {
            let error = match end {
                SubmitterEnd::Accepted { published } => {
                    self.accepted += 1;
                    self.unpublished += u64::from(!published);
                    continue;
                }
                SubmitterEnd::Existing(_) => {
                    self.existing += 1;
                    continue;
                }
                SubmitterEnd::KeyConflict(first) => {
                    format!(
                        "its key was first used for run {} with another request",
                        first.0
                    )
                }
                SubmitterEnd::Unavailable => format!(
                    "Postgres did not answer: run {} may or may not be stored (a line with a key is safe to submit again)",
                    run.0
                ),
                SubmitterEnd::Refused => {
                    "Postgres refused its values (text holding a NUL byte)".to_owned()
                }
            };
            failed.push(json!({ "line": line, "error": error }));
        }
    }
}

async fn submit_file(
    c: &Connection,
    config: Config,
    path: &std::path::Path,
    batch_max: usize,
    json: bool,
) -> Result<()> {
    use futures_util::StreamExt;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (runs, line_of, mut failed) = file_lines(&text);
    let clients = connect(c, 0).await?;
    let timeout = Duration::from_millis(config.call_timeout_ms);
    let io = Io {
        stream: Batching::stream(clients.stream, batch_max, timeout),
        db: Batching::db(clients.db, batch_max, timeout),
        probe: NoProbe,
        entropy: Arc::new(OsEntropy),
        config,
    };
    let batch_max = batch_max.max(1);
    let mut ends = futures_util::stream::iter(runs.chunks(batch_max).enumerate())
        .map(|(b, chunk)| {
            let io = &io;
            async move {
                let ids = crate::new_run_ids(io, chunk.len()).await;
                let ends = match ids {
                    Ok(ids) => {
                        let runs: Vec<_> = ids.into_iter().zip(chunk.iter().cloned()).collect();
                        let ends = crate::submit_many(io, &runs).await;
                        Ok(runs
                            .into_iter()
                            .map(|(run, _)| run)
                            .zip(ends)
                            .collect::<Vec<_>>())
                    }
                    Err(e) => Err(e),
                };
                (b, ends)
            }
        })
        .buffer_unordered(FILE_BATCHES_IN_FLIGHT);
    let mut tally = FileTally::default();
    while let Some((b, ends)) = ends.next().await {
        let lines = &line_of[b * batch_max..(b * batch_max + batch_max).min(line_of.len())];
        match ends {
            Ok(ends) => tally.count(lines, ends, &mut failed),
            Err(_) => {
                for line in lines {
                    failed.push(json!({ "line": line, "error": "Postgres did not answer; nothing of this line was stored" }));
                }
            }
        }
    }
    failed.sort_by_key(|f| f["line"].as_u64());
    report_file(json, path, &tally, &failed)
}

/// Prints what a file's submission came to, and fails if a line was not
/// stored.
fn report_file(
    json: bool,
    path: &std::path::Path,
    tally: &FileTally,
    failed: &[serde_json::Value],
) -> Result<()> {
    let FileTally {
        accepted,
        existing,
        unpublished,
    } = *tally;
    let report = json!({
        "accepted": accepted,
        "existing": existing,
        "unpublished": unpublished,
        "failed": failed.len(),
        "failures": failed.iter().take(100).collect::<Vec<_>>(),
    });
    output::show(json, &report, |_| {
        let mut text = format!(
            "{accepted} stored ({unpublished} left to the outbox), {existing} existed already, {} failed\n",
            failed.len()
        );
        for f in failed.iter().take(100) {
            text.push_str(&format!(
                "line {}: {}\n",
                f["line"],
                f["error"].as_str().unwrap_or("")
            ));
        }
        text
    });
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} line(s) of {} were not stored",
            failed.len(),
            path.display()
        )
    }
}

/// `pelican status` without a run: runs by status and the queue.
async fn status(c: &Connection, json: bool) -> Result<()> {
    let db = connect_db(c).await?;
    let counts = db.query(query::CountRuns {}).await?;
    let clients = connect(c, 0).await?;
    let names = clients.stream.names().clone();
    let queue = match clients
        .stream
        .execute(StreamOp::Queue {
            now: Timestamp::ZERO,
        })
        .await
    {
        Ok(Ok(StreamReply::Queue(q))) => q,
        Ok(other) => bail!("unexpected answer {other:?}"),
        Err(_) => bail!("Redis did not answer"),
    };
    let runs: Vec<(String, u64)> = counts
        .iter()
        .map(|(s, n)| (s.as_str().to_owned(), *n))
        .collect();
    let queue = api::queue_view(&names, &queue);
    let report = json!({ "runs": runs.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(), "queue": queue });
    output::show(json, &report, |_| output::status(&runs, &queue));
    Ok(())
}

/// `pelican cancel`.
async fn cancel_one(c: &Connection, run: &str, json: bool) -> Result<()> {
    let run = run_id(run)?;
    let clients = connect(c, 0).await?;
    let io = io(clients, Config::default(), NoProbe);
    match cancel(&io, run).await {
        Ok(true) => {
            let answer = pelican_client::wire::Changed {
                run_id: run,
                status: RunStatus::Cancelled,
                extra_attempts: None,
            };
            output::show(json, &answer, output::changed);
            Ok(())
        }
        Ok(false) => bail!("run {} is unknown or already ended", run.0),
        Err(_) => {
            bail!("Postgres did not answer; the cancel may not have happened, retry it")
        }
    }
}

/// `pelican trace check`.
fn check_traces(files: &[std::path::PathBuf]) -> Result<()> {
    let mut bad = 0;
    for f in files {
        match crate::trace::check_file(f) {
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
    Ok(())
}

/// `pelican dlq list`.
async fn dlq_list(c: &Connection, limit: usize, json: bool) -> Result<()> {
    let db = connect_db(c).await?;
    let after = RunId(0);
    let letters = db.query(query::ListDeadLetters { after, limit }).await?;
    let rows: Vec<_> = letters
        .iter()
        .map(|(run, d)| api::dead_letter_view(*run, d))
        .collect();
    output::show(json, &rows, |r| output::dead_letters(r));
    Ok(())
}

/// `pelican dlq requeue`: with `extra_attempts` more, and a fresh budget
/// as the run's kind has it here.
async fn dlq_requeue(
    c: &Connection,
    run: &str,
    extra_attempts: u32,
    handlers: fn(&mut Registry),
    json: bool,
) -> Result<()> {
    let run = run_id(run)?;
    if extra_attempts == 0 {
        bail!("--extra-attempts must be at least 1");
    }
    let policy = c.config(Policy::default().attempts_max, handlers)?.policy;
    let db = connect_db(c).await?;
    match requeue_dead(&db, &policy, run, extra_attempts).await {
        Ok(Requeued::Yes) => {
            let answer = pelican_client::wire::Changed {
                run_id: run,
                status: RunStatus::Queued,
                extra_attempts: Some(extra_attempts),
            };
            output::show(json, &answer, output::changed);
            Ok(())
        }
        Ok(Requeued::NotDead) => bail!("run {} is not dead (or was requeued already)", run.0),
        Ok(Requeued::NoRun) => bail!("no run {}", run.0),
        Err(_) => {
            bail!("Postgres did not answer; the requeue may have happened, and is safe to repeat")
        }
    }
}

/// This machine's host name (a container's is its pod name), for the
/// worker registry.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// `pelican watch RUN`: the run's events, one line each, until it ends.
async fn watch(run: &str, api_url: &str, token: Option<&str>, json: bool) -> Result<()> {
    use futures_util::StreamExt;
    use pelican_client::{Client, EventKind};
    let run = run_id(run)?;
    let mut client = Client::new(api_url)?;
    if let Some(t) = token {
        client = client.with_token(t);
    }
    let mut events = std::pin::pin!(client.watch(run));
    let mut last = None;
    while let Some(event) = events.next().await {
        let e = event?;
        if json {
            println!("{}", serde_json::to_string(&e)?);
        } else {
            let detail = match e.kind {
                EventKind::Claimed => format!(
                    "attempt {} fence {} by {}",
                    e.attempt,
                    e.fence,
                    e.worker.as_deref().unwrap_or("?")
                ),
                EventKind::Progress => format!(
                    "attempt {}: {}",
                    e.attempt,
                    e.progress
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                ),
                _ => match (&e.class, &e.message) {
                    (Some(class), Some(message)) => {
                        format!("attempt {}: {class}: {message}", e.attempt)
                    }
                    _ if e.attempt > 0 => format!("attempt {}", e.attempt),
                    _ => String::new(),
                },
            };
            println!("{:>4}  {:<15} {detail}", e.seq, e.kind.as_str());
        }
        last = Some(e.kind);
    }
    match last {
        Some(EventKind::Succeeded) | None => Ok(()),
        Some(kind) => Err(anyhow::anyhow!("{run} ended: {kind}")),
    }
}
