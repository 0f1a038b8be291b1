// Over 600 lines: handlers, auth, views and static files; split along those seams in issue 53.
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
//! | `GET /`, `/ui/app.js`, `/ui/style.css` | the dashboard: a static page (no build step) of the routes above, which asks for the token |
//! | `GET /openapi.json` | the OpenAPI document, made from the handlers' annotations and the bodies' types ([`pelican_client::wire`]) |
//!
//! Every route but `/healthz`, `/openapi.json` and the dashboard's takes `Authorization: Bearer <token>`: the
//! token for every route, or the read-only token for the `GET` routes.
//! `pelican api` serves without a token only when told to
//! (`--insecure-no-auth`). Every error is a 4xx/5xx with a JSON body
//! `{"error": ".."}`.

use super::metrics;
use super::pg::PgDb;
use super::redis::RedisStream;
use crate::driver::{
    Batching, Io, NewRun as Submission, Requeued, cancel, new_run_ids, requeue_dead, submit,
    submit_many,
};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use pelican_client::wire;
use pelican_model::events::{EventKind, RunEvent};
use pelican_model::ids::RunId;
use pelican_model::protocol::{DbOp, DbReply, QueueState, StreamOp, StreamReply, SubmitterEnd};
use pelican_model::status::{ErrorClass, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
    /// Turns true when the process is asked to stop: every events stream
    /// ends (its client resumes elsewhere with `Last-Event-ID`).
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The one reader every events stream of this process is fed by.
    pub watchers: Arc<super::watchers::Watchers>,
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

/// The API's OpenAPI document: its routes and bodies are added by
/// [`router`], from the handlers' own annotations.
#[derive(OpenApi)]
#[openapi(
    info(title = "Pelican", description = "Durable jobs on Redis Streams and PostgreSQL."),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// Every route but `/healthz` and `/openapi.json` takes a bearer token.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let scheme =
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", scheme);
    }
}

/// The routes with their OpenAPI document: one list, so every route is
/// documented and every documented route is served.
fn documented() -> (Router<Arc<ApiState>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_run, list_runs))
        .routes(routes!(list_dead_letters))
        .routes(routes!(requeue_dead_letter))
        .routes(routes!(get_run))
        .routes(routes!(run_events))
        .routes(routes!(cancel_run))
        .routes(routes!(queue))
        .routes(routes!(healthz))
        .routes(routes!(metrics_text))
        .routes(routes!(openapi_json))
        .routes(routes!(dashboard))
        .routes(routes!(dashboard_js))
        .routes(routes!(dashboard_css))
        .split_for_parts()
}

/// The API's OpenAPI document, as `GET /openapi.json` serves it.
#[must_use]
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented().1
}

/// The router, with a body limit of `body_limit_bytes`.
pub fn router(state: Arc<ApiState>, body_limit_bytes: usize) -> Router {
    let (routes, doc) = documented();
    let doc: Arc<str> = doc
        .to_json()
        .expect("the OpenAPI document serializes")
        .into();
    routes
        .layer(axum::Extension(OpenApiJson(doc)))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        .layer(axum::middleware::map_response(close_when_body_refused))
        .with_state(state)
}

/// A 413 answers before its request's body was read, and hyper closes
/// the connection after it (the rest of the body is still on the wire):
/// the answer says so, so that a client sends its next request on another
/// connection instead of this closed one.
async fn close_when_body_refused(mut resp: Response) -> Response {
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// `GET /`: the dashboard (a static page of these routes; no token, it
/// holds no data: the page asks for one).
#[utoipa::path(get, path = "/", tag = "dashboard",
    responses((status = 200, description = "the dashboard", content_type = "text/html")))]
async fn dashboard() -> Response {
    static_file(
        "text/html; charset=utf-8",
        include_str!("dashboard/index.html"),
    )
}

/// `GET /ui/app.js`: the dashboard's script.
#[utoipa::path(get, path = "/ui/app.js", tag = "dashboard",
    responses((status = 200, description = "the dashboard's script", content_type = "text/javascript")))]
async fn dashboard_js() -> Response {
    static_file(
        "text/javascript; charset=utf-8",
        include_str!("dashboard/app.js"),
    )
}

/// `GET /ui/style.css`: the dashboard's style sheet.
#[utoipa::path(get, path = "/ui/style.css", tag = "dashboard",
    responses((status = 200, description = "the dashboard's style sheet", content_type = "text/css")))]
