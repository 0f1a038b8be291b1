//! Redis's answers read into the model's values, and the job entries'
//! fields both ways.

use super::*;

/// How a pipelined command's answer reads.
pub(super) type Parse = fn(Value) -> Result<StreamReply, StreamError>;

/// Sorts a command's result: an answer, a protocol error, or no answer.
pub(super) fn answer(
    r: redis::RedisResult<Value>,
) -> Result<Result<Value, StreamError>, Unavailable> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => match e.code() {
            Some("NOGROUP") => Ok(Err(StreamError::NoGroup)),
            Some("BUSYGROUP") => Ok(Err(StreamError::BusyGroup)),
            // XINFO on a key Redis lost (a wipe, before the group is made
            // again): an answer, not an outage.
            Some("ERR") if e.detail().is_some_and(|d| d.contains("no such key")) => {
                Ok(Err(StreamError::NoKey))
            }
            _ => Err(Unavailable),
        },
    }
}

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

pub(super) fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => text(other)?.parse().ok(),
    }
}

pub(super) fn acked(v: Value) -> StreamReply {
    StreamReply::Acked(int(&v).unwrap_or(0))
}

pub(super) fn added(v: Value) -> Result<StreamReply, StreamError> {
    let id = text(&v)
        .and_then(|s| s.parse::<EntryId>().ok())
        .unwrap_or(EntryId::ZERO);
    Ok(StreamReply::Added(id))
}

/// A flat `[k1, v1, k2, v2, ...]` array or a map, as `(key, value)` texts.
pub(super) fn fields(v: &Value) -> Option<Vec<(String, String)>> {
    match v {
        Value::Array(items) => Some(
            items
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some((text(k)?, text(v).unwrap_or_default())),
                    _ => None,
                })
                .collect(),
        ),
        Value::Map(pairs) => Some(
            pairs
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, text(v).unwrap_or_default())))
                .collect(),
        ),
        _ => None,
    }
}

