//! Every request's body is read to its end before its handler runs.
//!
//! A server that answers while part of a request is still unread, and
//! then closes the connection, makes the kernel answer the unread bytes
//! with a reset; a client still sending, or not yet reading, may meet the
//! reset before the answer, and see a dropped connection where a 4xx was
//! sent. So the API reads a body whole (up to `--body-limit-bytes`) before
//! a token or a route is checked; a body over the limit is read on, and
//! thrown away, up to [`DRAIN_BYTES_MAX`] or [`DRAIN_TIME`], so that its
//! 413 reaches the client and the connection stays open. Only a body past
//! those bounds gets its 413 with `Connection: close` (and may be reset).

use super::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::time::Duration;

/// The most bytes of a refused body read (and thrown away) so that its
/// client gets the 413.
pub const DRAIN_BYTES_MAX: u64 = 64 << 20;
/// The longest a refused body is read for.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);

/// A body as read: whole, or over the limit (read to its end or not).
enum Read {
    Whole(Bytes),
    Over { to_end: bool },
    Broken,
}

/// The middleware: reads the body (see the module's docs), then runs the
/// handler on it, or answers 413 (or 400 for a body that broke off).
pub async fn read_whole(State(limit): State<usize>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    match read(body, limit).await {
        Read::Whole(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Read::Over { to_end } => {
            let mut resp = ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {limit} bytes (--body-limit-bytes)"),
            )
            .into_response();
            if !to_end {
                close(&mut resp);
            }
            resp
        }
        Read::Broken => {
            let mut resp = super::bad("the request's body broke off").into_response();
            close(&mut resp);
            resp
        }
    }
}

/// Tells the client that this connection ends with this answer.
fn close(resp: &mut Response) {
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
}

/// Reads `body` whole if it holds at most `limit` bytes; else reads on
/// within the drain's bounds.
async fn read(body: Body, limit: usize) -> Read {
    let mut chunks = body.into_data_stream();
    // The first chunk is kept as it came (most bodies are one chunk).
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    let mut seen = 0_usize;
    while let Some(chunk) = chunks.next().await {
        let Ok(chunk) = chunk else {
            return Read::Broken;
        };
        seen = seen.saturating_add(chunk.len());
        if seen > limit {
            let drained = tokio::time::timeout(DRAIN_TIME, async {
                let mut seen = seen as u64;
                while let Some(chunk) = chunks.next().await {
                    let Ok(chunk) = chunk else { return false };
                    seen = seen.saturating_add(chunk.len() as u64);
                    if seen > DRAIN_BYTES_MAX {
                        return false;
                    }
                }
                true
            });
            let to_end = drained.await.unwrap_or(false);
            return Read::Over { to_end };
        }
        match &first {
            None => first = Some(chunk),
            Some(f) => {
                if rest.is_empty() {
                    rest.extend_from_slice(f);
                }
                rest.extend_from_slice(&chunk);
            }
        }
    }
    Read::Whole(if rest.is_empty() {
        first.unwrap_or_default()
    } else {
        Bytes::from(rest)
    })
}