async fn dashboard_css() -> Response {
    static_file(
        "text/css; charset=utf-8",
        include_str!("dashboard/style.css"),
    )
}

fn static_file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The document's JSON, made once.
#[derive(Clone)]
struct OpenApiJson(Arc<str>);

/// `GET /openapi.json`: this document (no token: it holds no data).
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "the OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_json(axum::Extension(doc): axum::Extension<OpenApiJson>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.0.to_string(),
    )
        .into_response()
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

/// `POST /runs`.
#[utoipa::path(post, path = "/runs", tag = "runs", request_body = wire::SubmitBody,
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "1–255 visible ASCII; a retry with it answers the first run (one run only)")),
    responses(
        (status = 202, description = "stored (and published, or left to the outbox)", body = wire::Submitted),
        (status = 200, description = "the key's run existed; or, for an array, one answer per item", body = wire::SubmitAnswer),
        (status = 400, description = "bad JSON, kind or key; an empty array", body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 413, description = "body over the limit, or more items than --bulk-max", body = wire::ErrorBody),
        (status = 415, description = "the body is not `Content-Type: application/json`", body = wire::ErrorBody),
        (status = 422, description = "missing or unknown fields; a key used for another request", body = wire::ErrorBody),
        (status = 503, description = "Postgres unavailable: nothing stored", body = wire::ErrorBody),
        (status = 504, description = "Postgres did not answer in time: the run may be stored", body = wire::ErrorBody),
    ),
    security(("bearer" = [])))]
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
    let new: wire::NewRun = serde_json::from_value(body).map_err(|e| {
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
                let body = wire::Submitted {
                    run_id: run,
                    status: Some(RunStatus::Queued),
                    published: Some(published),
                    existing: false,
                };
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
                    Ok(DbReply::Run(Some(r))) => Some(r.status),
                    _ => None,
                };
                let body = wire::Submitted {
                    run_id: first,
                    status,
                    published: None,
                    existing: true,
                };
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
                let body = wire::ErrorBody {
                    error: format!(
                        "Postgres did not answer in time: the run may or may not be stored; {advice}"
                    ),
                    outcome: Some("unknown".into()),
                };
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
    let refusal = |code: StatusCode, error: String| wire::BulkItem::refused(code.as_u16(), error);
    let mut answers: Vec<Option<wire::BulkItem>> = vec![None; items.len()];
    let (mut runs, mut at) = (Vec::new(), Vec::new());
    for (i, item) in items.into_iter().enumerate() {
        match bulk_item(item) {
            Ok(run) => {
                runs.push(run);
                at.push(i);
            }
            Err((code, error)) => answers[i] = Some(refusal(code, error)),
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
        answers[i] = Some(match end {
            SubmitterEnd::Accepted { published } => wire::BulkItem::run(
                202,
                wire::Submitted {
                    run_id: *run,
                    status: Some(RunStatus::Queued),
                    published: Some(published),
                    existing: false,
                },
            ),
            SubmitterEnd::Existing(first) => wire::BulkItem::run(
                200,
                wire::Submitted {
                    run_id: first,
                    status: None,
                    published: None,
                    existing: true,
                },
            ),
            SubmitterEnd::KeyConflict(first) => refusal(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "key {:?} was first used for run {} with another request",
                    submitted.key.as_deref().unwrap_or_default(),
                    first.0
                ),
            ),
            SubmitterEnd::Unavailable => wire::BulkItem {
                outcome: Some("unknown".into()),
                ..refusal(
                    StatusCode::GATEWAY_TIMEOUT,
                    "Postgres did not answer in time: the run may or may not be stored; \
                     an item with a key is safe to submit again"
                        .into(),
                )
            },
            SubmitterEnd::Refused => refusal(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Postgres refused the run's values (text holding a NUL byte); nothing was stored"
                    .into(),
            ),
        });
    }
    tracing::info!(runs = answers.len(), accepted, "bulk submission");
    let runs = answers
        .into_iter()
        .map(|a| a.expect("every item answered"))
        .collect();
    Ok((StatusCode::OK, Json(wire::BulkSubmitted { runs })).into_response())
}

