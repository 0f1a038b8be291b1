//! One run and the dead letters: a run, a cancel, a page of dead
//! letters, a requeue; and the paging every list shares.

use super::*;

/// A run as `GET /runs/{id}` and `pelican status` show it.
///
/// # Errors
/// 404 for an unknown run, 503 when Postgres does not answer.
pub async fn run_view(db: &PgDb, run: RunId) -> Result<wire::Run, ApiError> {
    let row = db.query(query::ReadRun { run }).await.map_err(postgres)?;
    let row = row.ok_or_else(|| no_run(run))?;
    let attempts = db
        .query(query::ReadAttempts { run })
        .await
        .map_err(postgres)?;
    let steps = db.query(query::ReadSteps { run }).await.map_err(postgres)?;
    Ok(wire::Run {
        run_id: row.run_id,
        kind: row.kind,
        input: as_json(&row.input),
        status: row.status,
        dispatch: row.dispatch.0,
        attempts_max: row.attempts_max,
        lease_until_ms: row.lease_until.map(|t| t.0),
        retry_at_ms: row.retry_at.map(|t| t.0),
        due_at_ms: row.due_at.map(|t| t.0),
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
                claimed_at_ms: a.claimed_at.map(|t| t.0),
                ended_at_ms: a.ended_at.map(|t| t.0),
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
pub(super) fn as_json(s: &str) -> Value {
    serde_json::from_str::<Value>(s).unwrap_or_else(|_| json!(s))
}

pub(super) fn run_error((class, message): (ErrorClass, String)) -> wire::RunError {
    wire::RunError {
        class: class.as_str().to_owned(),
        message,
    }
}

/// `GET /runs/{id}`.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs", params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$")),
    responses((status = 200, body = wire::Run), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 404, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn get_run(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Run>, ApiError> {
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
pub(super) async fn cancel_run(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Changed>, ApiError> {
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

/// The most runs or dead letters one page may hold, and how many it holds
/// by default.
pub(super) const PAGE_MAX: usize = 1_000;
pub(super) const PAGE_DEFAULT: usize = 100;

/// A page of dead letters.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Cursor {
    /// The `next_cursor` of the page before.
    #[param(pattern = r"^((run-)?[0-9]{1,19})?$")]
    cursor: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// The run after which a page starts, and its size.
pub(super) fn bounds(
    cursor: Option<&str>,
    limit: Option<usize>,
) -> Result<(RunId, usize), ApiError> {
    span(cursor, limit, PAGE_DEFAULT, PAGE_MAX)
}

/// The run after `cursor` (none: the first), and `limit`, by default
/// `default`, checked to be 1 to `max`.
pub(super) fn span(
    cursor: Option<&str>,
    limit: Option<usize>,
    default: usize,
    max: usize,
) -> Result<(RunId, usize), ApiError> {
    let after = match cursor {
        None | Some("") => RunId(0),
        Some(c) => parse_run(c)?,
    };
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(bad(format!("limit must be 1 to {max}, got {limit}")));
    }
    Ok((after, limit))
}

/// The query of a page, or a 400 that says what is wrong with it.
pub(super) fn page<T>(
    query: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query.map(|q| q.0).map_err(|e| bad(e.body_text()))
}

/// The cursor of the page after one that ended at `last` and held `n` of
/// at most `limit` (none: this was the last page).
pub(super) fn next_cursor(last: Option<RunId>, n: usize, limit: usize) -> Option<String> {
    match last {
        Some(run) if n == limit => Some(run.0.to_string()),
        _ => None,
    }
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
pub(super) async fn refused(
    db: &PgDb,
    run: RunId,
    conflict: impl FnOnce(RunStatus) -> String,
) -> ApiError {
    match db.query(query::ReadRunHead { run }).await {
        Ok(Some(r)) => ApiError(StatusCode::CONFLICT, conflict(r.status)),
        Ok(None) => no_run(run),
        Err(e) => postgres(e),
    }
}

/// `GET /dead-letters`: dead letters by run.
#[utoipa::path(get, path = "/dead-letters", tag = "dead letters", params(Cursor),
    responses((status = 200, body = wire::DeadLetterPage), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_dead_letters(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    query: Result<axum::extract::Query<Cursor>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::DeadLetterPage>, ApiError> {
    let q = page(query)?;
    let (after, limit) = bounds(q.cursor.as_deref(), q.limit)?;
    let list = query::ListDeadLetters { after, limit };
    let rows = state.io.db.inner().query(list).await.map_err(postgres)?;
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
pub(super) async fn requeue_dead_letter(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<wire::Changed>, ApiError> {
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
