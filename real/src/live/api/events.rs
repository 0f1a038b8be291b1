//! `GET /runs/{id}/events`: a run's events over SSE, fed by the
//! process's one reader.

use super::*;

/// One event as an SSE event: `id` its number, `event` its kind, `data`
/// its [`event_view`].
pub(super) fn sse_event(e: &RunEvent) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default()
        .id(e.seq.to_string())
        .event(e.kind.as_str())
        .json_data(event_view(e))
        .expect("an event serializes"))
}

/// One event as an SSE event's data.
#[must_use]
pub fn event_view(e: &RunEvent) -> wire::Event {
    let mut v = wire::Event {
        seq: e.seq,
        kind: e.kind,
        attempt: e.attempt.0,
        fence: e.fence.0,
        worker: None,
        progress: None,
        class: None,
        message: None,
    };
    match e.kind {
        EventKind::Claimed => v.worker = Some(e.data.clone()),
        EventKind::Progress => v.progress = Some(runs::as_json(&e.data)),
        _ if e.class.is_some() => {
            v.class = e.class.map(|c| c.as_str().to_owned());
            v.message = Some(e.data.clone());
        }
        _ => {}
    }
    v
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsQuery {
    /// Start after this event (0: from the first); `Last-Event-ID` wins.
    after: Option<u32>,
}

/// `GET /runs/{id}/events`: the run's events after `Last-Event-ID` (or
/// `?after=N`; 0: from the first), one SSE event each (`id`: its number,
/// `event`: its kind, `data`: [`event_view`]), as they are written. The
/// stream ends after a terminal event; a client that comes back after it
/// gets 204 (EventSource then stops reconnecting). While Postgres does not
/// answer, the stream waits and keeps the connection alive.
#[utoipa::path(get, path = "/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = RUN_ID, pattern = r"^(run-)?[0-9]{1,19}$"),
        ("Last-Event-ID" = Option<u32>, Header, minimum = 0, description = "resume after this event"),
        EventsQuery),
    responses(
        (status = 200, description = "text/event-stream: `id` the event's number, `event` its kind, `data` an Event", body = wire::Event, content_type = "text/event-stream"),
        (status = 204, description = "the run ended and every event was seen"),
        (status = 400, body = wire::ErrorBody), (status = 401, body = wire::ErrorBody),
        (status = 404, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn run_events(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let run = parse_run(&id)?;
    let axum::extract::Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let last_seen = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .ok_or_else(|| bad("Last-Event-ID is not an event number"))?,
        ),
        None => None,
    };
    let after = last_seen.or(query.after).unwrap_or(0);
    let db = state.io.db.inner().clone();
    let row = db
        .query(query::ReadRunHead { run })
        .await
        .map_err(postgres)?;
    let row = row.ok_or_else(|| no_run(run))?;
    if after > row.events {
        return Err(bad(format!(
            "run {} has {} events; there is no event {after}",
            run.0, row.events
        )));
    }
    if after == row.events && row.status.is_terminal() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // The process's one reader follows the run for this stream: no poll
    // of the stream's own.
    let Some(sub) = state.watchers.subscribe(run, after) else {
        let mut e = ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "this API has as many events streams open as it serves; retry, or at another".into(),
        )
        .into_response();
        e.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return Ok(e);
    };
    let events = futures_util::stream::unfold(sub, |mut sub| async move {
        let batch = sub.events.recv().await?;
        let sent: Vec<Result<Event, std::convert::Infallible>> =
            batch.iter().map(sse_event).collect();
        Some((futures_util::stream::iter(sent), sub))
    });
    let mut stopping = state.stopping.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let events =
        futures_util::StreamExt::take_until(futures_util::StreamExt::flatten(events), stopped);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
