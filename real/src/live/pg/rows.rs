//! Rows as the model holds them: one decoder per answer [`Shape`], and the
//! checks that a stored value is one the model can represent.

use super::PgError;
use pelican_model::db::{
    AttemptRow, Candidate, Claimed, ClaimedJob, DbReply, DeadLetter, MinuteLatency, RunRow, Shape,
    StepRow,
};
use pelican_model::events::{EventKind, RunEvent};
use pelican_model::ids::{AttemptNo, Dispatch, EntryId, Fence, RunId, WorkerId};
use pelican_model::schedule::{Catchup, Overlap, ScheduleRow};
use pelican_model::status::{AttemptOutcome, ErrorClass, RunStatus};
use pelican_model::time::Timestamp;
use sqlx::Row;
use sqlx::postgres::PgRow;

pub(super) fn corrupt(column: &'static str, value: impl ToString) -> PgError {
    PgError::Corrupt {
        column,
        value: value.to_string(),
    }
}

pub(super) fn unsigned(column: &'static str, v: i64) -> Result<u64, PgError> {
    u64::try_from(v).map_err(|_| corrupt(column, v))
}

fn unsigned32(column: &'static str, v: i32) -> Result<u32, PgError> {
    u32::try_from(v).map_err(|_| corrupt(column, v))
}

fn time(column: &'static str, v: Option<i64>) -> Result<Option<Timestamp>, PgError> {
    v.map(|v| unsigned(column, v).map(Timestamp)).transpose()
}

fn entry(column: &'static str, v: Option<String>) -> Result<Option<EntryId>, PgError> {
    v.map(|s| s.parse::<EntryId>().map_err(|_| corrupt(column, s)))
        .transpose()
}

fn class(column: &'static str, s: &str) -> Result<ErrorClass, PgError> {
    ErrorClass::parse(s).ok_or_else(|| corrupt(column, s))
}

fn status(s: &str) -> Result<RunStatus, PgError> {
    RunStatus::parse(s).ok_or_else(|| corrupt("status", s))
}

fn outcome(v: Option<String>) -> Result<Option<AttemptOutcome>, PgError> {
    v.map(|s| match s.as_str() {
        "succeeded" => Ok(AttemptOutcome::Succeeded),
        other => class("outcome", other).map(AttemptOutcome::Failed),
    })
    .transpose()
}

/// The `run_id` column of an answer row: which command of a batch it
/// answers.
pub(super) fn run_id(r: &PgRow) -> Result<RunId, PgError> {
    Ok(RunId(unsigned("run_id", r.try_get("run_id")?)?))
}

/// A `runs` row.
pub(super) fn run_row(r: &PgRow) -> Result<RunRow, PgError> {
    let error_class: Option<String> = r.try_get("error_class")?;
    let error_message: Option<String> = r.try_get("error_message")?;
    Ok(RunRow {
        run_id: run_id(r)?,
        kind: r.try_get("kind")?,
        input: r.try_get("input")?,
        status: status(r.try_get("status")?)?,
        dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
        active_fence: Fence(unsigned("active_fence", r.try_get("active_fence")?)?),
        attempts: unsigned32("attempts", r.try_get("attempts")?)?,
        attempts_max: unsigned32("attempts_max", r.try_get("attempts_max")?)?,
        lease_until: time("lease_until", r.try_get("lease_until")?)?,
        retry_at: time("retry_at", r.try_get("retry_at")?)?,
        published_at: time("published_at", r.try_get("published_at")?)?,
        finished_at: time("finished_at", r.try_get("finished_at")?)?,
        entry_id: entry("entry_id", r.try_get("entry_id")?)?,
        result: r.try_get("result")?,
        error: match error_class {
            Some(c) => Some((class("error_class", &c)?, error_message.unwrap_or_default())),
            None => None,
        },
        unknown_failures: unsigned32("unknown_failures", r.try_get("unknown_failures")?)?,
        deadline: time("deadline_ms", r.try_get("deadline_ms")?)?,
        events: unsigned32("events", r.try_get("events")?)?,
        trace: r.try_get("trace_parent")?,
        due_at: time("due_at", r.try_get("due_at")?)?,
    })
}

fn candidate(r: &PgRow) -> Result<Candidate, PgError> {
    Ok(Candidate {
        run_id: run_id(r)?,
        dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
        entry_id: entry("entry_id", r.try_get("entry_id")?)?,
        published_at: time("published_at", r.try_get("published_at")?)?,
    })
}

