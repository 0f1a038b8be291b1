// Over 600 lines: every command's flags with their help, one clap tree (docs/CONFIGURATION.md is
// generated from it); each struct is one command's.
//! The command line: every command, flag and environment variable.

use crate::Config;
use crate::jobs::{ProviderLimit, Registry};
use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use pelican_model::protocol::KindPolicy;
use std::collections::BTreeMap;
use std::net::SocketAddr;

#[derive(Parser)]
#[command(
    name = "pelican",
    version,
    about = "Durable jobs on Redis Streams, with PostgreSQL as the source of truth"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) conn: Connection,
    /// Log format: `text` for people, `json` for a log pipeline.
    #[arg(
        long,
        env = "PELICAN_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub(crate) log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "PELICAN_LOG_LEVEL", default_value = "info", global = true)]
    pub(crate) log_level: tracing::Level,
    /// Print JSON for scripts (the API's bodies; `watch`: one event a
    /// line) instead of tables and lines for people.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Clone)]
pub(crate) struct Connection {
    /// Redis URL; with `--redis-cluster`, the URLs of some of the
    /// cluster's nodes, separated by commas.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub(crate) redis_url: String,
    /// Redis is a Redis Cluster: commands go to their key's slot's master
    /// and follow its failover (OPERATIONS.md, "Redis Cluster").
    #[arg(long, env = "PELICAN_REDIS_CLUSTER", global = true)]
    pub(crate) redis_cluster: bool,
    /// OpenTelemetry: where the API and the workers send their spans, as
    /// OTLP over HTTP/protobuf (`http://host:4318`; a URL without a path
    /// gets `/v1/traces`). Off when not given, and then free.
    #[arg(long, env = "PELICAN_OTLP_ENDPOINT", global = true)]
    pub(crate) otlp_endpoint: Option<String>,
    /// PostgreSQL URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/pelican",
        global = true
    )]
    pub(crate) database_url: String,
    /// Stream key prefix: jobs go to `<prefix>:jobs`, dead-letter
    /// notices to `<prefix>:jobs:dead`.
    #[arg(long, env = "PELICAN_STREAM", default_value = "pelican", global = true)]
    pub(crate) stream: String,
    /// Consumer group.
    #[arg(long, env = "PELICAN_GROUP", default_value = "pelican", global = true)]
    pub(crate) group: String,
    /// Job stream partitions (1 to 1024): runs spread over this many
    /// stream keys, each with its consumer group, whose hash tags put them
    /// on different slots of a Redis Cluster. The deployment's count is
    /// stored in Postgres by the first process to connect; a process
    /// started with another refuses to start. `pelican partitions --set
    /// N` raises it, never lowers it (OPERATIONS.md, "Partitions").
    #[arg(
        long,
        env = "PELICAN_PARTITIONS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=1024),
        global = true
    )]
    pub(crate) partitions: u16,
    /// How long any Redis or Postgres call may take before it counts as
    /// unavailable.
    #[arg(
        long,
        env = "PELICAN_CALL_TIMEOUT_MS",
        default_value_t = 5_000,
        global = true
    )]
    pub(crate) call_timeout_ms: u64,
    /// Inject a protocol bug into every role this process runs (testing
    /// only; exists only in builds with the `mutants` feature).
    #[cfg(feature = "mutants")]
    #[arg(long, env = "PELICAN_MUTANT", global = true, hide = true)]
    pub(crate) mutant: Option<String>,
    /// A kind's policy, over what its handler was registered with:
    /// `KIND:field=N,...` with fields attempts_max, backoff_base_ms,
    /// backoff_cap_ms, attempt_timeout_ms, budget_ms (0: none). Repeat
    /// the flag per kind; in the variable, separate kinds with `;`.
    /// Attempts and budget apply to runs submitted after; give the API and
    /// the workers the same.
    #[arg(
        long,
        env = "PELICAN_KIND_POLICY",
        value_delimiter = ';',
        value_parser = parse_kind_policy,
        global = true
    )]
    pub(crate) kind_policy: Vec<(String, KindPolicy)>,
}

