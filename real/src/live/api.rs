//! `pelican api`: the HTTP API (axum).
//!
//! | route | does |
//! |---|---|
//! | `POST /runs` | validates `{"kind": .., "input": ..}`, writes the run durably, publishes it, answers 202 with its id (a failed publish still leaves a run the outbox publishes); with an `Idempotency-Key`, a key already used answers its run (200) or 422 for another request |
//! | `GET /runs?status=&kind=&cursor=&limit=` | runs by id, filtered, a page at a time (keyset: `next_cursor` starts the next page) |
//! | `GET /dead-letters?cursor=&limit=` | dead letters by run, a page at a time |
//! | `POST /dead-letters/{id}/requeue` | runs a dead run again with `{"extra_attempts": N}` more (default 1); 409 if it is not dead |
//! | `GET /runs/{id}` | the run: status, attempts with fences and outcomes, result or error |
//! | `GET /runs/{id}/events` | the run's events over SSE (S13): resumes after `Last-Event-ID` (or `?after=N`), ends after a terminal event; 204 when the run has ended and every event was seen |
//! | `POST /runs/{id}/cancel` | cancels it (S7); 409 if it already ended |
//! | `GET /queue` | the queue's health: stream length, lag, pending deliveries, the oldest one's idle time, pending per consumer, live runs by status |
//! | `GET /healthz` | 200 when Postgres and Redis answer, else 503 |
//! | `GET /metrics` | Prometheus text (see the README's metrics reference) |
//!
//! Every route but `/healthz` takes `Authorization: Bearer <token>`: the
//! token for every route, or the read-only token for the `GET` routes.
//! `pelican api` serves without a token only when told to
//! (`--insecure-no-auth`). Every error is a 4xx/5xx with a JSON body
//! `{"error": ".."}`.

use super::metrics;
use super::pg::PgDb;
use super::redis::RedisStream;
use crate::driver::{Batching, Io, NewRun as Submission, cancel, new_run_ids, submit, submit_many};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use pelican_model::events::{EventKind, RunEvent};
use pelican_model::ids::RunId;
use pelican_model::protocol::{DbOp, DbReply, QueueState, StreamOp, StreamReply, SubmitterEnd};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// The API's dependencies.
pub struct ApiState {
    /// The driver's clients (the API runs submissions and cancels).
    /// Submissions go through batching clients: concurrent ones, and the
    /// runs of one bulk submission, share statements and pipelines.
    pub io: Io<Batching<RedisStream>, Batching<PgDb>, Option<crate::trace::TraceProbe>>,
    /// The most runs one `POST /runs` may submit (an array's length).
    pub bulk_max: usize,
    /// The bearer token every route but `/healthz` requires (`None`: the
    /// operator chose to serve without auth).
    pub token: Option<String>,
    /// A second token that the `GET` routes also accept.
    pub read_token: Option<String>,
    /// The metrics recorder's handle.
    pub metrics: PrometheusHandle,
}

/// An API error: a status and a message, answered as JSON.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

fn unavailable(what: &str) -> ApiError {
    ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{what} is unavailable; retry later"),
    )
}

/// The router, with a body limit of `body_limit_bytes`.
pub fn router(state: Arc<ApiState>, body_limit_bytes: usize) -> Router {
    Router::new()
        .route("/runs", post(create_run).get(list_runs))
        .route("/dead-letters", get(list_dead_letters))
        .route("/dead-letters/{id}/requeue", post(requeue_dead_letter))
        .route("/runs/{id}", get(get_run))
        .route("/runs/{id}/events", get(run_events))
        .route("/runs/{id}/cancel", post(cancel_run))
        .route("/queue", get(queue))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        .with_state(state)
}

/// What a route lets its caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// Read runs and metrics: the token or the read-only token.
    Read,
    /// Change state: the token.
    Write,
}

