//! # pelican-client: Pelican's HTTP API from Rust
//!
//! Submit runs (one at a time or in bulk), read them, cancel them and
//! follow their events, from another Rust service:
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use pelican_client::{Client, Submit};
//!
//! # async fn demo() -> Result<(), pelican_client::Error> {
//! let client = Client::new("http://127.0.0.1:8080")?.with_token("s3cret");
//! let run = client
//!     .submit(&Submit::new("email", serde_json::json!({"to": "a@example.com"})).key("order-17"))
//!     .await?;
//! let mut events = client.watch(run.run_id);
//! while let Some(event) = events.next().await {
//!     println!("{:?}", event?);
//! }
//! # Ok(()) }
//! ```
//!
//! **Retries are safe because of idempotency keys.** Every submission
//! carries one: the caller's ([`Submit::key`]), or one the client makes.
//! A request that fails in transit, or that the API answers with 502, 503
//! or 504, is sent again with the same key (up to [`Retry::attempts`]
//! times, backing off exponentially with jitter), and the API answers the
//! run the first request stored, if it did. Reads and cancels are
//! idempotent on their own.
//!
//! **HTTPS** is rustls: an `https://` API's certificate must chain to a
//! root the system trusts, or to one given with
//! [`Client::with_root_certificate`].
//!
//! [`Client::watch`] follows a run's events over SSE and reconnects with
//! `Last-Event-ID` when the connection drops: each event is yielded once,
//! in order, numbered 1, 2, 3, ...; the stream ends after the run's
//! terminal event.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
pub use pelican_model::events::EventKind;
pub use pelican_model::ids::RunId;
pub use pelican_model::status::RunStatus;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde_json::{Value, json};
use std::time::Duration;

mod operator;
mod schedules;
mod watch;
pub mod wire;

use watch::Watch;
pub use wire::{Attempt, Event, Run, RunError, Submit, Submitted};

/// What went wrong with a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The base URL is not an `http://` or `https://` URL, or a root
    /// certificate is not one.
    #[error("bad API address {0:?}: expected http://host:port or https://host:port")]
    Address(String),
    /// The request was refused as malformed (400, 413, 422): retrying the
    /// same request cannot help.
    #[error("the API refused the request ({status}): {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The API's message.
        message: String,
    },
    /// The token is missing or wrong (401, 403).
    #[error("not authorized: {0}")]
    Unauthorized(String),
    /// No such run (404).
    #[error("no such run: {0}")]
    NotFound(RunId),
    /// The idempotency key was first used with another request (422).
    #[error("idempotency key reused for another request: {0}")]
    KeyConflict(String),
    /// The run already ended, so it cannot be cancelled (409).
    #[error("run {run} already ended: {status:?}")]
    Ended {
        /// The run.
        run: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// The API or its servers did not answer, after every retry. For a
    /// submission: the run may or may not be stored; submitting it again
    /// with the same key is safe.
    #[error("the API is unavailable: {0}")]
    Unavailable(String),
    /// An answer this client does not understand.
    #[error("unexpected answer ({status}): {message}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        message: String,
    },
}

/// How often and how patiently a failed request is sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Sends in all (1: no retry).
    pub attempts: u32,
    /// The wait before the first retry; it doubles, up to `backoff_max`.
    /// Each wait is lengthened by a random part of itself (jitter, up to
    /// as much again), so that clients that failed together do not retry
    /// together.
    pub backoff: Duration,
    /// The longest wait between two sends.
    pub backoff_max: Duration,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            attempts: 5,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// The waits between sends, with jitter: one fewer than the sends.
    fn waits(&self) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(self.backoff)
            .with_max_delay(self.backoff_max)
            .with_max_times(self.attempts.max(1) as usize - 1)
            .with_jitter()
            .build()
    }
}

/// A client of one Pelican API. Cheap to clone: clones share connections.
#[derive(Clone, Debug)]
pub struct Client {
    base: Url,
    token: Option<HeaderValue>,
    retry: Retry,
    roots: Vec<reqwest::Certificate>,
    http: reqwest::Client,
}

