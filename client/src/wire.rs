//! The API's bodies: what `pelican api` writes and this client reads, one
//! type each. With the `openapi` feature they also describe themselves to
//! the API's OpenAPI document (`GET /openapi.json`), so the document, the
//! server and the client cannot disagree on a field.

use crate::{EventKind, RunId, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

mod schedules;
pub use schedules::{Catchup, NewSchedule, Overlap, Schedule, Schedules};

mod operate;

pub use operate::{BulkCancel, BulkDone, BulkRequeue, RunCount, Stats, StatsMinute};

fn is_false(b: &bool) -> bool {
    !*b
}

pub(crate) fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// `POST /runs` with one run (its idempotency key goes in the
/// `Idempotency-Key` header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewRun {
    /// The job kind (`[a-z0-9_.-]`, 1–64 characters).
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub kind: String,
    /// The job input, any JSON (default `{}`).
    #[serde(default = "empty_object")]
    pub input: Value,
    /// Not to start before this many ms from now (Postgres's clock; at
    /// most ten years). The run waits `delayed`, holding no stream entry
    /// and no worker, and is cancellable while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Not to start before this time, in ms since the Unix epoch
    /// (Postgres's clock; a time past is no delay). With `delay_ms`, the
    /// later of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at_ms: Option<u64>,
}

/// A run to submit; an item of a `POST /runs` array.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Submit {
    /// The job kind (`[a-z0-9_.-]`, 1–64 characters).
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub kind: String,
    /// The job input (default `{}`).
    #[serde(default = "empty_object")]
    pub input: Value,
    /// The idempotency key (`None`: the client makes one; over HTTP, the
    /// item has none; 1–255 visible ASCII).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[!-~]{1,255}$"))]
    pub key: Option<String>,
    /// Not to start before this many ms from now ([`NewRun::delay_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Not to start before this time, in ms since the Unix epoch
    /// ([`NewRun::run_at_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at_ms: Option<u64>,
}

impl Submit {
    /// A run of `kind` with `input`.
    pub fn new(kind: impl Into<String>, input: Value) -> Submit {
        Submit {
            kind: kind.into(),
            input,
            key: None,
            delay_ms: None,
            run_at_ms: None,
        }
    }

    /// Not to start before `delay` from now (by Postgres's clock).
    #[must_use]
    pub fn delay(mut self, delay: std::time::Duration) -> Submit {
        self.delay_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Not to start before `at_ms`, in ms since the Unix epoch (by
    /// Postgres's clock).
    #[must_use]
    pub fn run_at_ms(mut self, at_ms: u64) -> Submit {
        self.run_at_ms = Some(at_ms);
        self
    }

    /// Its idempotency key: a second submission with the same key answers
    /// the first one's run.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Submit {
        self.key = Some(key.into());
        self
    }
}

/// The body of `POST /runs`: one run, or an array of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SubmitBody {
    /// One run; 202 [`Submitted`].
    One(NewRun),
    /// 1 to `--bulk-max` runs; 200 [`BulkSubmitted`].
    Many(Vec<Submit>),
}

// By hand, for the array's `minItems` (a derive cannot say it of an
// enum variant).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for SubmitBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Ref, SchemaType};
        // An array's items are each a `Submit`, but each is checked alone:
        // one that is not fails alone (400 or 422 in its answer), so the
        // request as a whole takes any JSON values.
        let item = ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(
                "a Submit (#/components/schemas/Submit); an item that is not one is refused alone",
            ));
        OneOfBuilder::new()
            .item(Ref::from_schema_name("NewRun"))
            .item(ArrayBuilder::new().items(item).min_items(Some(1)))
            .description(Some("One run (202), or 1 to --bulk-max runs (200)"))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl ToSchema for SubmitBody {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        for (name, schema) in [
            ("NewRun", <NewRun as utoipa::PartialSchema>::schema()),
            ("Submit", <Submit as utoipa::PartialSchema>::schema()),
        ] {
            schemas.push((name.to_owned(), schema));
        }
    }
}

/// A submission's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Submitted {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub run_id: RunId,
    /// Its status (`queued`, or `delayed`, for a new run; null when it
    /// could not be read).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub status: Option<RunStatus>,
    /// Whether its stream entry was published (a new run whose publish
    /// failed is published by the outbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// Whether the key's run existed already (an earlier submission, or an
    /// earlier send of this one).
    #[serde(default, skip_serializing_if = "is_false")]
    pub existing: bool,
}

