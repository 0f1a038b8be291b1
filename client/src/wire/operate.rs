//! The bodies of an operator's routes: counts, bulk actions, the last
//! hour's figures.

use super::{one, whole, whole_number};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// An optional whole number from 0 to `i64::MAX`, from any JSON number with
/// no fraction (`3` or `3.0`: JSON Schema's integers), or null.
fn whole_or_null<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    whole(&n)
        .and_then(|v| T::try_from(v).ok())
        .map(Some)
        .ok_or_else(|| {
            D::Error::custom(format!("{n} is not a whole number from 0 to {}", i64::MAX))
        })
}

/// How many runs pass a filter (`GET /runs/count`): what a bulk action
/// would take, to confirm before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunCount {
    /// By status (statuses with none left out).
    pub by_status: BTreeMap<String, u64>,
    /// In all.
    pub total: u64,
}

/// `POST /runs/cancel`'s body: which runs to cancel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkCancel {
    /// Runs of this live status: `queued`, `retry_wait` or `running`
    /// (named, so that no empty body cancels every queued run).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^(queued|retry_wait|running)$")
    )]
    pub status: String,
    /// Runs of this kind only (default: any).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub kind: Option<String>,
    /// At most this many runs (1–100,000, default 10,000).
    #[serde(default, deserialize_with = "whole_or_null")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub limit: Option<usize>,
    /// The `next_cursor` of the request before: go on after its runs.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = r"^((run-)?[0-9]{1,19})?$"))]
    pub cursor: Option<String>,
}

/// `POST /dead-letters/requeue`'s body: which dead runs to run again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkRequeue {
    /// Dead runs of this kind.
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-z0-9_.-]{1,64}$"))]
    pub kind: String,
    /// Only runs that died at or after this instant (ms since the epoch).
    #[serde(default, deserialize_with = "whole_or_null")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub ended_from_ms: Option<u64>,
    /// Only runs that died before this instant.
    #[serde(default, deserialize_with = "whole_or_null")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub ended_to_ms: Option<u64>,
    /// More attempts for each (1–100, default 1).
    #[serde(default = "one", deserialize_with = "whole_number")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub extra_attempts: u32,
    /// At most this many runs (1–100,000, default 10,000).
    #[serde(default, deserialize_with = "whole_or_null")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub limit: Option<usize>,
    /// The `next_cursor` of the request before: go on after its runs.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = r"^((run-)?[0-9]{1,19})?$"))]
    pub cursor: Option<String>,
}

/// What a bulk action did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct BulkDone {
    /// Runs it changed.
    pub changed: u64,
    /// Runs it found that had moved on before their turn (ended, or
    /// requeued by someone else): left as they are.
    pub skipped: u64,
    /// Set when it stopped at its limit with more runs matching: send it
    /// again with this `cursor` for the rest (runs by id, so a run that
    /// matches again later, as a requeued run that dies again, is not
    /// taken twice).
    pub next_cursor: Option<String>,
}

/// Throughput and latency by minute (`GET /stats`), oldest first, the
/// current minute last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Stats {
    /// One per minute, minutes with no run included.
    pub minutes: Vec<StatsMinute>,
}

/// One minute of [`Stats`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StatsMinute {
    /// The minute's first millisecond (since the epoch, Postgres's clock).
    pub minute_ms: u64,
    /// How many finished, by status.
    pub finished: BTreeMap<String, u64>,
    /// The median time from publication to success of the runs that
    /// succeeded in it, in ms (null: none did).
    pub p50_ms: Option<u64>,
    /// Its 99th percentile.
    pub p99_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_whole_numbers_of_json_schemas_int64() {
        let read = |body: &str| serde_json::from_str::<BulkCancel>(body).map(|b| b.limit);
        assert_eq!(read(r#"{"status":"queued","limit":3}"#).unwrap(), Some(3));
        assert_eq!(read(r#"{"status":"queued","limit":3.0}"#).unwrap(), Some(3));
        assert_eq!(read(r#"{"status":"queued","limit":null}"#).unwrap(), None);
        assert_eq!(read(r#"{"status":"queued"}"#).unwrap(), None);
        for bad in ["2.5", "-1", "9223372036854775808", "\"7\""] {
            let body = format!(r#"{{"status":"queued","limit":{bad}}}"#);
            assert!(read(&body).is_err(), "limit {bad}");
        }
        assert!(read("{}").is_err(), "a status is named");
    }
}