/// A connection pool that trusts the system's root certificates and
/// `roots`, over rustls.
fn pool(roots: &[reqwest::Certificate]) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder();
    for root in roots {
        builder = builder.add_root_certificate(root.clone());
    }
    builder
        .build()
        .map_err(|e| Error::Address(format!("no HTTP client: {e}")))
}

/// Why one send got no answer to give the caller.
enum Failure {
    /// None arrived, or a 502, 503 or 504: send again.
    Transient(String),
    /// An answer that settles it.
    Final(Error),
}

/// An idempotency key no other submission carries: a UUID of version 7
/// (a millisecond time, then random bits), so keys also sort by when they
/// were made.
fn new_key() -> String {
    format!("pc-{}", uuid::Uuid::now_v7())
}

/// One answer: its status and body.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn message(&self) -> String {
        self.body
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| self.body.to_string(), str::to_owned)
    }

    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, Error> {
        let status = self.status.as_u16();
        serde_json::from_value(self.body).map_err(|e| Error::Unexpected {
            status,
            message: e.to_string(),
        })
    }

    /// The error a non-success answer stands for.
    fn error(self, run: Option<RunId>) -> Error {
        let message = self.message();
        match self.status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Unauthorized(message),
            StatusCode::NOT_FOUND if run.is_some() => Error::NotFound(run.expect("checked")),
            s if s.is_server_error() => Error::Unavailable(message),
            s if s.is_client_error() => Error::Rejected {
                status: s.as_u16(),
                message,
            },
            s => Error::Unexpected {
                status: s.as_u16(),
                message,
            },
        }
    }
}

/// Whether a request that got `status` may be sent again.
fn retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

