//! `POST /runs`: one run or an array of them, with their idempotency
//! keys, and the keys' expiry.

use super::*;
use crate::telemetry::{RunTrace, TRACEPARENT, TraceParent};
use std::time::SystemTime;

/// Checks a job kind's spelling.
///
/// # Errors
/// What is wrong with it.
pub fn validate_kind(kind: &str) -> Result<(), String> {
    if kind.is_empty() || kind.len() > 64 {
        return Err("kind must have 1 to 64 characters".into());
    }
    if !kind
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
    {
        return Err(format!(
            "kind {kind:?} may only hold a-z, 0-9, '_', '.', '-'"
        ));
    }
    Ok(())
}

/// The header that carries a client's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Checks an idempotency key's spelling: 1 to 255 visible ASCII characters.
///
/// # Errors
/// What is wrong with it.
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{IDEMPOTENCY_KEY} must be 1 to 255 visible ASCII characters, got {key:?}"
        ));
    }
    Ok(())
}

/// The longest delay a submission may ask for: ten years.
pub const DELAY_MS_MAX: u64 = 10 * 366 * 24 * 3_600 * 1_000;

/// The latest `run_at_ms` a submission may name: the end of year 9999.
pub const RUN_AT_MS_MAX: u64 = 253_402_300_799_999;

/// A submission's delay from its `delay_ms` and `run_at_ms`, checked.
///
/// # Errors
/// Either is past its bound ([`DELAY_MS_MAX`], [`RUN_AT_MS_MAX`]).
pub fn delay_of(delay_ms: Option<u64>, run_at_ms: Option<u64>) -> Result<Delay, String> {
    let (delay_ms, at_ms) = (delay_ms.unwrap_or(0), run_at_ms.unwrap_or(0));
    if delay_ms > DELAY_MS_MAX {
        return Err(format!(
            "delay_ms is {delay_ms}; at most {DELAY_MS_MAX} (ten years)"
        ));
    }
    if at_ms > RUN_AT_MS_MAX {
        return Err(format!(
            "run_at_ms is {at_ms}; at most {RUN_AT_MS_MAX} (the end of year 9999)"
        ));
    }
    Ok(Delay { delay_ms, at_ms })
}

/// `POST /runs`.
#[utoipa::path(post, path = "/runs", tag = "runs", request_body = wire::SubmitBody,
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$", description = "1–255 visible ASCII; a retry with it answers the first run (one run only)"),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: the runs' spans join this trace (a malformed value is ignored)")),
    responses(
        (status = 202, description = "stored (and published, or left to the outbox)", body = wire::Submitted),
        (status = 200, description = "the key's run existed; or, for an array, one answer per item", body = wire::SubmitAnswer),
        (status = 400, description = "bad JSON, kind, key or delay; an empty array", body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 403, body = wire::ErrorBody),
        (status = 413, description = "body over the limit, or more items than --bulk-max", body = wire::ErrorBody),
        (status = 415, description = "the body is not `Content-Type: application/json`", body = wire::ErrorBody),
        (status = 422, description = "missing or unknown fields; a key used for another request", body = wire::ErrorBody),
        (status = 503, description = "Postgres unavailable: nothing stored", body = wire::ErrorBody),
        (status = 504, description = "Postgres did not answer in time: the run may be stored", body = wire::ErrorBody),
    ),
    security(("bearer" = [])))]