/// `WHAT:field=N,...`, as `--kind-policy` and `--provider-limit` take it:
/// the name before the colon (`what` names it in errors), then each field
/// with its number, in order.
fn parse_fields(text: &str, what: &str) -> Result<(String, Vec<(String, u64)>), String> {
    let (name, fields) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not {}:field=N,...", what.to_uppercase()))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{text:?} names no {what}"));
    }
    let fields = fields
        .split(',')
        .filter(|f| !f.trim().is_empty())
        .map(|field| {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| format!("{field:?} is not field=N"))?;
            let n = value
                .trim()
                .parse()
                .map_err(|_| format!("{key}={value:?} is not a number"))?;
            Ok((key.trim().to_owned(), n))
        })
        .collect::<Result<_, String>>()?;
    Ok((name.to_owned(), fields))
}

/// `NAME:field=N,...` (see `--provider-limit`).
fn parse_provider_limit(text: &str) -> Result<(String, ProviderLimit), String> {
    let (name, fields) = parse_fields(text, "provider")?;
    let mut l = ProviderLimit::default();
    for (key, n) in fields {
        let small = || u32::try_from(n).map_err(|_| format!("{key} must be below 2^32"));
        match key.as_str() {
            "concurrent" => l.concurrent = Some(small()?),
            "per_second" => l.per_second = Some(small()?),
            "burst" => l.burst = small()?,
            "hold_ms" => l.hold_ms = n,
            other => {
                return Err(format!(
                    "unknown field {other:?}; known: concurrent, per_second, burst, hold_ms"
                ));
            }
        }
    }
    l.validate()
        .map_err(|e| format!("provider {name:?}: {e}"))?;
    Ok((name, l))
}

/// A bearer token as a secret store writes it: without the white space
/// around it (a Kubernetes secret made from a file ends with a newline),
/// and not empty.
fn parse_token(text: &str) -> Result<String, String> {
    let token = text.trim();
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    // (What the token holds is a secret: the error does not show it.)
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err("a token holds printable ASCII only, without spaces inside".into());
    }
    Ok(token.to_owned())
}

/// `KIND:field=N,...` (see `--kind-policy`).
fn parse_kind_policy(text: &str) -> Result<(String, KindPolicy), String> {
    let (kind, fields) = parse_fields(text, "kind")?;
    let mut p = KindPolicy::default();
    for (key, n) in fields {
        let ms = (n > 0).then_some(n);
        match key.as_str() {
            "attempts_max" => {
                let n = u32::try_from(n).ok().filter(|n| *n >= 1);
                p.attempts_max = Some(n.ok_or("attempts_max must be 1 to 2^32-1")?);
            }
            "backoff_base_ms" => p.backoff_base_ms = Some(n),
            "backoff_cap_ms" => p.backoff_cap_ms = Some(n),
            "attempt_timeout_ms" => p.attempt_timeout_ms = ms,
            "budget_ms" => p.budget_ms = ms,
            other => {
                return Err(format!(
                    "unknown field {other:?}; known: attempts_max, backoff_base_ms, \
                     backoff_cap_ms, attempt_timeout_ms, budget_ms"
                ));
            }
        }
    }
    Ok((kind, p))
}

