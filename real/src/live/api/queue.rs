//! The queue's health and the process's: `GET /queue`, `/metrics`,
//! `/healthz`.

use super::*;

/// `GET /healthz` (no token).
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = wire::Health), (status = 503, description = "a server does not answer", body = wire::Health)))]
pub(super) async fn healthz(State(state): State<Arc<ApiState>>) -> Response {
    let pg = matches!(state.io.db.inner().query(query::Ping {}).await, Ok(1));
    let mut conn = state.io.stream.inner().connection();
    let redis = redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok();
    let status = if pg && redis {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = |ok: bool| if ok { "ok" } else { "unavailable" }.to_owned();
    let body = wire::Health {
        postgres: word(pg),
        redis: word(redis),
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn metrics_text(_: Reader, State(state): State<Arc<ApiState>>) -> Response {
    metrics::observe_queue(state.io.stream.inner(), state.io.db.inner()).await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// The queue's health, for `GET /queue` and `pelican status`: the
/// stream's side (one [`StreamOp::Queue`]).
#[must_use]
pub fn queue_view(names: &crate::live::StreamNames, q: &QueueState) -> wire::Queue {
    let group = q.group.as_ref();
    wire::Queue {
        stream: names.jobs.clone(),
        group: names.group.clone(),
        group_exists: group.is_some(),
        length: q.length,
        dead_letters: q.dead_letters,
        lag: group.and_then(|g| g.lag),
        pending: group.map_or(0, |g| g.pending),
        oldest_pending: group.and_then(|g| g.oldest_pending).map(|e| e.to_string()),
        oldest_idle_ms: group.and_then(|g| g.oldest_idle_ms),
        consumers: group
            .map_or(&[][..], |g| &g.consumers[..])
            .iter()
            .map(|(name, pending)| wire::Consumer {
                name: name.clone(),
                pending: *pending,
            })
            .collect(),
        runs: None,
        throughput: None,
    }
}

/// The minutes `GET /queue` reports throughput over.
pub(super) const THROUGHPUT_MINUTES: u32 = 10;

/// the answer of [`query::FinishedPerMinute`] as the last `minutes` minutes up to `now_minute`,
/// each listed (zero when none finished).
pub(super) fn per_minute(
    rows: &[(pelican_model::time::Timestamp, RunStatus, u64)],
    minutes: u32,
) -> Vec<wire::Minute> {
    let last = rows.iter().map(|(m, _, _)| m.0).max();
    let now = last.unwrap_or(0).max(now_minute());
    (0..u64::from(minutes))
        .rev()
        .map(|back| {
            let minute_ms = now.saturating_sub(back * 60_000);
            let finished = rows
                .iter()
                .filter(|(m, _, _)| m.0 == minute_ms)
                .map(|(_, s, n)| (s.as_str().to_owned(), *n))
                .collect();
            wire::Minute {
                minute_ms,
                finished,
            }
        })
        .collect()
}

/// This minute's first millisecond, by this host's clock (the rows carry
/// Postgres's minutes; a skew under a minute shifts the window by one).
pub(super) fn now_minute() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    ms / 60_000 * 60_000
}

/// `GET /stats`' query.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Window {
    /// Minutes back from this one, 1–60 (default 60).
    #[param(minimum = 1, maximum = 60)]
    minutes: Option<u32>,
}

/// `GET /stats`: per minute, the runs finished by status and the succeeded
/// runs' time from publication to success (p50, p99), from Postgres's own
/// rows: two ranges of the `runs_finished` index, read when asked.
#[utoipa::path(get, path = "/stats", tag = "queue", params(Window),
    responses((status = 200, body = wire::Stats), (status = 400, body = wire::ErrorBody),
        (status = 401, body = wire::ErrorBody), (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn stats(
    _: Reader,
    State(state): State<Arc<ApiState>>,
    query: Result<axum::extract::Query<Window>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::Stats>, ApiError> {
    let minutes = runs::page(query)?.minutes.unwrap_or(60);
    if minutes == 0 || minutes > 60 {
        return Err(bad(format!("minutes must be 1 to 60, got {minutes}")));
    }
    let db = state.io.db.inner();
    let finished = (db.query(query::FinishedPerMinute { minutes }).await).map_err(postgres)?;
    let latency = (db.query(query::LatencyPerMinute { minutes }).await).map_err(postgres)?;
    let minutes = per_minute(&finished, minutes)
        .into_iter()
        .map(|m| {
            let l = latency.iter().find(|l| l.minute.0 == m.minute_ms);
            wire::StatsMinute {
                minute_ms: m.minute_ms,
                finished: m.finished,
                p50_ms: l.map(|l| l.p50_ms),
                p99_ms: l.map(|l| l.p99_ms),
            }
        })
        .collect();
    Ok(Json(wire::Stats { minutes }))
}

/// `GET /queue`: the stream's side, the live runs by status, and the runs
/// finished in each of the last ten minutes.
#[utoipa::path(get, path = "/queue", tag = "queue",
    responses((status = 200, body = wire::Queue), (status = 401, body = wire::ErrorBody),
        (status = 503, body = wire::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn queue(
    _: Reader,
    State(state): State<Arc<ApiState>>,
) -> Result<Json<wire::Queue>, ApiError> {
    let stream = state.io.stream.inner();
    let op = StreamOp::Queue {
        now: pelican_model::time::Timestamp::ZERO,
    };
    let Ok(Ok(StreamReply::Queue(q))) = stream.execute(op).await else {
        return Err(unavailable("Redis"));
    };
    let db = state.io.db.inner();
    let counts = db.query(query::CountLive {}).await.map_err(postgres)?;
    let mut view = queue_view(stream.names(), &q);
    view.runs = Some(
        metrics::live_runs(&counts)
            .map(|(s, n)| (s.as_str().to_owned(), n))
            .collect(),
    );
    let minutes = THROUGHPUT_MINUTES;
    let rows = (db.query(query::FinishedPerMinute { minutes }).await).map_err(postgres)?;
    view.throughput = Some(per_minute(&rows, THROUGHPUT_MINUTES));
    Ok(Json(view))
}