/// An array item as a run to submit, or the status and reason it is not.
fn bulk_item(item: Value) -> Result<Submission, (StatusCode, String)> {
    let run: wire::Submit = serde_json::from_value(item)
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

/// A run as `GET /runs/{id}` and `pelican status` show it.
///
/// # Errors
/// 404 for an unknown run, 503 when Postgres does not answer.
pub async fn run_view(db: &PgDb, run: RunId) -> Result<wire::Run, ApiError> {
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
    let Ok(DbReply::Steps(steps)) = db.execute(&DbOp::ReadSteps { run }).await else {
        return Err(unavailable("Postgres"));
    };
    Ok(wire::Run {
        run_id: row.run_id,
        kind: row.kind,
        input: as_json(&row.input),
        status: row.status,
        dispatch: row.dispatch.0,
        attempts_max: row.attempts_max,
        lease_until_ms: row.lease_until.map(|t| t.0),
        retry_at_ms: row.retry_at.map(|t| t.0),
        entry_id: row.entry_id.map(|e| e.to_string()),
        result: row.result.as_deref().map(as_json),
        error: row.error.map(run_error),
        attempts: attempts
            .iter()
            .map(|(n, a)| wire::Attempt {
                attempt: n.0,
                fence: a.fence.0,
                worker: a.worker.clone(),
                entry_id: a.entry_id.to_string(),
                outcome: a.outcome.map(|o| o.as_str().to_owned()),
            })
            .collect(),
        steps: steps
            .into_iter()
            .map(|(step, s)| wire::Step {
                step,
                name: s.name,
                output: as_json(&s.output),
                fence: s.fence.0,
            })
            .collect(),
    })
}

/// Stored JSON text as JSON (text that is not JSON as a string).
fn as_json(s: &str) -> Value {
    serde_json::from_str::<Value>(s).unwrap_or_else(|_| json!(s))
}

fn run_error((class, message): (ErrorClass, String)) -> wire::RunError {
    wire::RunError {
        class: class.as_str().to_owned(),
        message,
    }
}

/// A run's id in a path: `17` or `run-17`.
const RUN_ID: &str = "the run's id: 17 or run-17";

/// `GET /runs/{id}`.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs", params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$")),
    responses((status = 200, body = wire::Run), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 404, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn get_run(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Run>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let run = parse_run(&id)?;
    Ok(Json(run_view(state.io.db.inner(), run).await?))
}

/// `POST /runs/{id}/cancel` (S7: no new attempt after it).
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$")),
    responses((status = 200, body = wire::Changed), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 404, body = wire::ErrorBody), (status = 409, description = "already ended", body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn cancel_run(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Changed>, ApiError> {
    authorize(&state, &headers, Need::Write)?;
    let run = parse_run(&id)?;
    match cancel(&state.io, run).await {
        Ok(true) => Ok(Json(wire::Changed {
            run_id: run,
            status: RunStatus::Cancelled,
            extra_attempts: None,
        })),
        Ok(false) => Err(refused(state.io.db.inner(), run, |status| {
            format!("run {} already ended: {status}", run.0)
        })
        .await),
        Err(_) => Err(unavailable("Postgres")),
    }
}

/// `GET /healthz` (no token).
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = wire::Health), (status = 503, description = "a server does not answer", body = wire::Health)))]
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
    let word = |ok: bool| if ok { "ok" } else { "unavailable" }.to_owned();
    let body = wire::Health {
        postgres: word(pg),
        redis: word(redis),
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, body = wire::ErrorBody)),
    security(("bearer" = [])))]
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

/// The queue's health, for `GET /queue` and `pelican status`: the
/// stream's side (one [`StreamOp::Queue`]).
#[must_use]
pub fn queue_view(names: &super::StreamNames, q: &QueueState) -> wire::Queue {
    let group = q.group.as_ref();
    wire::Queue {
        stream: names.jobs.clone(),
        group: names.group.clone(),
        group_exists: group.is_some(),
        length: q.length,
        dead_letters: q.dead_letters,
        lag: group.and_then(|g| g.lag),
        pending: group.map_or(0, |g| g.pending),
        oldest_pending: group.and_then(|g| g.oldest_pending).map(|e| e.to_string()),
        oldest_idle_ms: group.and_then(|g| g.oldest_idle_ms),
        consumers: group
            .map_or(&[][..], |g| &g.consumers[..])
            .iter()
            .map(|(name, pending)| wire::Consumer {
                name: name.clone(),
                pending: *pending,
            })
            .collect(),
        runs: None,
        throughput: None,
    }
}

