//! The snapshot's reads ([`PgDb::snapshot`](super::PgDb::snapshot)):
//! every table, into the model's [`Db`](pelican_model::Db).

use super::{PgError, rows};
use pelican_model::db::sql::snapshot;
use sqlx::Row;

/// The runs, their attempts and dead letters, the submission keys and the
/// deployment's settings, into `db`.
pub(super) async fn read_records(
    tx: &mut sqlx::PgConnection,
    db: &mut pelican_model::Db,
) -> Result<(), PgError> {
    let runs = sqlx::query(snapshot::RUNS).fetch_all(&mut *tx).await?;
    for r in &runs {
        let row = rows::run_row(r)?;
        // A tick's run id is its schedule's and tick's, not the sequence's.
        if pelican_model::schedule::tick_of(row.run_id).is_none() {
            db.run_ids = db.run_ids.max(row.run_id.0);
        }
        db.runs.insert(row.run_id, row);
    }
    for r in &sqlx::query(snapshot::ATTEMPTS).fetch_all(&mut *tx).await? {
        let run = rows::run_id(r)?;
        let (n, a) = rows::attempt_row(r)?;
        db.attempts.insert((run, n), a);
    }
    for r in &sqlx::query(snapshot::DEAD_LETTERS)
        .fetch_all(&mut *tx)
        .await?
    {
        let (run, d) = rows::dead_letter(r)?;
        db.dead_letters.insert(run, d);
    }
    for r in &sqlx::query(snapshot::SUBMIT_KEYS)
        .fetch_all(&mut *tx)
        .await?
    {
        let key = pelican_model::db::SubmitKey {
            run: rows::run_id(r)?,
            request: r.try_get("request")?,
            created_at: pelican_model::time::Timestamp(rows::unsigned(
                "created_at",
                r.try_get("created_at")?,
            )?),
        };
        db.keys.insert(r.try_get("key")?, key);
    }
    if let Some(r) = sqlx::query(snapshot::PARTITIONS)
        .fetch_optional(&mut *tx)
        .await?
    {
        let n: i64 = r.try_get("value")?;
        db.partitions =
            Some(u32::try_from(n).map_err(|_| rows::corrupt("partitions", n.to_string()))?);
    }
    Ok(())
}

/// The worker registry, the steps, the run events, the providers' slots
/// and rates and the tool service's ledger, into `db`.
pub(super) async fn read_workers_and_limits(
    tx: &mut sqlx::PgConnection,
    db: &mut pelican_model::Db,
) -> Result<(), PgError> {
    for r in &sqlx::query(snapshot::WORKERS).fetch_all(&mut *tx).await? {
        let id: i32 = r.try_get("worker_id")?;
        let pid: i32 = r.try_get("pid")?;
        let at: i64 = r.try_get("started_at")?;
        db.workers.insert(
            u32::try_from(id).map_err(|_| rows::corrupt("worker_id", id.to_string()))?,
            (
                r.try_get("host")?,
                u32::try_from(pid).map_err(|_| rows::corrupt("pid", pid.to_string()))?,
                pelican_model::time::Timestamp(rows::unsigned("started_at", at)?),
            ),
        );
    }
    for r in &sqlx::query(snapshot::STEPS).fetch_all(&mut *tx).await? {
        let (step, row) = rows::step_row(r)?;
        db.steps.insert((rows::run_id(r)?, step), row);
    }
    for r in &sqlx::query(snapshot::RUN_EVENTS)
        .fetch_all(&mut *tx)
        .await?
    {
        let e = rows::event(r)?;
        db.events.insert((rows::run_id(r)?, e.seq), e);
    }
    for r in &sqlx::query(snapshot::PROVIDER_SLOTS)
        .fetch_all(&mut *tx)
        .await?
    {
        let slot: i32 = r.try_get("slot")?;
        let until: i64 = r.try_get("until_ms")?;
        db.slots.insert(
            (
                r.try_get("provider")?,
                u32::try_from(slot).map_err(|_| rows::corrupt("slot", slot.to_string()))?,
            ),
            (
                r.try_get("holder")?,
                pelican_model::time::Timestamp(rows::unsigned("until_ms", until)?),
            ),
        );
    }
    for r in &sqlx::query(snapshot::PROVIDER_RATES)
        .fetch_all(&mut *tx)
        .await?
    {
        let tat: i64 = r.try_get("tat_ns")?;
        db.rates
            .insert(r.try_get("provider")?, rows::unsigned("tat_ns", tat)?);
    }
    for r in &sqlx::query(snapshot::SCHEDULES).fetch_all(&mut *tx).await? {
        let (_, s) = rows::schedule_row(r)?;
        db.schedules.insert(s.name.clone(), s);
    }
    let ids = sqlx::query(snapshot::SCHEDULE_IDS)
        .fetch_one(&mut *tx)
        .await?;
    db.schedule_ids = rows::unsigned("schedule_ids", ids.try_get("value")?)?;
    for r in &sqlx::query(snapshot::EFFECTS).fetch_all(&mut *tx).await? {
        let n: i64 = r.try_get("requests")?;
        db.effects
            .insert(r.try_get("key")?, rows::unsigned("requests", n)?);
    }
    Ok(())
}
