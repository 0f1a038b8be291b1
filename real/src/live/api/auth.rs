//! Who may call what: the bearer tokens, as two extractors a handler
//! names among its parameters. [`Reader`] admits the token or the
//! read-only token, [`Writer`] the token alone; with no token configured
//! (`--insecure-no-auth`) both admit anyone. A rejection answers before
//! the handler runs, and before its body is read.

use super::{ApiError, ApiState};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The caller may read runs and metrics.
pub(super) struct Reader;

/// The caller may change state: submit, cancel, requeue.
pub(super) struct Writer;

impl FromRequestParts<Arc<ApiState>> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        authorize(state, &parts.headers, Need::Read).map(|()| Reader)
    }
}

impl FromRequestParts<Arc<ApiState>> for Writer {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        authorize(state, &parts.headers, Need::Write).map(|()| Writer)
    }
}

/// What a route lets its caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    Read,
    Write,
}

fn authorize(state: &ApiState, headers: &HeaderMap, need: Need) -> Result<(), ApiError> {
    let Some(token) = &state.token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant time in the token's bytes: a wrong guess takes as long
    // whatever prefix of the token it holds.
    let matches = |t: &String, g: &str| bool::from(g.as_bytes().ct_eq(t.as_bytes()));
    let read = |g: &str| state.read_token.as_ref().is_some_and(|t| matches(t, g));
    match given {
        Some(g) if matches(token, g) => Ok(()),
        Some(g) if need == Need::Read && read(g) => Ok(()),
        Some(g) if read(g) => Err(ApiError(
            StatusCode::FORBIDDEN,
            "the read-only token cannot change runs".into(),
        )),
        Some(_) => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "wrong bearer token".into(),
        )),
        None => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`".into(),
        )),
    }
}
