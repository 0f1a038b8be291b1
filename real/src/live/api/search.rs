//! Finding runs: a page of them by a filter (status, kind, when they
//! ended) or by an idempotency key, and how many a filter matches.

use super::runs::{bounds, next_cursor, page, run_error};
use super::*;

/// `GET /runs`' query.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Page {
    /// Only runs of this status.
    #[param(pattern = r"^(delayed|queued|running|retry_wait|succeeded|failed|dead|cancelled)?$")]
    status: Option<String>,
    /// Only runs of this kind.
    #[param(pattern = r"^([a-z0-9_.-]{1,64})?$")]
    kind: Option<String>,
    /// Only runs that ended at or after this instant (ms since the epoch;
    /// a range keeps finished runs only).
    ended_from_ms: Option<u64>,
    /// Only runs that ended before this instant.
    ended_to_ms: Option<u64>,
    /// The run this idempotency key names: a page of it alone, if it
    /// passes the other filters.
    #[param(pattern = r"^[!-~]{1,255}$")]
    key: Option<String>,
    /// The `next_cursor` of the page before.
    #[param(pattern = r"^((run-)?[0-9]{1,19})?$")]
    cursor: Option<String>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// `GET /runs/count`'s query: `GET /runs`' filter.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Matching {
    /// Only runs of this status.
    #[param(pattern = r"^(delayed|queued|running|retry_wait|succeeded|failed|dead|cancelled)?$")]
    status: Option<String>,
    /// Only runs of this kind.
    #[param(pattern = r"^([a-z0-9_.-]{1,64})?$")]
    kind: Option<String>,
    /// Only runs that ended at or after this instant (ms since the epoch).
    ended_from_ms: Option<u64>,
    /// Only runs that ended before this instant.
    ended_to_ms: Option<u64>,
}

/// A filter, checked: [`pelican_model::db::RunFilter`]'s fields, owned
/// (each `""` or 0: any).
pub(super) struct Filter {
    pub(super) status: String,
    pub(super) kind: String,
    pub(super) ended_from_ms: u64,
    pub(super) ended_to_ms: u64,
}

impl Filter {
    /// The filter asked for, or a 400 that says what is wrong with it.
    pub(super) fn new(
        status: Option<String>,
        kind: Option<String>,
        ended_from_ms: Option<u64>,
        ended_to_ms: Option<u64>,
    ) -> Result<Filter, ApiError> {
        let status = status.unwrap_or_default();
        if !status.is_empty() && RunStatus::parse(&status).is_none() {
            let known: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
            return Err(bad(format!(
                "no status {status:?}; known: {}",
                known.join(", ")
            )));
        }
        let kind = kind.unwrap_or_default();
        if !kind.is_empty() {
            validate_kind(&kind).map_err(bad)?;
        }
        let (from, to) = (ended_from_ms.unwrap_or(0), ended_to_ms.unwrap_or(0));
        if i64::try_from(from.max(to)).is_err() {
            return Err(bad(format!(
                "ended_from_ms and ended_to_ms are at most {}",
                i64::MAX
            )));
        }
        Ok(Filter {
            status,
            kind,
            ended_from_ms: from,
            ended_to_ms: to,
        })
    }

    /// Whether run `r` passes ([`pelican_model::db::RunFilter::matches`]).
    pub(super) fn matches(&self, r: &pelican_model::db::RunRow) -> bool {
        pelican_model::db::RunFilter {
            status: &self.status,
            kind: &self.kind,
            ended_from_ms: self.ended_from_ms,
            ended_to_ms: self.ended_to_ms,
        }
        .matches(r)
    }

    /// A page of up to `limit` runs that pass, after `after`.
    pub(super) fn page(&self, after: RunId, limit: usize) -> query::ListRuns {
        query::ListRuns {
            status: self.status.clone(),
            kind: self.kind.clone(),
            ended_from_ms: self.ended_from_ms,
            ended_to_ms: self.ended_to_ms,
            after,
            limit,
        }
    }
}

/// A row as a page lists it.
fn summary(r: pelican_model::db::RunRow) -> wire::RunSummary {
    wire::RunSummary {
        run_id: r.run_id,
        kind: r.kind,
        status: r.status,
        attempts: r.attempts,
        attempts_max: r.attempts_max,
        events: r.events,
        finished_at_ms: r.finished_at.map(|t| t.0),
        error: r.error.map(run_error),
    }
}

/// `GET /runs`: runs by id that pass a filter (of status, kind, and when
/// they ended), or the run an idempotency key names.
#[utoipa::path(get, path = "/runs", tag = "runs", params(Page),
    responses((status = 200, body = wire::RunPage), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_runs(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    query: Result<axum::extract::Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::RunPage>, ApiError> {
    let q = page(query)?;
    let db = state.io.db.inner();
    let (after, limit) = bounds(q.cursor.as_deref(), q.limit)?;
    let filter = Filter::new(q.status, q.kind, q.ended_from_ms, q.ended_to_ms)?;
    if let Some(key) = q.key {
        validate_key(&key).map_err(bad)?;
        let mut runs = Vec::new();
        for run in db.query(query::RunOfKey { key }).await.map_err(postgres)? {
            let row = db.query(query::ReadRun { run }).await.map_err(postgres)?;
            if let Some(row) = row.filter(|r| r.run_id > after && filter.matches(r)) {
                runs.push(summary(row.summary()));
            }
        }
        return Ok(Json(wire::RunPage {
            runs,
            next_cursor: None,
        }));
    }
    let rows = db
        .query(filter.page(after, limit))
        .await
        .map_err(postgres)?;
    let next = next_cursor(rows.last().map(|r| r.run_id), rows.len(), limit);
    Ok(Json(wire::RunPage {
        runs: rows.into_iter().map(summary).collect(),
        next_cursor: next,
    }))
}

/// `GET /runs/count`: how many runs pass `GET /runs`' filter, by status:
/// what a bulk action would take.
#[utoipa::path(get, path = "/runs/count", tag = "runs", params(Matching),
    responses((status = 200, body = wire::RunCount), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn count_runs(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    query: Result<axum::extract::Query<Matching>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::RunCount>, ApiError> {
    let q = page(query)?;
    let f = Filter::new(q.status, q.kind, q.ended_from_ms, q.ended_to_ms)?;
    let count = query::CountMatching {
        status: f.status,
        kind: f.kind,
        ended_from_ms: f.ended_from_ms,
        ended_to_ms: f.ended_to_ms,
    };
    let rows = state.io.db.inner().query(count).await.map_err(postgres)?;
    Ok(Json(wire::RunCount {
        total: rows.iter().map(|(_, n)| n).sum(),
        by_status: rows
            .into_iter()
            .map(|(s, n)| (s.as_str().to_owned(), n))
            .collect(),
    }))
}