fn authorize(state: &ApiState, headers: &HeaderMap, need: Need) -> Result<(), ApiError> {
    let Some(token) = &state.token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let matches = |t: &String, g: &str| constant_time_eq(g.as_bytes(), t.as_bytes());
    match given {
        Some(g) if matches(token, g) => Ok(()),
        Some(g)
            if need == Need::Read && state.read_token.as_ref().is_some_and(|t| matches(t, g)) =>
        {
            Ok(())
        }
        Some(g) if state.read_token.as_ref().is_some_and(|t| matches(t, g)) => Err(ApiError(
            StatusCode::FORBIDDEN,
            "the read-only token cannot change runs".into(),
        )),
        Some(_) => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "wrong bearer token".into(),
        )),
        None => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`".into(),
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An item of a `POST /runs` array.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkRun {
    kind: String,
    #[serde(default = "empty_object")]
    input: Value,
    key: Option<String>,
}

/// `POST /runs` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRun {
    /// The job kind (`[a-z0-9_.-]`, 1–64 characters).
    pub kind: String,
    /// The job input, any JSON (default `{}`).
    #[serde(default = "empty_object")]
    pub input: Value,
}

fn empty_object() -> Value {
    json!({})
}

/// Checks a job kind's spelling.
///
/// # Errors
/// What is wrong with it.
pub fn validate_kind(kind: &str) -> Result<(), String> {
    if kind.is_empty() || kind.len() > 64 {
        return Err("kind must have 1 to 64 characters".into());
    }
    if !kind
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
    {
        return Err(format!(
            "kind {kind:?} may only hold a-z, 0-9, '_', '.', '-'"
        ));
    }
    Ok(())
}

/// The header that carries a client's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Checks an idempotency key's spelling: 1 to 255 visible ASCII characters.
///
/// # Errors
/// What is wrong with it.
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{IDEMPOTENCY_KEY} must be 1 to 255 visible ASCII characters, got {key:?}"
        ));
    }
    Ok(())
}

async fn create_run(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers, Need::Write)?;
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => {
            let k = v
                .to_str()
                .map_err(|_| bad(format!("{IDEMPOTENCY_KEY} is not ASCII")))?;
            validate_key(k).map_err(bad)?;
            Some(k.to_owned())
        }
    };
    let Json(body) = body.map_err(|e| ApiError(e.status(), e.body_text()))?;
    if let Value::Array(items) = body {
        if key.is_some() {
            return Err(bad(format!(
                "{IDEMPOTENCY_KEY} names one run: give each item of an array its own \"key\""
            )));
        }
        return create_runs(&state, items).await;
    }
    let new: NewRun = serde_json::from_value(body).map_err(|e| {
        ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        )
    })?;
    validate_kind(&new.kind).map_err(bad)?;
    let input = serde_json::to_string(&new.input).expect("a JSON value serializes");
    let Ok(DbReply::NewRun(run)) = state.io.db.inner().execute(&DbOp::NextRunId).await else {
        // Nothing was sent that could store a run.
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "Postgres is unavailable; nothing was stored; retry later".into(),
        ));
    };
    Ok(
        match submit(&state.io, run, &new.kind, &input, key.as_deref()).await {
            SubmitterEnd::Accepted { published } => {
                tracing::info!(%run, kind = %new.kind, published, "run accepted");
                let body = json!({ "run_id": run.0, "status": "queued", "published": published });
                (StatusCode::ACCEPTED, Json(body)).into_response()
            }
            SubmitterEnd::Existing(first) => {
                let status = match state
                    .io
                    .db
                    .inner()
                    .execute(&DbOp::ReadRun { run: first })
                    .await
                {
                    Ok(DbReply::Run(Some(r))) => json!(r.status.as_str()),
                    _ => Value::Null,
                };
                let body = json!({ "run_id": first.0, "status": status, "existing": true });
                (StatusCode::OK, Json(body)).into_response()
            }
            SubmitterEnd::KeyConflict(first) => {
                return Err(ApiError(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!(
                        "{IDEMPOTENCY_KEY} {:?} was first used for run {} with another request",
                        key.unwrap_or_default(),
                        first.0
                    ),
                ));
            }
            SubmitterEnd::Unavailable => {
                let advice = if key.is_some() {
                    "retry with the same Idempotency-Key: it answers the run if it was stored"
                } else {
                    "a retry may store a second run; send an Idempotency-Key to retry safely"
                };
                let body = json!({
                    "error": format!("Postgres did not answer in time: the run may or may not be stored; {advice}"),
                    "outcome": "unknown",
                });
                (StatusCode::GATEWAY_TIMEOUT, Json(body)).into_response()
            }
            SubmitterEnd::Refused => {
                return Err(ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Postgres refused the run's values (text holding a NUL byte); nothing was stored"
                    .into(),
            ));
            }
        },
    )
}

/// `POST /runs` with an array: each item a run (`{"kind", "input", "key"}`),
/// all submitted together ([`submit_many`]: one statement for their ids,
/// one for their inserts, a pipeline of XADDs, one statement for the
/// marks). Each item gets its own answer, with the status code a lone
/// submission of it would have had; a bad item fails alone.
async fn create_runs(state: &ApiState, items: Vec<Value>) -> Result<Response, ApiError> {
    if items.is_empty() {
        return Err(bad("an empty array submits nothing"));
    }
    if items.len() > state.bulk_max {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} runs in one request; at most {} (--bulk-max)",
                items.len(),
                state.bulk_max
            ),
        ));
    }
    let mut answers = vec![Value::Null; items.len()];
    let (mut runs, mut at) = (Vec::new(), Vec::new());
    for (i, item) in items.into_iter().enumerate() {
        match bulk_item(item) {
            Ok(run) => {
                runs.push(run);
                at.push(i);
            }
            Err((code, error)) => answers[i] = json!({ "code": code.as_u16(), "error": error }),
        }
    }
    let ids = if runs.is_empty() {
        Vec::new()
    } else {
        new_run_ids(&state.io, runs.len()).await.map_err(|_| {
            ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                "Postgres is unavailable; nothing was stored; retry later".into(),
            )
        })?
    };
    let runs: Vec<(RunId, Submission)> = ids.into_iter().zip(runs).collect();
    let ends = submit_many(&state.io, &runs).await;
    let accepted = ends
        .iter()
        .filter(|e| matches!(e, SubmitterEnd::Accepted { .. }))
        .count();
    for ((i, end), (run, submitted)) in at.into_iter().zip(ends).zip(&runs) {
        answers[i] = match end {
            SubmitterEnd::Accepted { published } => json!({
                "code": 202, "run_id": run.0, "status": "queued", "published": published,
            }),
            SubmitterEnd::Existing(first) => {
                json!({ "code": 200, "run_id": first.0, "existing": true })
            }
            SubmitterEnd::KeyConflict(first) => json!({
                "code": 422,
                "error": format!(
                    "key {:?} was first used for run {} with another request",
                    submitted.key.as_deref().unwrap_or_default(),
                    first.0
                ),
            }),
            SubmitterEnd::Unavailable => json!({
                "code": 504,
                "outcome": "unknown",
                "error": "Postgres did not answer in time: the run may or may not be stored; \
                          an item with a key is safe to submit again",
            }),
            SubmitterEnd::Refused => json!({
                "code": 422,
                "error": "Postgres refused the run's values (text holding a NUL byte); nothing was stored",
            }),
        };
    }
    tracing::info!(runs = answers.len(), accepted, "bulk submission");
    Ok((StatusCode::OK, Json(json!({ "runs": answers }))).into_response())
}

/// An array item as a run to submit, or the status and reason it is not.
fn bulk_item(item: Value) -> Result<Submission, (StatusCode, String)> {
    let run: BulkRun = serde_json::from_value(item)
        .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
    validate_kind(&run.kind).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    if let Some(k) = &run.key {
        validate_key(k).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    }
    Ok(Submission {
        kind: run.kind,
        input: serde_json::to_string(&run.input).expect("a JSON value serializes"),
        key: run.key,
    })
}

/// Forgets idempotency keys older than `keep`, in batches, every
/// `keep / 24` (at most once a minute); runs until the process ends.
pub async fn expire_keys(io: Arc<ApiState>, keep: std::time::Duration) {
    const BATCH: usize = 1_000;
    let every = (keep / 24).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(60),
    );
    loop {
        tokio::time::sleep(every).await;
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        loop {
            match io
                .io
                .db
                .inner()
                .execute(&DbOp::ExpireKeys {
                    keep_ms,
                    limit: BATCH,
                })
                .await
            {
                Ok(DbReply::Rows(n)) if n as usize == BATCH => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "expiring idempotency keys failed");
                    break;
                }
            }
        }
    }
}

fn parse_run(id: &str) -> Result<RunId, ApiError> {
    let digits = id.strip_prefix("run-").unwrap_or(id);
    digits.parse::<u64>().map(RunId).map_err(|_| {
        bad(format!(
            "{id:?} is not a run id (a number, or run-<number>)"
        ))
    })
}

/// The JSON view of a run, for `GET /runs/{id}` and `pelican status`.
///
/// # Errors
/// 404 for an unknown run, 503 when Postgres does not answer.
pub async fn run_view(db: &PgDb, run: RunId) -> Result<Value, ApiError> {
    let row = match db.execute(&DbOp::ReadRun { run }).await {
        Ok(DbReply::Run(Some(r))) => r,
        Ok(DbReply::Run(None)) => {
            return Err(ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0)));
        }
        _ => return Err(unavailable("Postgres")),
    };
    let Ok(DbReply::Attempts(attempts)) = db.execute(&DbOp::ReadAttempts { run }).await else {
        return Err(unavailable("Postgres"));
    };
    let as_json = |s: &str| serde_json::from_str::<Value>(s).unwrap_or_else(|_| json!(s));
    Ok(json!({
        "run_id": row.run_id.0,
        "kind": row.kind,
        "input": as_json(&row.input),
        "status": row.status.as_str(),
        "dispatch": row.dispatch.0,
        "attempts_max": row.attempts_max,
        "lease_until_ms": row.lease_until.map(|t| t.0),
        "retry_at_ms": row.retry_at.map(|t| t.0),
        "entry_id": row.entry_id.map(|e| e.to_string()),
        "result": row.result.as_deref().map(as_json),
        "error": row.error.map(|(class, message)| json!({ "class": class.as_str(), "message": message })),
        "attempts": attempts.iter().map(|(n, a)| json!({
            "attempt": n.0,
            "fence": a.fence.0,
            "worker": a.worker,
            "entry_id": a.entry_id.to_string(),
            "outcome": a.outcome.map(pelican_model::status::AttemptOutcome::as_str),
        })).collect::<Vec<_>>(),
    }))
}

async fn get_run(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let run = parse_run(&id)?;
    Ok(Json(run_view(state.io.db.inner(), run).await?))
}

async fn cancel_run(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Write)?;
    let run = parse_run(&id)?;
    match cancel(&state.io, run).await {
        Ok(true) => Ok(Json(json!({ "run_id": run.0, "status": "cancelled" }))),
        Ok(false) => Err(refused(state.io.db.inner(), run, |status| {
            format!("run {} already ended: {status}", run.0)
        })
        .await),
        Err(_) => Err(unavailable("Postgres")),
    }
}

async fn healthz(State(state): State<Arc<ApiState>>) -> Response {
    let pg = matches!(
        state.io.db.inner().execute(&DbOp::Ping).await,
        Ok(DbReply::Rows(1))
    );
    let mut conn = state.io.stream.inner().connection();
    let redis = redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok();
    let status = if pg && redis {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    (
        status,
        Json(json!({ "postgres": word(pg), "redis": word(redis) })),
    )
        .into_response()
}

async fn metrics_text(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers, Need::Read) {
        return e.into_response();
    }
    metrics::observe_queue(state.io.stream.inner(), state.io.db.inner()).await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// The JSON of the queue's health, for `GET /queue` and `pelican status`:
/// the stream's side (one [`StreamOp::Queue`]) and, when given, the live
/// runs by status.
#[must_use]
pub fn queue_view(names: &super::StreamNames, q: &QueueState) -> Value {
    let group = q.group.as_ref();
    json!({
        "stream": names.jobs,
        "group": names.group,
        "group_exists": group.is_some(),
        "length": q.length,
        "dead_letters": q.dead_letters,
        "lag": group.and_then(|g| g.lag),
        "pending": group.map_or(0, |g| g.pending),
        "oldest_pending": group.and_then(|g| g.oldest_pending).map(|e| e.to_string()),
        "oldest_idle_ms": group.and_then(|g| g.oldest_idle_ms),
        "consumers": group.map_or(&[][..], |g| &g.consumers[..]).iter().map(|(name, pending)| {
            json!({ "name": name, "pending": pending })
        }).collect::<Vec<_>>(),
    })
}

/// `GET /queue`.
async fn queue(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let stream = state.io.stream.inner();
    let op = StreamOp::Queue {
        now: pelican_model::time::Timestamp::ZERO,
    };
    let q = match stream.execute(op).await {
        Ok(Ok(StreamReply::Queue(q))) => q,
        _ => return Err(unavailable("Redis")),
    };
    let Ok(DbReply::Counts(counts)) = state.io.db.inner().execute(&DbOp::CountLive).await else {
        return Err(unavailable("Postgres"));
    };
    let mut view = queue_view(stream.names(), &q);
    view["runs"] = pelican_model::status::RunStatus::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .map(|s| {
            let n = counts.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n);
            (s.as_str().to_owned(), json!(n))
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    Ok(Json(view))
}

/// How often an events stream reads the run's new events.
const EVENTS_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The most events one read of an events stream takes.
const EVENTS_READ_MAX: usize = 256;

/// The JSON of one event, as an SSE event's data and in `pelican watch`.
#[must_use]
pub fn event_view(e: &RunEvent) -> Value {
    let mut v = json!({
        "seq": e.seq,
        "kind": e.kind.as_str(),
        "attempt": e.attempt.0,
        "fence": e.fence.0,
    });
    match e.kind {
        EventKind::Claimed => v["worker"] = json!(e.data),
        EventKind::Progress => {
            v["progress"] = serde_json::from_str(&e.data).unwrap_or_else(|_| json!(e.data));
        }
        _ if e.class.is_some() => {
            v["class"] = json!(e.class.map(pelican_model::status::ErrorClass::as_str));
            v["message"] = json!(e.data);
        }
        _ => {}
    }
    v
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<u32>,
}

/// `GET /runs/{id}/events`: the run's events after `Last-Event-ID` (or
/// `?after=N`; 0: from the first), one SSE event each (`id`: its number,
/// `event`: its kind, `data`: [`event_view`]), as they are written. The
/// stream ends after a terminal event; a client that comes back after it
/// gets 204 (EventSource then stops reconnecting). While Postgres does not
/// answer, the stream waits and keeps the connection alive.
async fn run_events(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let run = parse_run(&id)?;
    let axum::extract::Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let last_seen = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .ok_or_else(|| bad("Last-Event-ID is not an event number"))?,
        ),
        None => None,
    };
    let after = last_seen.or(query.after).unwrap_or(0);
    let db = state.io.db.inner().clone();
    let row = match db.execute(&DbOp::ReadRun { run }).await {
        Ok(DbReply::Run(Some(r))) => r,
        Ok(DbReply::Run(None)) => {
            return Err(ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0)));
        }
        _ => return Err(unavailable("Postgres")),
    };
    if after > row.events {
        return Err(bad(format!(
            "run {} has {} events; there is no event {after}",
            run.0, row.events
        )));
    }
    if after == row.events && row.status.is_terminal() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // (the next event number to send, whether the stream has ended)
    let events = futures_util::stream::unfold((after, false), move |(after, ended)| {
        let db = db.clone();
        async move {
            if ended {
                return None;
            }
            loop {
                match db
                    .execute(&DbOp::ReadEvents {
                        run,
                        after,
                        limit: EVENTS_READ_MAX,
                    })
                    .await
                {
                    Ok(DbReply::Events(batch)) if !batch.is_empty() => {
                        let last = batch.last().expect("not empty");
                        let next = (
                            last.seq,
                            last.kind.is_terminal() && batch.len() < EVENTS_READ_MAX,
                        );
                        let sent: Vec<Result<Event, std::convert::Infallible>> = batch
                            .iter()
                            .map(|e| {
                                Ok(Event::default()
                                    .id(e.seq.to_string())
                                    .event(e.kind.as_str())
                                    .data(event_view(e).to_string()))
                            })
                            .collect();
                        return Some((futures_util::stream::iter(sent), next));
                    }
                    Ok(DbReply::Events(_)) => {}
                    other => {
                        tracing::warn!(run = run.0, answer = ?other.err(), "reading events failed");
                    }
                }
                tokio::time::sleep(EVENTS_POLL).await;
            }
        }
    });
    let events = futures_util::StreamExt::flatten(events);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The most runs or dead letters one page may hold, and how many it holds
/// by default.
const PAGE_MAX: usize = 1_000;
const PAGE_DEFAULT: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    status: Option<String>,
    kind: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
}

impl Page {
    /// The run after which the page starts, and its size.
    fn bounds(&self) -> Result<(RunId, usize), ApiError> {
        let after = match self.cursor.as_deref() {
            None | Some("") => RunId(0),
            Some(c) => parse_run(c)?,
        };
        let limit = self.limit.unwrap_or(PAGE_DEFAULT);
        if limit == 0 || limit > PAGE_MAX {
            return Err(bad(format!("limit must be 1 to {PAGE_MAX}, got {limit}")));
        }
        Ok((after, limit))
    }
}

/// The query of a page, or a 400 that says what is wrong with it.
fn page(
    query: Result<axum::extract::Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Page, ApiError> {
    query.map(|q| q.0).map_err(|e| bad(e.body_text()))
}

/// The cursor of the page after one that ended at `last` and held `n` of
/// at most `limit` (none: this was the last page).
fn next_cursor(last: Option<RunId>, n: usize, limit: usize) -> Value {
    match last {
        Some(run) if n == limit => json!(run.0.to_string()),
        _ => Value::Null,
    }
}

/// `GET /runs`: runs by id, of one status and one kind if asked.
async fn list_runs(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let q = page(query)?;
    let (after, limit) = q.bounds()?;
    let status = q.status.unwrap_or_default();
    if !status.is_empty() && pelican_model::status::RunStatus::parse(&status).is_none() {
        let known: Vec<&str> = pelican_model::status::RunStatus::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        return Err(bad(format!(
            "no status {status:?}; known: {}",
            known.join(", ")
        )));
    }
    let kind = q.kind.unwrap_or_default();
    if !kind.is_empty() {
        validate_kind(&kind).map_err(bad)?;
    }
    let op = DbOp::ListRuns {
        status,
        kind,
        after,
        limit,
    };
    let Ok(DbReply::Runs(rows)) = state.io.db.inner().execute(&op).await else {
        return Err(unavailable("Postgres"));
    };
    let next = next_cursor(rows.last().map(|r| r.run_id), rows.len(), limit);
    let runs: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "run_id": r.run_id.0,
                "kind": r.kind,
                "status": r.status.as_str(),
                "attempts": r.attempts,
                "attempts_max": r.attempts_max,
                "events": r.events,
                "finished_at_ms": r.finished_at.map(|t| t.0),
                "error": r.error.as_ref().map(|(class, message)| json!({ "class": class.as_str(), "message": message })),
            })
        })
        .collect();
    Ok(Json(json!({ "runs": runs, "next_cursor": next })))
}

/// The JSON of a dead letter, for `GET /dead-letters` and `pelican dlq list`.
#[must_use]
pub fn dead_letter_view(run: RunId, d: &pelican_model::db::DeadLetter) -> Value {
    json!({
        "run_id": run.0,
        "class": d.class.as_str(),
        "message": d.message,
        "source_entry": d.source_entry.map(|e| e.to_string()),
        "requeued": d.requeued,
        "attempts": d.attempts.iter().map(|(n, f, o)| json!({
            "attempt": n.0,
            "fence": f.0,
            "outcome": o.map(pelican_model::status::AttemptOutcome::as_str),
        })).collect::<Vec<_>>(),
    })
}

/// Why a write to `run` that changed no row was refused: 409 with
/// `conflict`'s message for the run's status, 404 for an unknown run, 503
/// when Postgres does not answer.
async fn refused(
    db: &PgDb,
    run: RunId,
    conflict: impl FnOnce(pelican_model::status::RunStatus) -> String,
) -> ApiError {
    match db.execute(&DbOp::ReadRun { run }).await {
        Ok(DbReply::Run(Some(r))) => ApiError(StatusCode::CONFLICT, conflict(r.status)),
        Ok(DbReply::Run(None)) => ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0)),
        _ => unavailable("Postgres"),
    }
}

/// `GET /dead-letters`: dead letters by run.
async fn list_dead_letters(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let q = page(query)?;
    if q.status.is_some() || q.kind.is_some() {
        return Err(bad("dead letters take only cursor and limit"));
    }
    let (after, limit) = q.bounds()?;
    let op = DbOp::ListDeadLetters { after, limit };
    let Ok(DbReply::DeadLetters(rows)) = state.io.db.inner().execute(&op).await else {
        return Err(unavailable("Postgres"));
    };
    let next = next_cursor(rows.last().map(|(r, _)| *r), rows.len(), limit);
    let letters: Vec<Value> = rows
        .iter()
        .map(|(run, d)| dead_letter_view(*run, d))
        .collect();
    Ok(Json(
        json!({ "dead_letters": letters, "next_cursor": next }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Requeue {
    #[serde(default = "one")]
    extra_attempts: u32,
}

fn one() -> u32 {
    1
}

/// `POST /dead-letters/{id}/requeue`: an operator's re-run of a dead run.
async fn requeue_dead_letter(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers, Need::Write)?;
    let run = parse_run(&id)?;
    let Requeue { extra_attempts } = if body.iter().all(u8::is_ascii_whitespace) {
        Requeue { extra_attempts: 1 }
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("bad requeue body: {e}"),
            )
        })?
    };
    if extra_attempts == 0 || extra_attempts > 100 {
        return Err(bad(format!(
            "extra_attempts must be 1 to 100, got {extra_attempts}"
        )));
    }
    let db = state.io.db.inner();
    match db
        .execute(&DbOp::DlqRequeue {
            run,
            extra_attempts,
        })
        .await
    {
        Ok(DbReply::Rows(1)) => {
            tracing::info!(%run, extra_attempts, "dead run requeued");
            Ok(Json(
                json!({ "run_id": run.0, "status": "queued", "extra_attempts": extra_attempts }),
            ))
        }
        Ok(_) => Err(refused(db, run, |status| {
            format!("run {} is {status}, not dead awaiting a requeue", run.0)
        })
        .await),
        Err(_) => Err(unavailable("Postgres")),
    }
}