impl Connection {
    pub(crate) fn mutant(&self) -> Result<Option<pelican_model::protocol::Mutant>> {
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

    /// The driver's defaults with this process's call timeout, mutant and
    /// kinds' policies.
    pub(crate) fn config(&self, attempts_max: u32, handlers: fn(&mut Registry)) -> Result<Config> {
        let mut config = Config::default();
        config.policy.attempts_max = attempts_max;
        config.policy.mutant = self.mutant()?;
        config.policy.kinds = self.kinds(handlers);
        config.policy.partitions = self.partitions;
        config.call_timeout_ms = self.call_timeout_ms;
        Ok(config)
    }

    /// The policies `handlers` registers kinds with, each field given by
    /// `--kind-policy` replacing the registered one.
    pub(crate) fn kinds(&self, handlers: fn(&mut Registry)) -> BTreeMap<String, KindPolicy> {
        let mut kinds = Registry::policies_of(handlers);
        for (kind, p) in &self.kind_policy {
            let k = kinds.entry(kind.clone()).or_default();
            *k = p.clone().over(k);
        }
        kinds
    }
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Run the whole system on this machine: Redis and Postgres from its
    /// own binaries (data in --data-dir, kept between runs), the schema,
    /// the API and the workers, their logs prefixed with their source.
    /// Ctrl-C stops everything. With --redis-url or --database-url (or
    /// their variables), uses that server instead of starting one.
    Dev(DevArgs),
    /// Create or update the schema in Postgres and the consumer group in Redis.
    Migrate,
    /// Benchmark a running deployment through its API: submit --runs runs
    /// of --kind in bulk, follow them to their ends, and report the
    /// submission and drain rates and the latency from submission to end.
    /// Runs unfinished at --timeout-s are cancelled.
    Bench(BenchArgs),
    /// Serve the HTTP API.
    Api(ApiArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Submit a run (as `POST /runs` does) and print its id, or every line
    /// of a file.
    Submit {
        /// The job kind.
        #[arg(required_unless_present = "from_file")]
        kind: Option<String>,
        /// The job input (JSON).
        #[arg(default_value = "{}")]
        input: String,
        /// Attempts allowed.
        #[arg(long, env = "PELICAN_ATTEMPTS_MAX", default_value_t = 5)]
        attempts_max: u32,
        /// An idempotency key: a submission under a key already used
        /// stores nothing and prints the key's run.
        #[arg(long)]
        key: Option<String>,
        /// Not to start before this long from now (by Postgres's clock),
        /// e.g. `90s`, `15m`, `2h 30m`: the run waits `delayed`.
        #[arg(long, value_name = "DURATION", value_parser = parse_delay)]
        delay: Option<u64>,
        /// Not to start before this time: RFC 3339 (`2026-12-24T18:00:00Z`)
        /// or ms since the Unix epoch. With --delay, the later of the two.
        #[arg(long, value_name = "TIME", value_parser = parse_at)]
        at: Option<u64>,
        /// Submit every line of FILE instead: one JSON object a line,
        /// `{"kind": K, "input": I, "key": KEY, "delay_ms": N,
        /// "run_at_ms": T}` (all but kind optional).
        /// A bad line fails alone; the rest are stored.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["kind", "key", "delay", "at"])]
        from_file: Option<std::path::PathBuf>,
        /// With --from-file: lines inserted, published and marked together.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        batch_max: u64,
    },
    /// Show one run, or the queue's state when no run is given.
    Status {
        /// A run id.
        run: Option<String>,
    },
    /// Follow a run's events as they happen (over the API's SSE stream,
    /// reconnecting when it drops), until it ends. Exits 0 when the run
    /// succeeded, 1 when it failed, was cancelled or is dead.
    Watch {
        /// A run id.
        run: String,
        /// The API's address.
        #[arg(long, env = "PELICAN_API_URL", default_value = "http://127.0.0.1:8080")]
        api_url: String,
        /// A bearer token of the API (the read-only one will do).
        #[arg(long, env = "PELICAN_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
        api_token: Option<String>,
    },
    /// Cancel a run.
    Cancel {
        /// A run id.
        run: String,
    },
    /// The dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// Cron schedules: each tick makes one run of the schedule's kind,
    /// however many workers run the scheduler.
    #[command(subcommand)]
    Schedule(ScheduleCmd),
    /// Protocol traces (`--trace-file` of `worker` and `api`).
    #[command(subcommand)]
    Trace(TraceCmd),
    /// Print the HTTP API's OpenAPI document (as `GET /openapi.json`
    /// serves it); needs no server.
    Openapi,
    /// Show the deployment's partition count, stored in Postgres by the
    /// first process to connect; every process must be started with it.
    Partitions {
        /// Grow the deployment to N partitions: their consumer groups are
        /// made, then the count is stored. Restart every API and worker
        /// with `--partitions N`. Fewer is refused: entries in a dropped
        /// partition would be read by no worker.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        set: Option<u16>,
    },
}

#[derive(Subcommand)]
pub(crate) enum TraceCmd {
    /// Replay traces through the protocol's state machines: each must
    /// conform, or the first event the model does not allow is shown.
    Check {
        /// Trace files (JSON lines).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
pub(crate) enum ScheduleCmd {
    /// Make a schedule, or replace what the schedule NAME runs and when
    /// (it keeps its history): planned afresh by the next scheduler pass.
    Put {
        /// Its name (a-z, 0-9, '_', '.', '-').
        name: String,
        /// The kind of its runs.
        kind: String,
        /// A cron expression: five fields (minute hour day month weekday),
        /// or six with seconds first; e.g. `0 9 * * 1-5`.
        cron: String,
        /// The input of its runs (JSON).
        #[arg(long, default_value = "{}")]
        input: String,
        /// The IANA time zone the expression is read in.
        #[arg(long, default_value = "UTC")]
        tz: String,
        /// While the previous run is live, a tick makes no run (`skip`),
        /// queues one beside it (`queue`), or cancels it (`cancel`).
        #[arg(long, default_value = "skip", value_parser = parse_overlap)]
        overlap: pelican_model::schedule::Overlap,
        /// Ticks missed while no scheduler ran make no run (`skip`), or
        /// one run for all (`one`).
        #[arg(long, default_value = "one", value_parser = parse_catchup)]
        catchup: pelican_model::schedule::Catchup,
    },
    /// List the schedules with their next ticks.
    List,
    /// Delete a schedule; its runs stay.
    Delete {
        /// Its name.
        name: String,
    },
}

fn parse_overlap(s: &str) -> Result<pelican_model::schedule::Overlap, String> {
    pelican_model::schedule::Overlap::parse(s)
}

fn parse_catchup(s: &str) -> Result<pelican_model::schedule::Catchup, String> {
    pelican_model::schedule::Catchup::parse(s)
}

#[derive(Subcommand)]
pub(crate) enum DlqCmd {
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
pub(crate) struct ApiArgs {
    /// Address to listen on.
    #[arg(long, env = "PELICAN_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,
    /// Bearer token every route but `/healthz` requires. Without it the
    /// API refuses to start, unless `--insecure-no-auth`. White space
    /// around it (a secret file's last newline) is not part of it.
    #[arg(long, env = "PELICAN_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub(crate) api_token: Option<String>,
    /// A second bearer token that only the `GET` routes (runs, metrics)
    /// accept: for dashboards and scrapers.
    #[arg(long, env = "PELICAN_API_READ_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub(crate) api_read_token: Option<String>,
    /// Serve every route to anyone who can reach the API, without a token
    /// (local experiments only).
    #[arg(long, env = "PELICAN_INSECURE_NO_AUTH", conflicts_with_all = ["api_token", "api_read_token"])]
    pub(crate) insecure_no_auth: bool,
    /// Largest request body accepted, in bytes. A larger one is read on
    /// (up to 64 MiB, for 5 s) and thrown away, then refused with 413.
    #[arg(long, env = "PELICAN_BODY_LIMIT_BYTES", default_value_t = 64 * 1024)]
    pub(crate) body_limit_bytes: usize,
    /// The most runs one `POST /runs` array may submit (its body is
    /// bounded by `--body-limit-bytes` too); they are inserted, published
    /// and marked together, and concurrent submissions share batches up
    /// to this size.
    #[arg(long, env = "PELICAN_BULK_MAX", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) bulk_max: u64,
    /// Attempts each submitted run allows.
    #[arg(long, env = "PELICAN_ATTEMPTS_MAX", default_value_t = 5)]
    pub(crate) attempts_max: u32,
    /// Write a protocol trace (JSON lines) of the submissions here, for
    /// `pelican trace check`.
    #[arg(long, env = "PELICAN_TRACE_FILE")]
    pub(crate) trace_file: Option<std::path::PathBuf>,
    /// How long an `Idempotency-Key` is kept: a retry within this window
    /// answers the key's run, whatever retention did with the run; after
    /// it, the key may start a new run (expired keys are deleted in
    /// batches).
    #[arg(
        long,
        env = "PELICAN_SUBMIT_KEYS_KEEP_MS",
        default_value_t = 86_400_000
    )]
    pub(crate) submit_keys_keep_ms: u64,
    /// On SIGTERM: stop accepting, end every events stream (its client
    /// resumes from `Last-Event-ID` at another API), give requests in
    /// flight this long to finish, and exit 0. Keep it below the pod's
    /// `terminationGracePeriodSeconds`.
    #[arg(long, env = "PELICAN_SHUTDOWN_GRACE_MS", default_value_t = 20_000)]
    pub(crate) shutdown_grace_ms: u64,
    /// Events streams (`GET /runs/{id}/events`) this process serves at
    /// once; past it, 503 with `Retry-After: 1`. One reader feeds them
    /// all. Raise the process's open-files limit to match.
    #[arg(long, env = "PELICAN_EVENTS_STREAMS_MAX", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) events_streams_max: u32,
    /// Connections served at once; the next is accepted when one closes.
    /// Give it room for the events streams (each holds one) and the
    /// clients that poll, and the open-files limit room for it.
    #[arg(long, env = "PELICAN_CONNECTIONS_MAX", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) connections_max: u32,
    /// How long a connection may take to send a request's head, from when
    /// the server is ready to read it: a client that trickles one, or
    /// idles between requests, is closed then.
    #[arg(long, env = "PELICAN_HEADER_READ_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) header_read_timeout_ms: u64,
}

#[derive(Args)]
pub(crate) struct DevArgs {
    /// Where Redis and Postgres keep their data.
    #[arg(long, env = "PELICAN_DEV_DIR", default_value = ".pelican/dev")]
    pub(crate) data_dir: std::path::PathBuf,
    /// Start empty: delete the data directory first.
    #[arg(long)]
    pub(crate) reset: bool,
    /// Address the API listens on.
    #[arg(long, env = "PELICAN_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,
    /// The API's bearer token (one is made when not given).
    #[arg(long, env = "PELICAN_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub(crate) api_token: Option<String>,
    /// Workers to run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) workers: u32,
    /// Whether --redis-url (or its variable) names a Redis to use.
    #[arg(skip)]
    pub(crate) existing_redis: bool,
    /// Whether --database-url (or its variable) names a Postgres to use.
    #[arg(skip)]
    pub(crate) existing_database: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Runs to submit.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) runs: u64,
    /// Their kind (its handler must exist on the workers; its input is `{}`).
    #[arg(long, default_value = "noop")]
    pub(crate) kind: String,
    /// Runs per bulk request: at most the API's --bulk-max, and within its
    /// --body-limit-bytes (500 fit its defaults).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) batch: u64,
    /// How long to wait for every run to end before cancelling the rest.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout_s: u64,
    /// The API's address.
    #[arg(long, env = "PELICAN_API_URL", default_value = "http://127.0.0.1:8080")]
    pub(crate) api_url: String,
    /// A bearer token of the API (a writer's).
    #[arg(long, env = "PELICAN_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub(crate) api_token: Option<String>,
}

#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// This worker's number; its consumer name is `w<id>`. Give each
    /// running worker its own (a StatefulSet ordinal, say). Without it the
    /// worker takes the next number from Postgres's worker registry (the
    /// `workers` table, with its host name and pid), unique among every
    /// worker ever registered. Do not mix the two on one group. A stopped
    /// worker's consumer is deleted once it is idle past
    /// `--reclaim-min-idle-ms` and holds nothing.
    #[arg(long, env = "PELICAN_WORKER_ID")]
    pub(crate) id: Option<u32>,
    /// Jobs run at once; the reader and the reclaimer share these slots.
    #[arg(long, env = "PELICAN_IN_FLIGHT_MAX", default_value_t = 16)]
    pub(crate) in_flight_max: usize,
    /// Claims (and completions, and reads) of up to this many deliveries go to
    /// Postgres as one statement, and their acknowledgements to Redis as
    /// one pipeline; 1 sends each on its own.
    #[arg(long, env = "PELICAN_BATCH_MAX", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) batch_max: u32,
    /// How long a claim or heartbeat keeps a job's ownership.
    #[arg(long, env = "PELICAN_LEASE_MS", default_value_t = 30_000)]
    pub(crate) lease_ms: u64,
    /// Heartbeat period: a lease renewal and an idle reset of the
    /// delivery. Must be below the lease.
    #[arg(long, env = "PELICAN_HEARTBEAT_MS", default_value_t = 10_000)]
    pub(crate) heartbeat_ms: u64,
    /// Deliveries idle this long are reclaimed (XPENDING IDLE, XAUTOCLAIM
    /// min-idle-time); and a consumer idle this long that holds nothing is
    /// deleted from the group, at the sweep's pace.
    #[arg(long, env = "PELICAN_RECLAIM_MIN_IDLE_MS", default_value_t = 60_000)]
    pub(crate) reclaim_min_idle_ms: u64,
    /// Reclaimer period.
    #[arg(long, env = "PELICAN_RECLAIM_EVERY_MS", default_value_t = 5_000)]
    pub(crate) reclaim_every_ms: u64,
    /// First retry back-off (exponential, equal jitter).
    #[arg(long, env = "PELICAN_BACKOFF_BASE_MS", default_value_t = 1_000)]
    pub(crate) backoff_base_ms: u64,
    /// Back-off cap.
    #[arg(long, env = "PELICAN_BACKOFF_CAP_MS", default_value_t = 60_000)]
    pub(crate) backoff_cap_ms: u64,
    /// Retries a run gets after errors of class `unknown`
    /// (`JobError::unknown`); the next one fails the run.
    #[arg(long, env = "PELICAN_UNKNOWN_RETRIES_MAX", default_value_t = 1)]
    pub(crate) unknown_retries_max: u32,
    /// A schedule's tick its scheduler reaches more than this late was
    /// missed (no scheduler ran): its schedule's catch-up policy (`skip`
    /// or `one`) decides whether it makes a run.
    #[arg(long, env = "PELICAN_CATCHUP_AFTER_MS", default_value_t = 60_000)]
    pub(crate) catchup_after_ms: u64,
    /// A provider's limits, shared by every worker (over what the handlers
    /// registered): `NAME:field=N,...` with fields concurrent (calls at
    /// once), per_second, burst (default 1), hold_ms (a dead worker's slot
    /// is free after this; default 60000). Repeat the flag per provider;
    /// in the variable, separate providers with `;`. The limits live in
    /// Postgres (`provider_slots`, `provider_rates`, by its clock).
    #[arg(
        long,
        env = "PELICAN_PROVIDER_LIMIT",
        value_delimiter = ';',
        value_parser = parse_provider_limit
    )]
    pub(crate) provider_limit: Vec<(String, ProviderLimit)>,
    /// The longest result or error message an attempt may store, in bytes;
    /// a longer one fails its run with class `unstorable`.
    #[arg(long, env = "PELICAN_VALUE_BYTES_MAX", default_value_t = 4 << 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) value_bytes_max: u64,
    /// How long a published run may wait, or a lease stay expired, before
    /// the sweeper checks its stream entry. The sweeper runs on the
    /// maintenance pass closest to every quarter of this, and reads the
    /// live runs published before its cutoff, oldest first, a batch at a
    /// time from a cursor (runs queued within the grace cost it nothing).
    #[arg(long, env = "PELICAN_SWEEP_GRACE_MS", default_value_t = 120_000)]
    pub(crate) sweep_grace_ms: u64,
    /// Maintenance period: retries due, the outbox, the sweeper and the
    /// consumers' housekeeping when due, retention. A task that finds a
    /// full batch goes on at once, for up to this long a round; one still
    /// behind then is due again at once (`pelican_maintenance_behind`).
    #[arg(long, env = "PELICAN_MAINTENANCE_EVERY_MS", default_value_t = 1_000)]
    pub(crate) maintenance_every_ms: u64,
    /// Between maintenance rounds, the scheduler's pass and the retry pass
    /// run this often: the longest a schedule's due tick waits for its
    /// run, and a due retry or delayed run to be queued. Each pass is one
    /// indexed read or statement; at or above --maintenance-every-ms, only
    /// the rounds run them.
    #[arg(long, env = "PELICAN_PROMOTE_EVERY_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) promote_every_ms: u64,
    /// Rows one maintenance pass takes at most: retries promoted, runs
    /// published by the outbox, runs checked by the sweeper, runs deleted.
    /// A batch's publications go to Redis as one pipeline, its marks,
    /// re-dispatches and deletes to Postgres as one statement each.
    #[arg(long, env = "PELICAN_MAINTENANCE_BATCH_MAX", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) maintenance_batch_max: u32,
    /// How long an empty XREADGROUP blocks; must be below the call
    /// timeout.
    #[arg(long, env = "PELICAN_READ_BLOCK_MS", default_value_t = 1_000)]
    pub(crate) read_block_ms: u64,
    /// On SIGTERM: stop reading, give in-flight jobs this long to finish,
    /// leave the rest pending, exit 0.
    #[arg(long, env = "PELICAN_SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    pub(crate) shutdown_grace_ms: u64,
    /// A job running longer fails retryably.
    #[arg(long, env = "PELICAN_JOB_TIMEOUT_MS", default_value_t = 3_600_000)]
    pub(crate) job_timeout_ms: u64,
    /// Stream retention: delivered, acknowledged entries older than this
    /// are trimmed by each maintenance round (XTRIM MINID below the oldest
    /// pending and the first undelivered entry); 0 keeps every entry.
    #[arg(long, env = "PELICAN_RETENTION_MS", default_value_t = 86_400_000)]
    pub(crate) retention_ms: u64,
    /// Postgres retention: runs finished longer ago than this are deleted
    /// in batches every maintenance round, with their attempts, dead
    /// letters, events and steps, but not their idempotency keys (a key
    /// answers its run for its whole window); a later delivery of theirs
    /// is acked as stale. 0 keeps every run.
    #[arg(long, env = "PELICAN_KEEP_FINISHED_MS", default_value_t = 7 * 86_400_000)]
    pub(crate) keep_finished_ms: u64,
    /// Shift this worker's clock by this many ms (may be negative), to test
    /// skewed clocks: leases are judged by Postgres's clock alone.
    #[arg(long, hide = true, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) clock_offset_ms: i64,
    /// Leave maintenance (retries, outbox, sweeper, retention, consumers)
    /// to other workers.
    #[arg(long, env = "PELICAN_NO_MAINTENANCE")]
    pub(crate) no_maintenance: bool,
    /// Serve this worker's `/metrics` (Prometheus), `/healthz` (the
    /// process serves) and `/readyz` (200 while its reads and statements
    /// are answered and it is not stopping; else 503 with the parts as
    /// JSON) here.
    #[arg(long, env = "PELICAN_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Write a protocol trace (JSON lines) here; `pelican trace check`
    /// replays it through the protocol.
    #[arg(long, env = "PELICAN_TRACE_FILE")]
    pub(crate) trace_file: Option<std::path::PathBuf>,
}

/// `--delay`: a duration as humantime reads it (`90s`, `2h 30m`), in ms.
fn parse_delay(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (try 90s, 15m, 2h 30m)"))?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    crate::live::api::delay_of(Some(ms), None)?;
    Ok(ms)
}

/// `--at`: an RFC 3339 time, or ms since the Unix epoch.
fn parse_at(s: &str) -> Result<u64, String> {
    let ms = match s.parse::<u64>() {
        Ok(ms) => ms,
        Err(_) => {
            let t = humantime::parse_rfc3339_weak(s)
                .map_err(|e| format!("{e} (try 2026-12-24T18:00:00Z, or ms since the epoch)"))?;
            let since = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| "a time before 1970".to_owned())?;
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        }
    };
    crate::live::api::delay_of(None, Some(ms))?;
    Ok(ms)
}