/// The minutes `GET /queue` reports throughput over.
const THROUGHPUT_MINUTES: u32 = 10;

/// [`DbReply::PerMinute`] as the last `minutes` minutes up to `now_minute`,
/// each listed (zero when none finished).
fn per_minute(
    rows: &[(pelican_model::time::Timestamp, RunStatus, u64)],
    minutes: u32,
) -> Vec<wire::Minute> {
    let last = rows.iter().map(|(m, _, _)| m.0).max();
    let now = last.unwrap_or(0).max(now_minute());
    (0..u64::from(minutes))
        .rev()
        .map(|back| {
            let minute_ms = now.saturating_sub(back * 60_000);
            let finished = rows
                .iter()
                .filter(|(m, _, _)| m.0 == minute_ms)
                .map(|(_, s, n)| (s.as_str().to_owned(), *n))
                .collect();
            wire::Minute {
                minute_ms,
                finished,
            }
        })
        .collect()
}

/// This minute's first millisecond, by this host's clock (the rows carry
/// Postgres's minutes; a skew under a minute shifts the window by one).
fn now_minute() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    ms / 60_000 * 60_000
}

/// `GET /queue`: the stream's side, the live runs by status, and the runs
/// finished in each of the last ten minutes.
#[utoipa::path(get, path = "/queue", tag = "queue",
    responses((status = 200, body = wire::Queue), (status = 401, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn queue(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
) -> Result<Json<wire::Queue>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let stream = state.io.stream.inner();
    let op = StreamOp::Queue {
        now: pelican_model::time::Timestamp::ZERO,
    };
    let Ok(Ok(StreamReply::Queue(q))) = stream.execute(op).await else {
        return Err(unavailable("Redis"));
    };
    let Ok(DbReply::Counts(counts)) = state.io.db.inner().execute(&DbOp::CountLive).await else {
        return Err(unavailable("Postgres"));
    };
    let mut view = queue_view(stream.names(), &q);
    view.runs = Some(
        metrics::live_runs(&counts)
            .map(|(s, n)| (s.as_str().to_owned(), n))
            .collect(),
    );
    let op = DbOp::FinishedPerMinute {
        minutes: THROUGHPUT_MINUTES,
    };
    let Ok(DbReply::PerMinute(rows)) = state.io.db.inner().execute(&op).await else {
        return Err(unavailable("Postgres"));
    };
    view.throughput = Some(per_minute(&rows, THROUGHPUT_MINUTES));
    Ok(Json(view))
}

/// One event as an SSE event: `id` its number, `event` its kind, `data`
/// its [`event_view`].
fn sse_event(e: &RunEvent) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default()
        .id(e.seq.to_string())
        .event(e.kind.as_str())
        .json_data(event_view(e))
        .expect("an event serializes"))
}

/// One event as an SSE event's data.
#[must_use]
pub fn event_view(e: &RunEvent) -> wire::Event {
    let mut v = wire::Event {
        seq: e.seq,
        kind: e.kind,
        attempt: e.attempt.0,
        fence: e.fence.0,
        worker: None,
        progress: None,
        class: None,
        message: None,
    };
    match e.kind {
        EventKind::Claimed => v.worker = Some(e.data.clone()),
        EventKind::Progress => v.progress = Some(as_json(&e.data)),
        _ if e.class.is_some() => {
            v.class = e.class.map(|c| c.as_str().to_owned());
            v.message = Some(e.data.clone());
        }
        _ => {}
    }
    v
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Start after this event (0: from the first); `Last-Event-ID` wins.
    after: Option<u32>,
}

