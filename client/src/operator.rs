//! An operator's calls: find a run by its idempotency key, count what a
//! filter matches, and act on every run it matches (cancel, requeue the
//! dead), as the dashboard does in an incident.

use crate::wire::{BulkDone, RunCount, RunSummary};
use crate::{Client, Error, RunStatus};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

impl Client {
    /// The run idempotency key `key` names, if any (none: the key is
    /// unknown, or it expired).
    ///
    /// # Errors
    /// [`Error::Rejected`] (a bad key), [`Error::Unauthorized`],
    /// [`Error::Unavailable`].
    pub async fn run_of_key(&self, key: &str) -> Result<Option<RunSummary>, Error> {
        let query = [("key", key.to_owned())];
        let answer = self
            .send_query(Method::GET, "/runs", &query, None, None)
            .await?;
        match answer.status {
            StatusCode::OK => Ok(answer.decode::<crate::wire::RunPage>()?.runs.pop()),
            _ => Err(answer.error(None)),
        }
    }

    /// How many runs of status `status` and kind `kind` (each when given)
    /// there are, by status.
    ///
    /// # Errors
    /// [`Error::Rejected`] (a bad kind), [`Error::Unauthorized`],
    /// [`Error::Unavailable`].
    pub async fn count(
        &self,
        kind: Option<&str>,
        status: Option<RunStatus>,
    ) -> Result<RunCount, Error> {
        let mut query = Vec::new();
        query.extend(kind.map(|k| ("kind", k.to_owned())));
        query.extend(status.map(|s| ("status", s.as_str().to_owned())));
        let answer = self
            .send_query(Method::GET, "/runs/count", &query, None, None)
            .await?;
        match answer.status {
            StatusCode::OK => answer.decode(),
            _ => Err(answer.error(None)),
        }
    }

    /// Cancels every run of live status `status` (queued, retry_wait or
    /// running) and kind `kind` (any when `None`), request after request
    /// until none is left; answers the sums.
    ///
    /// # Errors
    /// [`Error::Rejected`] (a status that is not live, a bad kind),
    /// [`Error::Unauthorized`], [`Error::Unavailable`] (what was done
    /// before stays done: call it again for the rest).
    pub async fn cancel_matching(
        &self,
        status: RunStatus,
        kind: Option<&str>,
    ) -> Result<BulkDone, Error> {
        let body = json!({"status": status.as_str(), "kind": kind});
        self.bulk("/runs/cancel", body).await
    }

    /// Runs every dead run of kind `kind` again, with `extra_attempts`
    /// more attempts each; answers the sums.
    ///
    /// # Errors
    /// As [`Client::cancel_matching`].
    pub async fn requeue_dead_of_kind(
        &self,
        kind: &str,
        extra_attempts: u32,
    ) -> Result<BulkDone, Error> {
        let body = json!({"kind": kind, "extra_attempts": extra_attempts});
        self.bulk("/dead-letters/requeue", body).await
    }

    /// Sends bulk action `body` to `path`, then again after each answer's
    /// cursor while one comes back.
    async fn bulk(&self, path: &str, mut body: Value) -> Result<BulkDone, Error> {
        let mut sum = BulkDone {
            changed: 0,
            skipped: 0,
            next_cursor: None,
        };
        loop {
            let answer = self.send(Method::POST, path, Some(&body), None).await?;
            let done: BulkDone = match answer.status {
                StatusCode::OK => answer.decode()?,
                _ => return Err(answer.error(None)),
            };
            sum.changed += done.changed;
            sum.skipped += done.skipped;
            match done.next_cursor {
                Some(cursor) => body["cursor"] = json!(cursor),
                None => return Ok(sum),
            }
        }
    }
}