impl Client {
    /// A client of the API at `base` (`http://host:port` or
    /// `https://host:port`), without a token. An `https` API's certificate
    /// must chain to a root the system trusts, or to one given with
    /// [`Client::with_root_certificate`].
    ///
    /// # Errors
    /// [`Error::Address`]: `base` is not an `http://` or `https://` URL.
    pub fn new(base: &str) -> Result<Client, Error> {
        let bad = || Error::Address(base.to_owned());
        let url = Url::parse(base.trim_end_matches('/')).map_err(|_| bad())?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(bad());
        }
        Ok(Client {
            base: url,
            token: None,
            retry: Retry::default(),
            roots: Vec::new(),
            http: pool(&[])?,
        })
    }

    /// Trusts the root certificates in `pem` (one or more, in PEM) besides
    /// the system's: for an API whose certificate a private authority
    /// signed.
    ///
    /// # Errors
    /// [`Error::Address`]: `pem` is not a certificate.
    pub fn with_root_certificate(mut self, pem: &[u8]) -> Result<Client, Error> {
        let bad =
            |why: String| Error::Address(format!("a root certificate that is not one: {why}"));
        let roots = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| bad(e.to_string()))?;
        if roots.is_empty() {
            return Err(bad("no PEM certificate in it".into()));
        }
        self.roots.extend(roots);
        self.http = pool(&self.roots)?;
        Ok(self)
    }

    /// Sends `token` as `Authorization: Bearer <token>`.
    ///
    /// # Panics
    /// If `token` holds characters a header cannot (a token is visible
    /// ASCII).
    #[must_use]
    pub fn with_token(mut self, token: &str) -> Client {
        let value =
            HeaderValue::try_from(format!("Bearer {token}")).expect("a token is visible ASCII");
        self.token = Some(value);
        self
    }

    /// Retries as `retry` says.
    #[must_use]
    pub fn with_retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut url = self.base.clone();
        url.set_path(&format!("{}{path}", self.base.path().trim_end_matches('/')));
        let req = self.http.request(method, url);
        match &self.token {
            Some(token) => req.header(AUTHORIZATION, token.clone()),
            None => req,
        }
    }

    /// Sends a request (with idempotency key `key`), again while it fails
    /// in transit or the API answers 502, 503 or 504, waiting as
    /// [`Retry`] says; the last answer, or why there was none.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Result<Answer, Error> {
        self.send_query(method, path, &[], body, key).await
    }

    /// [`Client::send`], with `query`'s parameters in the URL.
    async fn send_query(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Result<Answer, Error> {
        let key = key
            .map(|k| {
                HeaderValue::try_from(k).map_err(|_| Error::Rejected {
                    status: 400,
                    message: format!("idempotency key {k:?} is not visible ASCII"),
                })
            })
            .transpose()?;
        let once = || async {
            let mut req = self.request(method.clone(), path);
            if !query.is_empty() {
                req = req.query(query);
            }
            if let Some(body) = body {
                req = req.json(body);
            }
            if let Some(k) = &key {
                req = req.header("idempotency-key", k.clone());
            }
            match self.exchange(req).await {
                Ok(a) if retryable(a.status) => Err(Failure::Transient(a.message())),
                Ok(a) => Ok(a),
                Err(e) => Err(e),
            }
        };
        let sent = once
            .retry(self.retry.waits())
            .sleep(tokio::time::sleep)
            .when(|f| matches!(f, Failure::Transient(_)))
            .await;
        sent.map_err(|f| match f {
            Failure::Transient(last) => Error::Unavailable(last),
            Failure::Final(e) => e,
        })
    }

    /// Submits one run. Without a key of its own, it gets one, so that a
    /// retry cannot store it twice.
    ///
    /// # Errors
    /// [`Error::Rejected`] (a bad kind, say), [`Error::KeyConflict`],
    /// [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn submit(&self, run: &Submit) -> Result<Submitted, Error> {
        let key = run.key.clone().unwrap_or_else(new_key);
        let body = json!({
            "kind": run.kind, "input": run.input,
            "delay_ms": run.delay_ms, "run_at_ms": run.run_at_ms,
        });
        let answer = self
            .send(Method::POST, "/runs", Some(&body), Some(&key))
            .await?;
        match answer.status {
            StatusCode::ACCEPTED | StatusCode::OK => answer.decode(),
            StatusCode::UNPROCESSABLE_ENTITY if answer.message().contains("first used") => {
                Err(Error::KeyConflict(answer.message()))
            }
            _ => Err(answer.error(None)),
        }
    }

    /// One request and its whole answer.
    async fn exchange(&self, req: RequestBuilder) -> Result<Answer, Failure> {
        let transient = |e: reqwest::Error| Failure::Transient(e.to_string());
        let answer = req
            .timeout(self.retry.timeout)
            .send()
            .await
            .map_err(transient)?;
        let status = answer.status();
        let bytes = answer.bytes().await.map_err(transient)?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|e| {
                Failure::Final(Error::Unexpected {
                    status: status.as_u16(),
                    message: format!("not JSON: {e}"),
                })
            })?
        };
        Ok(Answer { status, body })
    }

    /// Submits `runs` in one request (at most the API's `--bulk-max`).
    /// Each run keeps its own key (made for it when it has none) and gets
    /// its own answer, in order; the whole request is retried as one, and
    /// the keys make that safe.
    ///
    /// # Errors
    /// The request as a whole failed: too many runs ([`Error::Rejected`],
    /// 413), [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn submit_many(
        &self,
        runs: &[Submit],
    ) -> Result<Vec<Result<Submitted, Error>>, Error> {
        let items: Vec<Value> = runs
            .iter()
            .map(|r| {
                let key = r.key.clone().unwrap_or_else(new_key);
                json!({
                    "kind": r.kind, "input": r.input, "key": key,
                    "delay_ms": r.delay_ms, "run_at_ms": r.run_at_ms,
                })
            })
            .collect();
        let answer = self
            .send(Method::POST, "/runs", Some(&Value::Array(items)), None)
            .await?;
        if answer.status != StatusCode::OK {
            return Err(answer.error(None));
        }
        let status = answer.status.as_u16();
        let Some(Value::Array(answers)) = answer.body.get("runs").cloned() else {
            return Err(Error::Unexpected {
                status,
                message: "a bulk answer without \"runs\"".into(),
            });
        };
        if answers.len() != runs.len() {
            return Err(Error::Unexpected {
                status,
                message: format!("{} answers to {} runs", answers.len(), runs.len()),
            });
        }
        Ok(answers
            .into_iter()
            .map(|a| {
                let code = a.get("code").and_then(Value::as_u64).unwrap_or(0);
                let code = StatusCode::from_u16(u16::try_from(code).unwrap_or(0))
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let item = Answer {
                    status: code,
                    body: a,
                };
                match code {
                    StatusCode::ACCEPTED | StatusCode::OK => item.decode(),
                    StatusCode::UNPROCESSABLE_ENTITY if item.message().contains("first used") => {
                        Err(Error::KeyConflict(item.message()))
                    }
                    _ => Err(item.error(None)),
                }
            })
            .collect())
    }

    /// Reads run `run`.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn run(&self, run: RunId) -> Result<Run, Error> {
        let answer = self
            .send(Method::GET, &format!("/runs/{}", run.0), None, None)
            .await?;
        match answer.status {
            StatusCode::OK => answer.decode(),
            _ => Err(answer.error(Some(run))),
        }
    }

    /// A page of runs, by id: at most `limit` (1 to 1,000) after run
    /// `after` (from the first when `None`), of kind `kind` and status
    /// `status` when given. The page's `next_cursor` is the next page's
    /// `after`.
    ///
    /// # Errors
    /// [`Error::Rejected`] (a bad kind or limit), [`Error::Unauthorized`],
    /// [`Error::Unavailable`].
    pub async fn runs(
        &self,
        after: Option<RunId>,
        kind: Option<&str>,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<wire::RunPage, Error> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(after.map(|r| ("cursor", r.0.to_string())));
        query.extend(kind.map(|k| ("kind", k.to_owned())));
        query.extend(status.map(|s| ("status", s.as_str().to_owned())));
        let answer = self
            .send_query(Method::GET, "/runs", &query, None, None)
            .await?;
        match answer.status {
            StatusCode::OK => answer.decode(),
            _ => Err(answer.error(None)),
        }
    }

    /// Cancels run `run` (the first terminal write wins).
    ///
    /// # Errors
    /// [`Error::Ended`] when the run ended before the cancel (not when a
    /// retried cancel finds it cancelled by its own first send),
    /// [`Error::NotFound`], [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn cancel(&self, run: RunId) -> Result<(), Error> {
        let answer = self
            .send(Method::POST, &format!("/runs/{}/cancel", run.0), None, None)
            .await?;
        match answer.status {
            StatusCode::OK => Ok(()),
            StatusCode::CONFLICT => {
                let status = self.run(run).await?.status;
                // A cancel's first send may have landed with its answer lost.
                if status == RunStatus::Cancelled {
                    Ok(())
                } else {
                    Err(Error::Ended { run, status })
                }
            }
            _ => Err(answer.error(Some(run))),
        }
    }

    /// Follows run `run`'s events from the first (or after event `after`),
    /// reconnecting with `Last-Event-ID` whenever the connection drops. The
    /// stream ends after the run's terminal event; it yields an error, and
    /// ends, when the API refuses (no such run, a bad token) or stays
    /// unreachable through every retry.
    pub fn watch(&self, run: RunId) -> BoxStream<'static, Result<Event, Error>> {
        self.watch_after(run, 0)
    }

    /// [`Client::watch`] from after event `after`.
    pub fn watch_after(&self, run: RunId, after: u32) -> BoxStream<'static, Result<Event, Error>> {
        let state = Watch::new(self, run, after);
        futures_util::stream::unfold(state, |mut w| async move {
            let next = w.next().await?;
            Some((next, w))
        })
        .boxed()
    }
}