pub(crate) fn field(fields: &[(String, String)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// The fields of a job entry.
#[must_use]
pub fn encode_job(entry: &JobEntry) -> Vec<(&'static str, String)> {
    match entry {
        JobEntry::Job { run, dispatch } => {
            vec![
                ("run_id", run.0.to_string()),
                ("dispatch", dispatch.0.to_string()),
            ]
        }
        // Only tests write malformed entries on purpose; this keeps the
        // twin total.
        JobEntry::Malformed { reason } => vec![("malformed", reason.clone())],
    }
}

/// Decodes a job entry's fields (S10: anything but exactly `run_id` and
/// `dispatch`, both numbers, is malformed, with the reason).
#[must_use]
pub fn decode_job(fields: &[(String, String)]) -> JobEntry {
    let malformed = |reason: String| JobEntry::Malformed { reason };
    if let Some((k, _)) = fields
        .iter()
        .find(|(k, _)| k != "run_id" && k != "dispatch")
    {
        return malformed(format!("unexpected field {k:?}"));
    }
    let Some(run) = field(fields, "run_id") else {
        return malformed("missing field run_id".into());
    };
    let Some(dispatch) = field(fields, "dispatch") else {
        return malformed("missing field dispatch".into());
    };
    let Ok(run) = run.parse::<u64>() else {
        return malformed(format!("run_id {run:?} is not a number"));
    };
    match dispatch.parse::<u32>() {
        Ok(d) if d > 0 => JobEntry::Job {
            run: RunId(run),
            dispatch: Dispatch(d),
        },
        _ => malformed(format!("dispatch {dispatch:?} is not a positive number")),
    }
}

pub(super) fn encode_dead(entry: &DeadEntry) -> Vec<(&'static str, String)> {
    match entry {
        DeadEntry::Run { run, source, class } => vec![
            ("kind", "run".into()),
            ("run_id", run.0.to_string()),
            ("source", source.to_string()),
            ("class", class.as_str().into()),
        ],
        DeadEntry::Quarantined { source, reason } => vec![
            ("kind", "quarantined".into()),
            ("source", source.to_string()),
            ("reason", reason.clone()),
        ],
    }
}

/// `[id, [k, v, ...]]` → (id, decoded entry).
pub(super) fn decode_entry(v: &Value) -> (EntryId, JobEntry) {
    let Value::Array(parts) = v else {
        return (
            EntryId::ZERO,
            JobEntry::Malformed {
                reason: "not an entry".into(),
            },
        );
    };
    let id = match parts.first() {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        other => other.and_then(text).and_then(|s| s.parse().ok()),
    };
    let job = match parts.get(1) {
        Some(f) => well_formed_job(f).unwrap_or_else(|| decode_fields(f)),
        None => entry_without_fields(),
    };
    (id.unwrap_or(EntryId::ZERO), job)
}

fn entry_without_fields() -> JobEntry {
    JobEntry::Malformed {
        reason: "entry without fields".into(),
    }
}

/// An entry's fields decoded by [`decode_job`], the definition.
fn decode_fields(v: &Value) -> JobEntry {
    fields(v).map_or_else(entry_without_fields, |f| decode_job(&f))
}

/// The entry every publication writes, `[run_id, R, dispatch, D]` (either
/// order) with both numbers valid, read without copying its texts; `None`
/// for anything else, which [`decode_fields`] decodes. Where it answers, it
/// answers as [`decode_job`] does (the tests hold it to that).
fn well_formed_job(v: &Value) -> Option<JobEntry> {
    let Value::Array(items) = v else {
        return None;
    };
    let [k1, v1, k2, v2] = items.as_slice() else {
        return None;
    };
    fn bytes(v: &Value) -> Option<&str> {
        match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
    let (run, dispatch) = match (bytes(k1)?, bytes(k2)?) {
        ("run_id", "dispatch") => (bytes(v1)?, bytes(v2)?),
        ("dispatch", "run_id") => (bytes(v2)?, bytes(v1)?),
        _ => return None,
    };
    let run = run.parse::<u64>().ok()?;
    let dispatch = dispatch.parse::<u32>().ok().filter(|d| *d > 0)?;
    Some(JobEntry::Job {
        run: RunId(run),
        dispatch: Dispatch(dispatch),
    })
}

/// XREADGROUP's reply: nil (nothing within BLOCK) or `[[stream, [entry...]]]`
/// (RESP2) / `{stream: [entry...]}` (RESP3).
pub(super) fn read_reply(v: Value) -> StreamReply {
    StreamReply::Entries(read_entries(v))
}

/// The entries of an `XREADGROUP` answer (RESP2 or RESP3), decoded.
#[must_use]
pub fn read_entries(v: Value) -> Vec<(EntryId, JobEntry)> {
    let entries = match v {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => kv.pop(),
                _ => None,
            })
            .collect::<Vec<_>>(),
        Value::Map(pairs) => pairs.into_iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    entries
        .iter()
        .filter_map(|e| match e {
            Value::Array(items) => Some(items.iter().map(decode_entry).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The ID of a row of XPENDING's extended form, `[id, consumer, idle,
/// deliveries]`.
pub(super) fn first_pending_id(row: &Value) -> Option<EntryId> {
    match row {
        Value::Array(fields) => fields.first().and_then(text)?.parse().ok(),
        _ => None,
    }
}

/// XAUTOCLAIM's reply: `[next, [entry...], [deleted id...]]`.
pub(super) fn autoclaim_reply(v: Value) -> StreamReply {
    let Value::Array(parts) = v else {
        return StreamReply::AutoClaimed(AutoClaim::scan_over());
    };
    let next = parts
        .first()
        .and_then(text)
        .and_then(|s| s.parse::<EntryId>().ok())
        .unwrap_or(EntryId::ZERO);
    let claimed = match parts.get(1) {
        Some(Value::Array(items)) => items
            .iter()
            .filter(|e| !matches!(e, Value::Nil))
            .map(|e| {
                let (id, job) = decode_entry(e);
                (id, Some(job))
            })
            .collect(),
        _ => Vec::new(),
    };
    let deleted = match parts.get(2) {
        Some(Value::Array(ids)) => ids
            .iter()
            .filter_map(text)
            .filter_map(|s| s.parse::<EntryId>().ok())
            .collect(),
        _ => Vec::new(),
    };
    StreamReply::AutoClaimed(AutoClaim {
        next,
        claimed,
        deleted,
    })
}

/// XPENDING's summary form: how many entries are pending, and how many
/// each consumer holds.
pub(super) fn pending_summary(summary: &Result<Value, StreamError>) -> (u64, Vec<(String, u64)>) {
    let Ok(Value::Array(parts)) = summary else {
        return (0, Vec::new());
    };
    let pending = parts.first().and_then(int).unwrap_or(0);
    let consumers = match parts.get(3) {
        Some(Value::Array(rows)) => rows
            .iter()
            .filter_map(|row| match row {
                Value::Array(pair) => {
                    Some((text(pair.first()?)?, pair.get(1).and_then(int).unwrap_or(0)))
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    (pending, consumers)
}

/// The first row of XPENDING's extended form: the oldest pending ID and
/// its idle time, if any is pending.
pub(super) fn oldest_pending(
    rows: &Result<Value, StreamError>,
) -> Option<(Option<EntryId>, Option<u64>)> {
    match rows {
        Ok(Value::Array(rows)) => match rows.first() {
            Some(Value::Array(row)) => Some((
                row.first()
                    .and_then(text)
                    .and_then(|s| s.parse::<EntryId>().ok()),
                row.get(2).and_then(int),
            )),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// `[id, [k, v, ...]]` of bulk strings, as Redis answers an entry.
    fn entry(id: &str, pairs: &[(&str, &str)]) -> Value {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let fields = pairs.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]);
        Value::Array(vec![bulk(id), Value::Array(fields.collect())])
    }

    #[test]
    fn an_entry_decodes_as_its_fields_do() {
        let cases: &[&[(&str, &str)]] = &[
            &[("run_id", "42"), ("dispatch", "3")],
            &[("dispatch", "3"), ("run_id", "42")],
            &[("run_id", "+42"), ("dispatch", "3")],
            &[("run_id", "42"), ("dispatch", "0")],
            &[("run_id", "42"), ("dispatch", "4294967296")],
            &[("run_id", "-1"), ("dispatch", "3")],
            &[("run_id", "42"), ("run_id", "43")],
            &[("run_id", "42"), ("dispatch", "3"), ("x", "y")],
            &[("run_id", "42"), ("x", "3")],
            &[("run_id", "42")],
            &[],
        ];
        for pairs in cases {
            let (id, job) = decode_entry(&entry("17-2", pairs));
            assert_eq!(id, EntryId::new(17, 2));
            assert_eq!(job, decode_job(&f(pairs)), "{pairs:?}");
        }
        let (id, job) = decode_entry(&entry("x", &[("run_id", "1"), ("dispatch", "1")]));
        assert_eq!(id, EntryId::ZERO, "an unreadable id");
        assert!(matches!(job, JobEntry::Job { .. }));
        let bare = Value::Array(vec![Value::BulkString(b"1-0".to_vec())]);
        assert!(matches!(decode_entry(&bare).1, JobEntry::Malformed { .. }));
    }

    #[test]
    fn job_entries_round_trip() {
        let job = JobEntry::Job {
            run: RunId(42),
            dispatch: Dispatch(3),
        };
        let fields: Vec<(String, String)> = encode_job(&job)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(decode_job(&fields), job);
    }

    #[test]
    fn malformed_entries_say_why() {
        let reason = |pairs: &[(&str, &str)]| match decode_job(&f(pairs)) {
            JobEntry::Malformed { reason } => reason,
            other => panic!("decoded {other:?}"),
        };
        assert_eq!(reason(&[("dispatch", "1")]), "missing field run_id");
        assert_eq!(reason(&[("run_id", "7")]), "missing field dispatch");
        assert!(reason(&[("run_id", "x"), ("dispatch", "1")]).contains("not a number"));
        assert!(reason(&[("run_id", "7"), ("dispatch", "0")]).contains("positive"));
        assert!(reason(&[("run_id", "7"), ("dispatch", "1"), ("x", "y")]).contains("unexpected"));
        assert!(reason(&[]).contains("missing"));
    }
}