/// One item's answer in a bulk submission: the status code a lone
/// submission of it would have had, and that submission's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct BulkItem {
    /// 202 stored, 200 the key's run existed, 400/422 refused, 504
    /// unknown.
    pub code: u16,
    /// The run, when stored or found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub run_id: Option<RunId>,
    /// A new run's status (`queued` or `delayed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub status: Option<RunStatus>,
    /// Whether a new run's entry was published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// Whether the key's run existed already.
    #[serde(default, skip_serializing_if = "is_false")]
    pub existing: bool,
    /// Why it was not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `unknown` when Postgres did not answer: the run may be stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

impl BulkItem {
    /// A stored or found run's answer.
    #[must_use]
    pub fn run(code: u16, s: Submitted) -> BulkItem {
        BulkItem {
            code,
            run_id: Some(s.run_id),
            status: s.status,
            published: s.published,
            existing: s.existing,
            error: None,
            outcome: None,
        }
    }

    /// A refusal's answer.
    #[must_use]
    pub fn refused(code: u16, error: String) -> BulkItem {
        BulkItem {
            code,
            run_id: None,
            status: None,
            published: None,
            existing: false,
            error: Some(error),
            outcome: None,
        }
    }
}

/// `POST /runs`'s 200: the key's run for one run, or the answers of an
/// array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum SubmitAnswer {
    /// One run whose key was used already: that run.
    One(Submitted),
    /// An array's answers.
    Many(BulkSubmitted),
}

/// The answer to a bulk `POST /runs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct BulkSubmitted {
    /// One answer per item, in order.
    pub runs: Vec<BulkItem>,
}

/// A run, as `GET /runs/{id}` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Run {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub run_id: RunId,
    /// Its kind.
    pub kind: String,
    /// Its input.
    pub input: Value,
    /// Where it is in its life: delayed, queued, running, retry_wait,
    /// succeeded, failed, dead, cancelled.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub status: RunStatus,
    /// Its dispatch number (a requeue makes a new dispatch).
    #[serde(default)]
    pub dispatch: u32,
    /// Attempts it may have.
    pub attempts_max: u32,
    /// When the running attempt's lease ends (ms since the epoch).
    #[serde(default)]
    pub lease_until_ms: Option<u64>,
    /// When a retry, or a delayed run, is due (ms since the epoch).
    #[serde(default)]
    pub retry_at_ms: Option<u64>,
    /// When a run submitted with a delay was due to start (ms since the
    /// epoch); kept after it starts. Null: submitted without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at_ms: Option<u64>,
    /// The stream entry of its current dispatch.
    #[serde(default)]
    pub entry_id: Option<String>,
    /// Its result, once succeeded.
    pub result: Option<Value>,
    /// Its last error.
    pub error: Option<RunError>,
    /// Its attempts, in order.
    pub attempts: Vec<Attempt>,
    /// The steps its attempts recorded (durable steps), in order.
    #[serde(default)]
    pub steps: Vec<Step>,
}

/// A recorded step of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Step {
    /// Its index in the job (0, 1, 2, ...).
    pub step: u32,
    /// Its name, as the job gave it.
    pub name: String,
    /// Its output.
    pub output: Value,
    /// The fence of the attempt that recorded it.
    pub fence: u64,
}

/// A run's last error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunError {
    /// `retryable`, `terminal`, ...
    pub class: String,
    /// What went wrong.
    pub message: String,
}

/// One attempt of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Attempt {
    /// Its number (1-based).
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
    /// The worker that claimed it.
    pub worker: String,
    /// The stream entry it was claimed from.
    pub entry_id: String,
    /// How it ended, once it did.
    pub outcome: Option<String>,
    /// When it was claimed (ms since the epoch, Postgres's clock; null
    /// for attempts from before schema version 19).
    #[serde(default)]
    pub claimed_at_ms: Option<u64>,
    /// When its outcome was written; null while it runs, or when it was
    /// fenced off (a later attempt took the run over).
    #[serde(default)]
    pub ended_at_ms: Option<u64>,
}

/// One event of a run: an SSE event's data on `GET /runs/{id}/events`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Event {
    /// Its number: 1, 2, 3, ... in the run's history.
    pub seq: u32,
    /// What happened: queued, claimed, progress, succeeded,
    /// retry_scheduled, failed, dead, cancelled, requeued.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: EventKind,
    /// The run's attempt then (0: before the first).
    pub attempt: u32,
    /// That attempt's fence.
    pub fence: u64,
    /// The worker of a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// What a progress event reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
    /// A failure's class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// A failure's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A run in a listing (`GET /runs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunSummary {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub run_id: RunId,
    /// Its kind.
    pub kind: String,
    /// Its status.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub status: RunStatus,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts it may have.
    pub attempts_max: u32,
    /// Events in its log.
    pub events: u32,
    /// When it ended (ms since the epoch).
    pub finished_at_ms: Option<u64>,
    /// Its last error.
    pub error: Option<RunError>,
}

