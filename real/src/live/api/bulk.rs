//! Bulk actions, for an incident: cancel every live run that matches a
//! filter, run every dead run of a kind again. Each goes through the
//! matching runs a batch at a time (a page of [`BATCH`] by run id, its
//! runs' statements sent together), so a backlog of any size is a series
//! of small statements, never one long transaction, and a run that moved
//! on meanwhile is skipped, not forced. `GET /runs/count` gives the count
//! to confirm first.

use super::search::Filter;
use super::*;
use pelican_model::protocol::Unavailable;
use std::future::Future;

/// Runs taken per batch.
const BATCH: usize = 500;
/// Runs one request takes by default, and at most.
const LIMIT_DEFAULT: usize = 10_000;
const LIMIT_MAX: usize = 100_000;

/// A bulk body: a JSON object of `T`'s fields, or the 4xx that says what
/// is wrong with it (415 not JSON, 400 bad JSON, 422 not `T`; an array
/// is not an object, though serde would read a struct from one).
fn body<T: serde::de::DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
) -> Result<T, ApiError> {
    let value = body.map_err(|e| ApiError(e.status(), e.body_text()))?.0;
    if !value.is_object() {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body must be a JSON object".to_owned(),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))
}

/// Applies `act` to up to `limit` runs that pass `filter`, by run id, a
/// batch at a time. `act` answers whether it changed the run.
async fn each_matching<F, Fut>(
    db: &PgDb,
    filter: &Filter,
    (mut after, limit): (RunId, usize),
    act: F,
) -> Result<wire::BulkDone, ApiError>
where
    F: Fn(RunId) -> Fut,
    Fut: Future<Output = Result<bool, Unavailable>>,
{
    let mut done = wire::BulkDone {
        changed: 0,
        skipped: 0,
        next_cursor: None,
    };
    loop {
        let taken = usize::try_from(done.changed + done.skipped).unwrap_or(usize::MAX);
        let want = limit.saturating_sub(taken).min(BATCH);
        let page = db.query(filter.page(after, want)).await.map_err(postgres)?;
        let Some(last) = page.last().map(|r| r.run_id) else {
            return Ok(done);
        };
        let acts = page.iter().map(|r| act(r.run_id));
        for result in futures_util::future::join_all(acts).await {
            match result {
                Ok(true) => done.changed += 1,
                Ok(false) => done.skipped += 1,
                Err(Unavailable) => {
                    return Err(ApiError(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "Postgres is unavailable after {} runs were changed; \
                             send it again for the rest",
                            done.changed
                        ),
                    ));
                }
            }
        }
        after = last;
        if page.len() < want {
            return Ok(done);
        }
        if want == limit - taken {
            let next = db.query(filter.page(after, 1)).await.map_err(postgres)?;
            done.next_cursor = (!next.is_empty()).then(|| after.0.to_string());
            return Ok(done);
        }
    }
}

/// `POST /runs/cancel`: cancels every run of a live status (and a kind, if
/// given) up to a limit, as `POST /runs/{id}/cancel` would each (S7).
#[utoipa::path(post, path = "/runs/cancel", tag = "runs", request_body = wire::BulkCancel,
    responses((status = 200, body = wire::BulkDone), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 415, body = wire::ErrorBody), (status = 422, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn cancel_runs(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    asked: Result<Json<Value>, JsonRejection>,
) -> Result<Json<wire::BulkDone>, ApiError> {
    let asked: wire::BulkCancel = body(asked)?;
    if asked.kind.as_deref() == Some("") {
        return Err(bad("kind, when given, names the runs' kind"));
    }
    let status = asked.status;
    if RunStatus::parse(&status).is_none_or(RunStatus::is_terminal) {
        return Err(bad(format!(
            "status must be delayed, queued, retry_wait or running, got {status:?}"
        )));
    }
    let filter = Filter::new(Some(status), asked.kind, None, None)?;
    let span = runs::span(
        asked.cursor.as_deref(),
        asked.limit,
        LIMIT_DEFAULT,
        LIMIT_MAX,
    )?;
    let db = state.io.db.inner();
    let done = each_matching(db, &filter, span, |run| cancel(&state.io, run)).await?;
    tracing::info!(
        status = %filter.status, kind = %filter.kind, changed = done.changed,
        skipped = done.skipped, more = done.next_cursor.is_some(), "runs cancelled in bulk"
    );
    Ok(Json(done))
}

/// `POST /dead-letters/requeue`: runs every dead run of a kind (that died
/// within a range, if given) again, up to a limit, as
/// `POST /dead-letters/{id}/requeue` would each.
#[utoipa::path(post, path = "/dead-letters/requeue", tag = "dead letters", request_body = wire::BulkRequeue,
    responses((status = 200, body = wire::BulkDone), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 415, body = wire::ErrorBody), (status = 422, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn requeue_dead_letters(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    asked: Result<Json<Value>, JsonRejection>,
) -> Result<Json<wire::BulkDone>, ApiError> {
    let asked: wire::BulkRequeue = body(asked)?;
    if asked.kind.is_empty() {
        return Err(bad("kind must name the dead runs' kind"));
    }
    let extra = asked.extra_attempts;
    if extra == 0 || extra > 100 {
        return Err(bad(format!("extra_attempts must be 1 to 100, got {extra}")));
    }
    let (from, to) = (asked.ended_from_ms, asked.ended_to_ms);
    let filter = Filter::new(Some("dead".to_owned()), Some(asked.kind), from, to)?;
    let span = runs::span(
        asked.cursor.as_deref(),
        asked.limit,
        LIMIT_DEFAULT,
        LIMIT_MAX,
    )?;
    let policy = &state.io.config.policy;
    let batching = &state.io.db;
    let done = each_matching(state.io.db.inner(), &filter, span, |run| async move {
        let requeued = requeue_dead(batching, policy, run, extra).await?;
        Ok(requeued == Requeued::Yes)
    })
    .await?;
    tracing::info!(
        kind = %filter.kind, extra_attempts = extra, changed = done.changed,
        skipped = done.skipped, more = done.next_cursor.is_some(), "dead runs requeued in bulk"
    );
    Ok(Json(done))
}