pub(super) async fn create_run(
    _: Writer,
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => {
            let k = v
                .to_str()
                .map_err(|_| bad(format!("{IDEMPOTENCY_KEY} is not ASCII")))?;
            validate_key(k).map_err(bad)?;
            Some(k.to_owned())
        }
    };
    let caller = headers
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let Json(body) = body.map_err(|e| ApiError(e.status(), e.body_text()))?;
    if let Value::Array(items) = body {
        if key.is_some() {
            return Err(bad(format!(
                "{IDEMPOTENCY_KEY} names one run: give each item of an array its own \"key\""
            )));
        }
        return create_runs(&state, items, caller).await;
    }
    let new: wire::NewRun = serde_json::from_value(body).map_err(|e| {
        ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        )
    })?;
    validate_kind(&new.kind).map_err(bad)?;
    let delay = delay_of(new.delay_ms, new.run_at_ms).map_err(bad)?;
    let input = serde_json::to_string(&new.input).expect("a JSON value serializes");
    let Ok(run) = state.io.db.inner().query(query::NextRunId {}).await else {
        // Nothing was sent that could store a run.
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "Postgres is unavailable; nothing was stored; retry later".into(),
        ));
    };
    let start = SystemTime::now();
    let trace = stored_trace(&state, caller);
    let submission = Submission {
        kind: new.kind,
        input,
        key: key.clone(),
        trace: trace.map(|t| t.header()),
        delay,
    };
    let end = submit(&state.io, run, &submission).await;
    if let SubmitterEnd::Accepted { published } = end {
        let delayed = delay.waits();
        tracing::info!(%run, kind = %submission.kind, published, delayed, "run accepted");
    }
    submit_span(&state, (run, &submission), caller, end, start);
    let mut answer = answer_of(end, run, &submission);
    if answer.existing {
        // A lone submission answers the key's run with its status.
        let read = query::ReadRun {
            run: answer.run_id.unwrap_or(run),
        };
        let row = state.io.db.inner().query(read).await;
        answer.status = row.ok().flatten().map(|r| r.status);
    }
    Ok(response_of(answer))
}

/// What a submission's end answers, alone or as an array's item: the
/// status code and body a lone submission of `run` under `key` has.
fn answer_of(end: SubmitterEnd, run: RunId, submitted: &Submission) -> wire::BulkItem {
    let key = submitted.key.as_deref();
    let refusal = |code: StatusCode, error: String| wire::BulkItem::refused(code.as_u16(), error);
    match end {
        SubmitterEnd::Accepted { published } => wire::BulkItem::run(
            StatusCode::ACCEPTED.as_u16(),
            wire::Submitted {
                run_id: run,
                status: Some(if submitted.delay.waits() {
                    RunStatus::Delayed
                } else {
                    RunStatus::Queued
                }),
                published: Some(published),
                existing: false,
            },
        ),
        SubmitterEnd::Existing(first) => wire::BulkItem::run(
            StatusCode::OK.as_u16(),
            wire::Submitted {
                run_id: first,
                status: None,
                published: None,
                existing: true,
            },
        ),
        SubmitterEnd::KeyConflict(first) => refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "key {:?} was first used for run {} with another request",
                key.unwrap_or_default(),
                first.0
            ),
        ),
        SubmitterEnd::Unavailable => {
            let advice = if key.is_some() {
                "retry with the same key: it answers the run if it was stored"
            } else {
                "a retry may store a second run; send a key to retry safely"
            };
            wire::BulkItem {
                outcome: Some("unknown".into()),
                ..refusal(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "Postgres did not answer in time: the run may or may not be stored; {advice}"
                    ),
                )
            }
        }
        SubmitterEnd::Refused => refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Postgres refused the run's values (text holding a NUL byte); nothing was stored"
                .into(),
        ),
    }
}

