//! [`Client::watch`](crate::Client::watch): a run's events over SSE,
//! reconnecting with `Last-Event-ID` while the connection drops, each event
//! yielded once, in order.

use crate::{Answer, Client, Error, Event, RunId, retryable};
use backon::ExponentialBackoff;
use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::Value;

type Sse = std::pin::Pin<
    Box<
        dyn Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// A [`Client::watch`] in progress.
pub(crate) struct Watch {
    client: Client,
    run: RunId,
    /// The last event yielded.
    last: u32,
    /// Connections in a row that failed.
    failures: u32,
    /// The waits before the next connections, while they fail.
    waits: ExponentialBackoff,
    open: Option<Sse>,
    done: bool,
}

impl Watch {
    /// A watch of `run`'s events after event `after`, not yet connected.
    pub(crate) fn new(client: &Client, run: RunId, after: u32) -> Watch {
        Watch {
            client: client.clone(),
            run,
            last: after,
            failures: 0,
            waits: client.retry.waits(),
            open: None,
            done: false,
        }
    }

    pub(crate) async fn next(&mut self) -> Option<Result<Event, Error>> {
        if self.done {
            return None;
        }
        loop {
            let Some(sse) = self.open.as_mut() else {
                match self.connect().await {
                    Ok(Some(sse)) => self.open = Some(sse),
                    Ok(None) => {
                        self.done = true;
                        return None;
                    }
                    Err(Some(e)) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                    Err(None) => {}
                }
                continue;
            };
            match sse.next().await {
                Some(Ok(raw)) if raw.event.is_empty() && raw.data.is_empty() => {}
                Some(Ok(raw)) => match serde_json::from_str::<Event>(&raw.data) {
                    // A reconnect never repeats an event, but a server that
                    // did would not be believed.
                    Ok(e) if e.seq <= self.last => {}
                    Ok(e) if e.seq != self.last + 1 => {
                        self.done = true;
                        return Some(Err(Error::Unexpected {
                            status: 200,
                            message: format!("event {} after event {}", e.seq, self.last),
                        }));
                    }
                    Ok(e) => {
                        self.failures = 0;
                        self.waits = self.client.retry.waits();
                        self.last = e.seq;
                        return Some(Ok(e));
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(Error::Unexpected {
                            status: 200,
                            message: format!("an event that is not one: {e}"),
                        }));
                    }
                },
                // The connection dropped, or the server ended the stream
                // (after a terminal event: the reconnect answers 204).
                Some(Err(_)) | None => self.open = None,
            }
        }
    }

    /// A new connection (`Ok(None)`: the run has ended and every event was
    /// seen; `Err(None)`: this one failed, try again; `Err(Some)`: give up).
    async fn connect(&mut self) -> Result<Option<Sse>, Option<Error>> {
        let c = &self.client;
        if self.failures > 0 {
            let Some(wait) = self.waits.next() else {
                return Err(Some(Error::Unavailable(format!(
                    "the events of run {} could not be read {} times in a row",
                    self.run.0, self.failures
                ))));
            };
            tokio::time::sleep(wait).await;
        }
        self.failures += 1;
        let req = (c.request(Method::GET, &format!("/runs/{}/events", self.run.0)))
            .header("last-event-id", HeaderValue::from(self.last));
        // The timeout bounds the wait for the answer's head only: the body
        // is the stream of events, as long as the run lasts.
        let answer = tokio::time::timeout(c.retry.timeout, req.send())
            .await
            .map_err(|_| None)?
            .map_err(|_| None)?;
        match answer.status() {
            StatusCode::OK => Ok(Some(Box::pin(answer.bytes_stream().eventsource()))),
            StatusCode::NO_CONTENT => Ok(None),
            s if retryable(s) => Err(None),
            status => {
                let bytes = answer.bytes().await.unwrap_or_default();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                Err(Some(Answer { status, body }.error(Some(self.run))))
            }
        }
    }
}