/// A page of runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunPage {
    /// The runs, by id.
    pub runs: Vec<RunSummary>,
    /// The `cursor` of the next page; null on the last.
    pub next_cursor: Option<String>,
}

/// A dead letter: a run that died, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DeadLetter {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub run_id: RunId,
    /// The last failure's class.
    pub class: String,
    /// Its message.
    pub message: String,
    /// The stream entry it died from.
    pub source_entry: Option<String>,
    /// Whether an operator requeued it since.
    pub requeued: bool,
    /// Its attempts.
    pub attempts: Vec<DeadAttempt>,
}

/// An attempt of a dead run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DeadAttempt {
    /// Its number.
    pub attempt: u32,
    /// Its fence.
    pub fence: u64,
    /// How it ended.
    pub outcome: Option<String>,
}

/// A page of dead letters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DeadLetterPage {
    /// The dead letters, by run.
    pub dead_letters: Vec<DeadLetter>,
    /// The `cursor` of the next page; null on the last.
    pub next_cursor: Option<String>,
}

/// `POST /dead-letters/{id}/requeue`'s body (it may be empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Requeue {
    /// More attempts for the run (1–100, default 1).
    #[serde(default = "one", deserialize_with = "whole_number")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub extra_attempts: u32,
}

pub(crate) fn one() -> u32 {
    1
}

/// A `u32` from any JSON number with no fraction (`3` or `3.0`: JSON
/// Schema's integers).
pub(crate) fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    let n = serde_json::Number::deserialize(d)?;
    whole(&n)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| {
            D::Error::custom(format!("{n} is not a whole number from 0 to {}", u32::MAX))
        })
}

/// `n` if it has no fraction and is from 0 to `i64::MAX` (JSON Schema's
/// largest integer, `int64`).
pub(crate) fn whole(n: &serde_json::Number) -> Option<u64> {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a double with no fraction, checked to be in range"
    )]
    let from_double =
        |f: f64| (f.fract() == 0.0 && (0.0..=9.2e18).contains(&f)).then_some(f as u64);
    n.as_u64()
        .or_else(|| n.as_f64().and_then(from_double))
        .filter(|v| i64::try_from(*v).is_ok())
}

/// A run's new status after a cancel or a requeue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Changed {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub run_id: RunId,
    /// Its status now: `cancelled`, or `queued` after a requeue.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub status: RunStatus,
    /// A requeue's extra attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_attempts: Option<u32>,
}

/// The queue's health (`GET /queue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Queue {
    /// The job stream's key.
    pub stream: String,
    /// The consumer group.
    pub group: String,
    /// Whether the group exists (a worker or `pelican migrate` makes it).
    pub group_exists: bool,
    /// Entries in the job stream.
    pub length: u64,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// Entries not yet delivered to the group (null when Redis cannot
    /// tell).
    pub lag: Option<u64>,
    /// Deliveries pending acknowledgement.
    pub pending: u64,
    /// The oldest pending delivery's entry.
    pub oldest_pending: Option<String>,
    /// Milliseconds since it was last delivered or touched by a heartbeat.
    pub oldest_idle_ms: Option<u64>,
    /// Pending deliveries per consumer.
    pub consumers: Vec<Consumer>,
    /// Live runs by status (queued, running, retry_wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<BTreeMap<String, u64>>,
    /// Runs finished in each of the last minutes, oldest first (minutes
    /// with none included), the current minute last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Vec<Minute>>,
}

/// The runs that finished in one minute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Minute {
    /// The minute's first millisecond (since the epoch, Postgres's clock).
    pub minute_ms: u64,
    /// How many finished, by status (succeeded, failed, dead, cancelled).
    pub finished: BTreeMap<String, u64>,
}

/// A consumer's pending deliveries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Consumer {
    /// Its name (a worker's).
    pub name: String,
    /// Deliveries it holds.
    pub pending: u64,
}

/// `GET /healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Health {
    /// `ok` or `unavailable`.
    pub postgres: String,
    /// `ok` or `unavailable`.
    pub redis: String,
}

/// Every error's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorBody {
    /// What went wrong, and what to do.
    pub error: String,
    /// `unknown` when Postgres did not answer a submission in time: the run
    /// may be stored (retry with the same key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}
