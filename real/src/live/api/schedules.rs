//! `/schedules`: cron schedules, made, listed and deleted. The workers'
//! scheduler does the rest ([`pelican_model::schedule`]).

use super::*;
use pelican_model::schedule::{Cron, NEVER, ScheduleRow};
use pelican_model::time::Timestamp;

/// How many of a schedule's next ticks a view shows.
const NEXT_TICKS: usize = 3;

/// The statement that puts `new`, checked: its name and kind spelled as
/// kinds are, its cron expression and time zone readable.
///
/// # Errors
/// What is wrong with it, for a 400.
pub fn put_schedule(new: &wire::NewSchedule) -> Result<query::PutSchedule, String> {
    validate_kind(&new.name).map_err(|e| e.replacen("kind", "name", 1))?;
    validate_kind(&new.kind)?;
    Cron::parse(&new.cron, &new.tz)?;
    Ok(query::PutSchedule {
        name: new.name.clone(),
        kind: new.kind.clone(),
        input: new.input.to_string(),
        cron: new.cron.clone(),
        tz: new.tz.clone(),
        overlap: new.overlap,
        catchup: new.catchup,
    })
}

/// Schedule `s` as the API shows it at `now` (Postgres's clock): its next
/// ticks (a schedule not planned yet shows the ticks it will have).
#[must_use]
pub fn schedule_view(now: Timestamp, s: ScheduleRow) -> wire::Schedule {
    let cron = Cron::parse(&s.cron, &s.tz).ok();
    let first = match s.next_tick {
        Timestamp::ZERO => cron.as_ref().and_then(|c| c.after(now)),
        NEVER => None,
        t => Some(t),
    };
    let ticks = std::iter::successors(first, |t| cron.as_ref().and_then(|c| c.after(*t)));
    wire::Schedule {
        id: s.id,
        next_ticks_ms: ticks.take(NEXT_TICKS).map(|t| t.0).collect(),
        lag_ms: first.map_or(0, |t| now.ms_since(t)),
        last_tick_ms: (s.last_tick > Timestamp::ZERO).then_some(s.last_tick.0),
        last_run: s.last_run,
        fired: s.fired,
        skipped: s.skipped,
        spec: wire::NewSchedule {
            name: s.name,
            kind: s.kind,
            input: runs::as_json(&s.input),
            cron: s.cron,
            tz: s.tz,
            overlap: s.overlap,
            catchup: s.catchup,
        },
    }
}

/// Every schedule, as the API shows them.
///
/// # Errors
/// 503 when Postgres does not answer.
pub async fn schedules_view(db: &PgDb) -> Result<wire::Schedules, ApiError> {
    let rows = db.query(query::ListSchedules {}).await.map_err(postgres)?;
    Ok(wire::Schedules {
        schedules: rows
            .into_iter()
            .map(|(now, s)| schedule_view(now, s))
            .collect(),
    })
}

async fn one_view(db: &PgDb, name: &str) -> Result<wire::Schedule, ApiError> {
    schedules_view(db)
        .await?
        .schedules
        .into_iter()
        .find(|s| s.spec.name == name)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no schedule {name:?}")))
}

/// `POST /schedules`.
#[utoipa::path(post, path = "/schedules", tag = "schedules", request_body = wire::NewSchedule,
    responses((status = 200, description = "made, or replaced: planned afresh", body = wire::Schedule),
        (status = 400, description = "bad name, kind, cron expression or time zone", body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 413, description = "body over the limit", body = wire::ErrorBody),
        (status = 415, description = "the body is not `Content-Type: application/json`", body = wire::ErrorBody),
        (status = 422, description = "missing or unknown fields", body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn create_schedule(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    body: Result<Json<wire::NewSchedule>, JsonRejection>,
) -> Result<Json<wire::Schedule>, ApiError> {
    let Json(new) = body.map_err(|e| ApiError(e.status(), e.body_text()))?;
    let put = put_schedule(&new).map_err(bad)?;
    let db = state.io.db.inner();
    db.query(put).await.map_err(postgres)?;
    Ok(Json(one_view(db, &new.name).await?))
}

/// `GET /schedules`.
#[utoipa::path(get, path = "/schedules", tag = "schedules",
    responses((status = 200, body = wire::Schedules), (status = 401, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn list_schedules(
    _: Reader,
    State(state): State<Arc<ApiState>>,
) -> Result<Json<wire::Schedules>, ApiError> {
    Ok(Json(schedules_view(state.io.db.inner()).await?))
}

/// `DELETE /schedules/{name}`: no tick of it makes a run after this; its
/// runs stay.
#[utoipa::path(delete, path = "/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, pattern = r"^[a-z0-9_.-]{1,64}$")),
    responses((status = 200, description = "deleted; as it was", body = wire::Schedule),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 404, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn delete_schedule(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<Json<wire::Schedule>, ApiError> {
    let db = state.io.db.inner();
    let was = one_view(db, &name).await?;
    let deleted = db
        .query(query::DeleteSchedule { name: name.clone() })
        .await
        .map_err(postgres)?;
    if deleted == 0 {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no schedule {name:?}"),
        ));
    }
    Ok(Json(was))
}