/// An `attempts` row, by number.
pub(super) fn attempt_row(r: &PgRow) -> Result<(AttemptNo, AttemptRow), PgError> {
    let entry_id: String = r.try_get("entry_id")?;
    Ok((
        AttemptNo(unsigned32("attempt", r.try_get("attempt")?)?),
        AttemptRow {
            fence: Fence(unsigned("fence", r.try_get("fence")?)?),
            worker: r.try_get("worker")?,
            entry_id: entry_id
                .parse::<EntryId>()
                .map_err(|_| corrupt("entry_id", entry_id))?,
            dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
            outcome: outcome(r.try_get("outcome")?)?,
            claimed_seq: seq("claimed_seq", r.try_get("claimed_seq")?)?,
            claimed_at: time("claimed_at", r.try_get("claimed_at")?)?,
            ended_at: time("ended_at", r.try_get("ended_at")?)?,
        },
    ))
}

fn seq(column: &'static str, v: Option<i32>) -> Result<Option<u32>, PgError> {
    v.map(|v| unsigned32(column, v)).transpose()
}

/// One event of a run's log.
pub(super) fn event(r: &PgRow) -> Result<RunEvent, PgError> {
    let kind: String = r.try_get("kind")?;
    let class_text: Option<String> = r.try_get("class")?;
    Ok(RunEvent {
        seq: unsigned32("seq", r.try_get("seq")?)?,
        kind: EventKind::parse(&kind).ok_or_else(|| corrupt("kind", kind))?,
        attempt: AttemptNo(unsigned32("attempt", r.try_get("attempt")?)?),
        fence: Fence(unsigned("fence", r.try_get("fence")?)?),
        class: class_text.map(|c| class("class", &c)).transpose()?,
        data: r.try_get("data")?,
    })
}

/// A `steps` row, by index.
pub(super) fn step_row(r: &PgRow) -> Result<(u32, StepRow), PgError> {
    Ok((
        unsigned32("step", r.try_get("step")?)?,
        StepRow {
            name: r.try_get("name")?,
            output: r.try_get("output")?,
            fence: Fence(unsigned("fence", r.try_get("fence")?)?),
        },
    ))
}

/// A `dead_letters` row, by run.
pub(super) fn dead_letter(r: &PgRow) -> Result<(RunId, DeadLetter), PgError> {
    let attempts: sqlx::types::Json<Vec<(u32, u64, Option<String>)>> = r.try_get("attempts")?;
    let class_text: String = r.try_get("class")?;
    Ok((
        run_id(r)?,
        DeadLetter {
            source_entry: entry("source_entry", r.try_get("source_entry")?)?,
            class: class("class", &class_text)?,
            message: r.try_get("message")?,
            attempts: attempts
                .0
                .into_iter()
                .map(|(n, f, o)| Ok((AttemptNo(n), Fence(f), outcome(o)?)))
                .collect::<Result<_, PgError>>()?,
            requeued: r.try_get("requeued")?,
        },
    ))
}

/// A claim's answer row: the new fence, the attempt, and what to run.
fn claimed_job(r: &PgRow) -> Result<ClaimedJob, PgError> {
    Ok(ClaimedJob {
        claimed: Claimed {
            fence: Fence(unsigned("active_fence", r.try_get("active_fence")?)?),
            attempt: AttemptNo(unsigned32("attempts", r.try_get("attempts")?)?),
            attempts_max: unsigned32("attempts_max", r.try_get("attempts_max")?)?,
            unknown_failures: unsigned32("unknown_failures", r.try_get("unknown_failures")?)?,
            budget_left_ms: r.try_get("budget_left_ms")?,
        },
        kind: r.try_get("kind")?,
        input: r.try_get("input")?,
        trace: r.try_get("trace_parent")?,
    })
}

/// A minute's succeeded runs and their latency.
fn minute_latency(r: &PgRow) -> Result<MinuteLatency, PgError> {
    let get = |name: &'static str| -> Result<u64, PgError> { unsigned(name, r.try_get(name)?) };
    Ok(MinuteLatency {
        minute: Timestamp(get("minute")?),
        runs: get("n")?,
        p50_ms: get("p50")?,
        p99_ms: get("p99")?,
    })
}

/// A `schedules` row with Postgres's clock (`now`), as the statements
/// that answer schedules read it.
pub(super) fn schedule_row(r: &PgRow) -> Result<(Timestamp, ScheduleRow), PgError> {
    let time = |c: &'static str| -> Result<Timestamp, PgError> {
        Ok(Timestamp(unsigned(c, r.try_get(c)?)?))
    };
    let count = |c: &'static str| -> Result<u64, PgError> { unsigned(c, r.try_get(c)?) };
    let overlap: String = r.try_get("overlap")?;
    let catchup: String = r.try_get("catchup")?;
    let last_run: Option<i64> = r.try_get("last_run")?;
    let row = ScheduleRow {
        name: r.try_get("name")?,
        id: count("id")?,
        kind: r.try_get("kind")?,
        input: r.try_get("input")?,
        cron: r.try_get("cron")?,
        tz: r.try_get("tz")?,
        overlap: Overlap::parse(&overlap).map_err(|_| corrupt("overlap", overlap))?,
        catchup: Catchup::parse(&catchup).map_err(|_| corrupt("catchup", catchup))?,
        next_tick: time("next_tick")?,
        last_tick: time("last_tick")?,
        last_run: last_run
            .map(|v| unsigned("last_run", v).map(RunId))
            .transpose()?,
        fired: count("fired")?,
        skipped: count("skipped")?,
    };
    Ok((time("now")?, row))
}

