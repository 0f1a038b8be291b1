//! The bodies of `/schedules`: cron schedules, each tick of which makes
//! one run (S16).

use crate::RunId;
pub use pelican_model::schedule::{Catchup, Overlap};
use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// `POST /schedules`: makes a schedule, or replaces what the schedule of
/// that name runs and when (it keeps its history and tick run ids).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSchedule {
    /// Its name (`[a-z0-9_.-]`, 1–64 characters).
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub name: String,
    /// The kind of its runs (`[a-z0-9_.-]`, 1–64 characters).
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub kind: String,
    /// The input of its runs, any JSON (default `{}`).
    #[serde(default = "super::empty_object")]
    pub input: Value,
    /// A cron expression: five fields (minute hour day month weekday), or
    /// six with seconds first.
    pub cron: String,
    /// The IANA time zone it is read in (default `UTC`).
    #[serde(default = "utc")]
    pub tz: String,
    /// While the previous run is live, a tick makes no run (`skip`, the
    /// default), queues one beside it (`queue`), or cancels it and makes
    /// its own (`cancel`).
    #[serde(default = "skip")]
    #[cfg_attr(feature = "openapi", schema(schema_with = overlap_schema))]
    pub overlap: Overlap,
    /// Ticks missed while no scheduler ran (more than the workers'
    /// `--catchup-after-ms` late) make no run (`skip`), or the first of
    /// them makes one for all (`one`, the default).
    #[serde(default = "one")]
    #[cfg_attr(feature = "openapi", schema(schema_with = catchup_schema))]
    pub catchup: Catchup,
}

fn utc() -> String {
    "UTC".into()
}

fn skip() -> Overlap {
    Overlap::Skip
}

fn one() -> Catchup {
    Catchup::One
}

#[cfg(feature = "openapi")]
fn names_schema(names: &[&str], default: &str) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(names.iter().copied()))
        .default(Some(Value::from(default)))
        .build()
}

#[cfg(feature = "openapi")]
fn overlap_schema() -> utoipa::openapi::schema::Object {
    let names: Vec<&str> = Overlap::ALL.iter().map(|o| o.as_str()).collect();
    names_schema(&names, skip().as_str())
}

#[cfg(feature = "openapi")]
fn catchup_schema() -> utoipa::openapi::schema::Object {
    let names: Vec<&str> = Catchup::ALL.iter().map(|c| c.as_str()).collect();
    names_schema(&names, one().as_str())
}

/// A schedule as `GET /schedules` and `pelican schedule list` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Schedule {
    /// What it was made with.
    #[serde(flatten)]
    pub spec: NewSchedule,
    /// Its number, carried by its ticks' run ids.
    pub id: u64,
    /// Its next ticks, in ms since the Unix epoch: the first is the next
    /// one nobody has handled yet (empty: none left).
    pub next_ticks_ms: Vec<u64>,
    /// How late its next tick is, in ms, by Postgres's clock (0: not due).
    pub lag_ms: u64,
    /// The last tick handled, in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tick_ms: Option<u64>,
    /// The run of the last tick that made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub last_run: Option<RunId>,
    /// Ticks that made a run.
    pub fired: u64,
    /// Ticks that made none (overlap `skip`, or missed under catch-up
    /// `skip`).
    pub skipped: u64,
}

/// `GET /schedules`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Schedules {
    /// Every schedule, by name.
    pub schedules: Vec<Schedule>,
}
