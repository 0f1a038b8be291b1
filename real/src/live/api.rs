//! `pelican api`: the HTTP API (axum).
//!
//! | route | does |
//! |---|---|
//! | `POST /runs` | validates `{"kind": .., "input": ..}`, writes the run durably, publishes it, answers 202 with its id (a failed publish still leaves a run the outbox publishes); with an `Idempotency-Key`, a key already used answers its run (200) or 422 for another request |
//! | `GET /runs?status=&kind=&ended_from_ms=&ended_to_ms=&cursor=&limit=` | runs by id, filtered, a page at a time (keyset: `next_cursor` starts the next page); `?key=` finds the run of an idempotency key |
//! | `GET /runs/count?status=&kind=&ended_from_ms=&ended_to_ms=` | how many runs the filter matches, by status |
//! | `POST /runs/cancel` | cancels every run of a live status (and kind) in batches, up to a limit |
//! | `GET /dead-letters?cursor=&limit=` | dead letters by run, a page at a time |
//! | `POST /dead-letters/{id}/requeue` | runs a dead run again with `{"extra_attempts": N}` more (default 1); 409 if it is not dead |
//! | `POST /dead-letters/requeue` | runs every dead run of a kind (that died in a range) again, in batches, up to a limit |
//! | `GET /runs/{id}` | the run: status, attempts with fences and outcomes, result or error |
//! | `GET /runs/{id}/events` | the run's events over SSE (S13): resumes after `Last-Event-ID` (or `?after=N`), ends after a terminal event; 204 when the run has ended and every event was seen |
//! | `POST /runs/{id}/cancel` | cancels it (S7); 409 if it already ended |
//! | `POST /schedules` | makes a cron schedule, or replaces the one of its name: `{"name", "kind", "input", "cron", "tz", "overlap", "catchup"}`; each tick makes one run (S16) |
//! | `GET /schedules` | every schedule, with its next ticks, lag and counts |
//! | `DELETE /schedules/{name}` | deletes it; its runs stay |
//! | `GET /queue` | the queue's health: stream length, lag, pending deliveries, the oldest one's idle time, pending per consumer, live runs by status |
//! | `GET /stats?minutes=` | runs finished and succeeded runs' latency (p50, p99) per minute, over the last hour or less |
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
use auth::{Reader, Writer};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use pelican_client::wire;
use pelican_model::db::{Delay, query};
use pelican_model::events::{EventKind, RunEvent};
use pelican_model::ids::RunId;
use pelican_model::protocol::{QueueState, StreamOp, StreamReply, SubmitterEnd};
use pelican_model::status::{ErrorClass, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod auth;
mod body;
mod bulk;
mod events;
mod queue;
mod runs;
mod schedules;
mod search;
mod submit;

pub use events::event_view;
pub use queue::queue_view;
pub use runs::{dead_letter_view, run_view};
pub use schedules::{put_schedule, schedule_view, schedules_view};
pub use submit::{
    DELAY_MS_MAX, IDEMPOTENCY_KEY, RUN_AT_MS_MAX, delay_of, expire_keys, validate_key,
    validate_kind,
};

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
    /// The span exporter (`--otlp-endpoint`), if on.
    pub otel: Option<super::otel::Otel>,
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

/// 503 for a statement without its answer; the error is logged.
fn postgres(e: super::pg::PgError) -> ApiError {
    tracing::warn!(error = %e, "a statement of the API failed");
    unavailable("Postgres")
}

/// 404 for run `run`.
fn no_run(run: RunId) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no run {}", run.0))
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
        .routes(routes!(submit::create_run, search::list_runs))
        .routes(routes!(search::count_runs))
        .routes(routes!(bulk::cancel_runs))
        .routes(routes!(runs::list_dead_letters))
        .routes(routes!(bulk::requeue_dead_letters))
        .routes(routes!(runs::requeue_dead_letter))
        .routes(routes!(runs::get_run))
        .routes(routes!(events::run_events))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(
            schedules::create_schedule,
            schedules::list_schedules
        ))
        .routes(routes!(schedules::delete_schedule))
        .routes(routes!(queue::queue))
        .routes(routes!(queue::stats))
        .routes(routes!(queue::healthz))
        .routes(routes!(queue::metrics_text))
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
        .layer(axum::middleware::from_fn_with_state(
            body_limit_bytes,
            body::read_whole,
        ))
        .with_state(state)
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

fn parse_run(id: &str) -> Result<RunId, ApiError> {
    let digits = id.strip_prefix("run-").unwrap_or(id);
    digits.parse::<u64>().map(RunId).map_err(|_| {
        bad(format!(
            "{id:?} is not a run id (a number, or run-<number>)"
        ))
    })
}

/// A run's id in a path: `17` or `run-17`.
const RUN_ID: &str = "the run's id: 17 or run-17";

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
                    .filter(|k| ["get", "post", "delete"].contains(&k.as_str()))
                    .map(move |m| format!("{} {path}", m.to_uppercase()))
            })
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                "DELETE /schedules/{name}",
                "GET /",
                "GET /dead-letters",
                "GET /healthz",
                "GET /metrics",
                "GET /openapi.json",
                "GET /queue",
                "GET /runs",
                "GET /runs/count",
                "GET /runs/{id}",
                "GET /runs/{id}/events",
                "GET /schedules",
                "GET /stats",
                "GET /ui/app.js",
                "GET /ui/style.css",
                "POST /dead-letters/requeue",
                "POST /dead-letters/{id}/requeue",
                "POST /runs",
                "POST /runs/cancel",
                "POST /runs/{id}/cancel",
                "POST /schedules",
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