/// A lone submission's answer as its HTTP response: the run (200, 202),
/// or the error (with `outcome` when the run may be stored).
fn response_of(answer: wire::BulkItem) -> Response {
    let code = StatusCode::from_u16(answer.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match answer.run_id {
        Some(run_id) => {
            let body = wire::Submitted {
                run_id,
                status: answer.status,
                published: answer.published,
                existing: answer.existing,
            };
            (code, Json(body)).into_response()
        }
        None => {
            let body = wire::ErrorBody {
                error: answer.error.unwrap_or_default(),
                outcome: answer.outcome,
            };
            (code, Json(body)).into_response()
        }
    }
}

/// `POST /runs` with an array: each item a run (`{"kind", "input", "key",
/// "delay_ms", "run_at_ms"}`),
/// all submitted together ([`submit_many`]: one statement for their ids,
/// one for their inserts, a pipeline of XADDs, one statement for the
/// marks). Each item gets its own answer, with the status code a lone
/// submission of it would have had; a bad item fails alone.
pub(super) async fn create_runs(
    state: &ApiState,
    items: Vec<Value>,
    caller: Option<TraceParent>,
) -> Result<Response, ApiError> {
    if items.is_empty() {
        return Err(bad("an empty array submits nothing"));
    }
    if items.len() > state.bulk_max {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} runs in one request; at most {} (--bulk-max)",
                items.len(),
                state.bulk_max
            ),
        ));
    }
    let refusal = |code: StatusCode, error: String| wire::BulkItem::refused(code.as_u16(), error);
    let mut answers: Vec<Option<wire::BulkItem>> = vec![None; items.len()];
    let (mut runs, mut at) = (Vec::new(), Vec::new());
    let start = SystemTime::now();
    for (i, item) in items.into_iter().enumerate() {
        match bulk_item(item) {
            Ok(mut run) => {
                run.trace = stored_trace(state, caller).map(|t| t.header());
                runs.push(run);
                at.push(i);
            }
            Err((code, error)) => answers[i] = Some(refusal(code, error)),
        }
    }
    let ids = if runs.is_empty() {
        Vec::new()
    } else {
        new_run_ids(&state.io, runs.len()).await.map_err(|_| {
            ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                "Postgres is unavailable; nothing was stored; retry later".into(),
            )
        })?
    };
    let runs: Vec<(RunId, Submission)> = ids.into_iter().zip(runs).collect();
    let ends = submit_many(&state.io, &runs).await;
    let accepted = ends
        .iter()
        .filter(|e| matches!(e, SubmitterEnd::Accepted { .. }))
        .count();
    for ((i, end), (run, submitted)) in at.into_iter().zip(ends).zip(&runs) {
        answers[i] = Some(answer_of(end, *run, submitted));
        submit_span(state, (*run, submitted), caller, end, start);
    }
    tracing::info!(runs = answers.len(), accepted, "bulk submission");
    let runs = answers
        .into_iter()
        .map(|a| a.expect("every item answered"))
        .collect();
    Ok((StatusCode::OK, Json(wire::BulkSubmitted { runs })).into_response())
}

/// An array item as a run to submit, or the status and reason it is not.
pub(super) fn bulk_item(item: Value) -> Result<Submission, (StatusCode, String)> {
    let run: wire::Submit = serde_json::from_value(item)
        .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
    validate_kind(&run.kind).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    if let Some(k) = &run.key {
        validate_key(k).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    }
    let delay = delay_of(run.delay_ms, run.run_at_ms).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    Ok(Submission {
        kind: run.kind,
        input: serde_json::to_string(&run.input).expect("a JSON value serializes"),
        key: run.key,
        trace: None,
        delay,
    })
}

/// The `traceparent` a run submitted under the request's `caller` header
/// is stored with. With export on, it names the run's own submission span,
/// a child of the caller's span or the root of a new trace; with it off,
/// it is the caller's, if any.
fn stored_trace(state: &ApiState, caller: Option<TraceParent>) -> Option<TraceParent> {
    if state.otel.is_none() {
        return caller;
    }
    Some(TraceParent {
        trace_id: caller.map_or_else(|| rand::random::<u128>().max(1), |c| c.trace_id),
        parent_id: rand::random::<u64>().max(1),
        sampled: caller.is_none_or(|c| c.sampled),
    })
}

/// Exports the span of `run`'s submission (export on, the run stored),
/// from `start` to now.
fn submit_span(
    state: &ApiState,
    (run, submitted): (RunId, &Submission),
    caller: Option<TraceParent>,
    end: SubmitterEnd,
    start: SystemTime,
) {
    let Some(otel) = &state.otel else { return };
    if !matches!(end, SubmitterEnd::Accepted { .. }) {
        return;
    }
    let trace = RunTrace::of(run, submitted.trace.as_deref());
    let times = (start, SystemTime::now());
    otel.submitted(&trace, caller.map(|c| c.parent_id), &submitted.kind, times);
}

/// Forgets idempotency keys older than `keep`, in batches, every
/// `keep / 24` (at most once a minute); runs until the process ends.
pub async fn expire_keys(io: Arc<ApiState>, keep: std::time::Duration) {
    const BATCH: usize = 1_000;
    let every = (keep / 24).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(60),
    );
    loop {
        tokio::time::sleep(every).await;
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        loop {
            match io
                .io
                .db
                .inner()
                .query(query::ExpireKeys {
                    keep_ms,
                    limit: BATCH,
                })
                .await
            {
                Ok(n) if n as usize == BATCH => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "expiring idempotency keys failed");
                    break;
                }
            }
        }
    }
}