fn all<T>(rows: &[PgRow], f: fn(&PgRow) -> Result<T, PgError>) -> Result<Vec<T>, PgError> {
    rows.iter().map(f).collect()
}

/// The answer of one statement of `shape`: `rows` returned, or
/// `affected` rows for [`Shape::Rows`].
pub(super) fn reply(shape: Shape, rows: &[PgRow], affected: u64) -> Result<DbReply, PgError> {
    let one = rows.first();
    Ok(match shape {
        Shape::Rows => DbReply::Rows(affected),
        Shape::Value => {
            let row = one.ok_or_else(|| corrupt("value", "no row"))?;
            DbReply::Rows(unsigned("value", row.try_get("value")?)?)
        }
        Shape::Applied => {
            let row = one.ok_or_else(|| corrupt("applied", "no row"))?;
            DbReply::Rows(u64::from(row.try_get::<bool, _>("applied")?))
        }
        Shape::Claimed => DbReply::Claimed(one.map(claimed_job).transpose()?),
        Shape::Run => DbReply::Run(one.map(run_row).transpose()?),
        Shape::Candidates => DbReply::Candidates(all(rows, candidate)?),
        Shape::NewRun => {
            let row = one.ok_or_else(|| corrupt("nextval", "no row"))?;
            DbReply::NewRun(RunId(unsigned("run_id", row.try_get(0)?)?))
        }
        Shape::NewRuns => DbReply::NewRuns(all(rows, run_id)?),
        Shape::NewWorker => {
            let row = one.ok_or_else(|| corrupt("worker_id", "no row"))?;
            let id: i32 = row.try_get("worker_id")?;
            DbReply::NewWorker(WorkerId(
                u32::try_from(id).map_err(|_| corrupt("worker_id", id.to_string()))?,
            ))
        }
        Shape::Keyed => {
            let row = one.ok_or_else(|| corrupt("submit_keys", "no row"))?;
            DbReply::Keyed {
                run: run_id(row)?,
                same: row.try_get("same")?,
            }
        }
        Shape::Attempts => DbReply::Attempts(all(rows, attempt_row)?),
        Shape::DeadLetters => DbReply::DeadLetters(all(rows, dead_letter)?),
        Shape::Steps => DbReply::Steps(all(rows, step_row)?),
        Shape::Events => DbReply::Events(all(rows, event)?),
        Shape::Runs => DbReply::Runs(all(rows, run_row)?),
        Shape::PerMinute => DbReply::PerMinute(
            rows.iter()
                .map(|r| {
                    let minute: i64 = r.try_get("minute")?;
                    let n: i64 = r.try_get("n")?;
                    Ok((
                        Timestamp(unsigned("minute", minute)?),
                        status(r.try_get("status")?)?,
                        unsigned("count", n)?,
                    ))
                })
                .collect::<Result<_, PgError>>()?,
        ),
        Shape::Latency => DbReply::Latency(all(rows, minute_latency)?),
        Shape::Schedules => DbReply::Schedules(all(rows, schedule_row)?),
        Shape::Counts => DbReply::Counts(
            rows.iter()
                .map(|r| {
                    let n: i64 = r.try_get("n")?;
                    Ok((status(r.try_get("status")?)?, unsigned("count", n)?))
                })
                .collect::<Result<_, PgError>>()?,
        ),
    })
}

/// The answer to one command of a batched form, from the answer row that
/// carries its run (none: the command did not take, or found no row).
pub(super) fn reply_of(shape: Shape, row: Option<&PgRow>) -> Result<DbReply, PgError> {
    Ok(match shape {
        Shape::Rows => DbReply::Rows(u64::from(row.is_some())),
        Shape::Claimed => DbReply::Claimed(row.map(claimed_job).transpose()?),
        Shape::Run => DbReply::Run(row.map(run_row).transpose()?),
        // The batched keyed insert: the row of the command's run names the
        // key's run.
        Shape::Keyed => {
            let row = row.ok_or_else(|| corrupt("submit_keys", "no row"))?;
            DbReply::Keyed {
                run: RunId(unsigned("key_run", row.try_get("key_run")?)?),
                same: row.try_get("same")?,
            }
        }
        other => unreachable!("no batched form answers {other:?}"),
    })
}