/// `GET /runs/{id}/events`: the run's events after `Last-Event-ID` (or
/// `?after=N`; 0: from the first), one SSE event each (`id`: its number,
/// `event`: its kind, `data`: [`event_view`]), as they are written. The
/// stream ends after a terminal event; a client that comes back after it
/// gets 204 (EventSource then stops reconnecting). While Postgres does not
/// answer, the stream waits and keeps the connection alive.
#[utoipa::path(get, path = "/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$"),
        ("Last-Event-ID" = Option<u32>, Header, minimum = 0, description = "resume after this event"),
        EventsQuery),
    responses(
        (status = 200, description = "text/event-stream: `id` the event's number, `event` its kind, `data` an Event", body = wire::Event, content_type = "text/event-stream"),
        (status = 204, description = "the run ended and every event was seen"),
        (status = 400, body = wire::ErrorBody), (status = 401, body = wire::ErrorBody),
        (status = 404, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
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
    let row = match db.execute(&DbOp::ReadRunHead { run }).await {
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
    // The process's one reader follows the run for this stream: no poll
    // of the stream's own.
    let Some(sub) = state.watchers.subscribe(run, after) else {
        let mut e = ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "this API has as many events streams open as it serves; retry, or at another".into(),
        )
        .into_response();
        e.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return Ok(e);
    };
    let events = futures_util::stream::unfold(sub, |mut sub| async move {
        let batch = sub.events.recv().await?;
        let sent: Vec<Result<Event, std::convert::Infallible>> =
            batch.iter().map(sse_event).collect();
        Some((futures_util::stream::iter(sent), sub))
    });
    let mut stopping = state.stopping.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let events =
        futures_util::StreamExt::take_until(futures_util::StreamExt::flatten(events), stopped);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The most runs or dead letters one page may hold, and how many it holds
/// by default.
const PAGE_MAX: usize = 1_000;
const PAGE_DEFAULT: usize = 100;

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Page {
    /// Only runs of this status.
    #[param(pattern = r"^(queued|running|retry_wait|succeeded|failed|dead|cancelled)?$")]
    status: Option<String>,
    /// Only runs of this kind.
    #[param(pattern = r"^([a-z0-9_.-]{1,64})?$")]
    kind: Option<String>,
    /// The `next_cursor` of the page before.
    #[param(pattern = r"^((run-)?[0-9]{1,19})?$")]
    cursor: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// A page of dead letters.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Cursor {
    /// The `next_cursor` of the page before.
    #[param(pattern = r"^((run-)?[0-9]{1,19})?$")]
    cursor: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// The run after which a page starts, and its size.
fn bounds(cursor: Option<&str>, limit: Option<usize>) -> Result<(RunId, usize), ApiError> {
    let after = match cursor {
        None | Some("") => RunId(0),
        Some(c) => parse_run(c)?,
    };
    let limit = limit.unwrap_or(PAGE_DEFAULT);
    if limit == 0 || limit > PAGE_MAX {
        return Err(bad(format!("limit must be 1 to {PAGE_MAX}, got {limit}")));
    }
    Ok((after, limit))
}

/// The query of a page, or a 400 that says what is wrong with it.
fn page<T>(
    query: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query.map(|q| q.0).map_err(|e| bad(e.body_text()))
}

/// The cursor of the page after one that ended at `last` and held `n` of
/// at most `limit` (none: this was the last page).
fn next_cursor(last: Option<RunId>, n: usize, limit: usize) -> Option<String> {
    match last {
        Some(run) if n == limit => Some(run.0.to_string()),
        _ => None,
    }
}

/// `GET /runs`: runs by id, of one status and one kind if asked.
#[utoipa::path(get, path = "/runs", tag = "runs", params(Page),
    responses((status = 200, body = wire::RunPage), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn list_runs(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::RunPage>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let q = page(query)?;
    let (after, limit) = bounds(q.cursor.as_deref(), q.limit)?;
    let status = q.status.unwrap_or_default();
    if !status.is_empty() && RunStatus::parse(&status).is_none() {
        let known: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
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
    let runs = rows
        .into_iter()
        .map(|r| wire::RunSummary {
            run_id: r.run_id,
            kind: r.kind,
            status: r.status,
            attempts: r.attempts,
            attempts_max: r.attempts_max,
            events: r.events,
            finished_at_ms: r.finished_at.map(|t| t.0),
            error: r.error.map(run_error),
        })
        .collect();
    Ok(Json(wire::RunPage {
        runs,
        next_cursor: next,
    }))
}

/// A dead letter, for `GET /dead-letters` and `pelican dlq list`.
#[must_use]
pub fn dead_letter_view(run: RunId, d: &pelican_model::db::DeadLetter) -> wire::DeadLetter {
    wire::DeadLetter {
        run_id: run,
        class: d.class.as_str().to_owned(),
        message: d.message.clone(),
        source_entry: d.source_entry.map(|e| e.to_string()),
        requeued: d.requeued,
        attempts: d
            .attempts
            .iter()
            .map(|(n, f, o)| wire::DeadAttempt {
                attempt: n.0,
                fence: f.0,
                outcome: o.map(|o| o.as_str().to_owned()),
            })
            .collect(),
    }
}

/// Why a write to `run` that changed no row was refused: 409 with
/// `conflict`'s message for the run's status, 404 for an unknown run, 503
/// when Postgres does not answer.
async fn refused(db: &PgDb, run: RunId, conflict: impl FnOnce(RunStatus) -> String) -> ApiError {
    match db.execute(&DbOp::ReadRunHead { run }).await {
        Ok(DbReply::Run(Some(r))) => ApiError(StatusCode::CONFLICT, conflict(r.status)),
        Ok(DbReply::Run(None)) => ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0)),
        _ => unavailable("Postgres"),
    }
}

/// `GET /dead-letters`: dead letters by run.
#[utoipa::path(get, path = "/dead-letters", tag = "dead letters", params(Cursor),
    responses((status = 200, body = wire::DeadLetterPage), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn list_dead_letters(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<Cursor>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::DeadLetterPage>, ApiError> {
    authorize(&state, &headers, Need::Read)?;
    let q = page(query)?;
    let (after, limit) = bounds(q.cursor.as_deref(), q.limit)?;
    let op = DbOp::ListDeadLetters { after, limit };
    let Ok(DbReply::DeadLetters(rows)) = state.io.db.inner().execute(&op).await else {
        return Err(unavailable("Postgres"));
    };
    let next = next_cursor(rows.last().map(|(r, _)| *r), rows.len(), limit);
    let dead_letters = rows
        .iter()
        .map(|(run, d)| dead_letter_view(*run, d))
        .collect();
    Ok(Json(wire::DeadLetterPage {
        dead_letters,
        next_cursor: next,
    }))
}

/// `POST /dead-letters/{id}/requeue`: an operator's re-run of a dead run.
#[utoipa::path(post, path = "/dead-letters/{id}/requeue", tag = "dead letters",
    params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$")), request_body(content = Option<wire::Requeue>),
    responses((status = 200, body = wire::Changed), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 404, body = wire::ErrorBody), (status = 409, description = "not dead", body = wire::ErrorBody),
        (status = 422, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
async fn requeue_dead_letter(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<wire::Changed>, ApiError> {
    authorize(&state, &headers, Need::Write)?;
    let run = parse_run(&id)?;
    let wire::Requeue { extra_attempts } = if body.iter().all(u8::is_ascii_whitespace) {
        wire::Requeue { extra_attempts: 1 }
    } else {
        // `null` is the empty body's JSON: the default too.
        serde_json::from_slice::<Option<wire::Requeue>>(&body)
            .map(|r| r.unwrap_or(wire::Requeue { extra_attempts: 1 }))
            .map_err(|e| {
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
    match requeue_dead(db, &state.io.config.policy, run, extra_attempts).await {
        Ok(Requeued::Yes) => {
            tracing::info!(%run, extra_attempts, "dead run requeued");
            Ok(Json(wire::Changed {
                run_id: run,
                status: RunStatus::Queued,
                extra_attempts: Some(extra_attempts),
            }))
        }
        Ok(Requeued::NoRun) => Err(ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0))),
        // Read again for the status it has now.
        Ok(Requeued::NotDead) => Err(refused(db, run, |status| {
            format!("run {} is {status}, not dead awaiting a requeue", run.0)
        })
        .await),
        Err(_) => Err(unavailable("Postgres")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document names every route the API serves, with its methods,
    /// and every body it names is defined in it.
    #[test]
    fn the_openapi_document_lists_every_route() {
        let doc: Value = serde_json::from_str(&openapi().to_json().unwrap()).unwrap();
        let paths = doc["paths"].as_object().expect("paths");
        let mut listed: Vec<String> = paths
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| ["get", "post"].contains(&k.as_str()))
                    .map(move |m| format!("{} {path}", m.to_uppercase()))
            })
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                "GET /",
                "GET /dead-letters",
                "GET /healthz",
                "GET /metrics",
                "GET /openapi.json",
                "GET /queue",
                "GET /runs",
                "GET /runs/{id}",
                "GET /runs/{id}/events",
                "GET /ui/app.js",
                "GET /ui/style.css",
                "POST /dead-letters/{id}/requeue",
                "POST /runs",
                "POST /runs/{id}/cancel",
            ]
        );
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for reference in text.split("\"#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(schemas.contains_key(name), "{name} is used but not defined");
        }
    }
}
