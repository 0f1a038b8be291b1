//! Batching: many deliveries' claims, completions (and acknowledgements)
//! sent as one request.
//!
//! [`Batching`] wraps a client. Each delivery still sends its own command
//! and waits for its own answer — the protocol's state machines do not
//! change — but the batched kinds of command go to a queue per kind, whose
//! task takes everything queued (up to `max` commands, on distinct runs for
//! the database) and sends it as one request. While a batch is in flight the
//! next one gathers, so batches grow with the load and a lone command waits
//! for nothing.
//!
//! - [`Batching::db`] wraps a [`DbClient`]: [`DbOp::Claim`]s go out as one
//!   statement in one transaction, [`DbOp::Complete`]s as another
//!   ([`DbClient::call_batch`]).
//! - [`Batching::stream`] wraps a [`StreamClient`]: [`StreamOp::Ack`]s go
//!   out as one pipeline of `XACK`s, one round trip for the lot
//!   ([`StreamClient::call_batch`]).
//!
//! Why this keeps S1–S10: a database batch runs as one transaction, i.e.
//! its commands run back to back with nothing in between — one of the
//! interleavings the model checker explores for the same commands sent
//! concurrently. A pipeline of `XACK`s is even less: each is its own command,
//! and other clients' commands may run between them, exactly as if each
//! delivery had sent its own. Each role has at most one command outstanding,
//! so no role's own order changes. A batch that fails or whose answer is
//! lost fails every command in it, each as a lost request or a lost reply
//! (a pipeline cut short applied a prefix of its acks: lost replies), which
//! the fault model already covers. The simulator runs this very code
//! against the model's servers (one request per batch, lost like any
//! other), and the conformance tests compare the batched statements with
//! their model twin, [`pelican_model::Db::execute_batch`].

use super::{DbClient, StreamClient, StreamResult};
use pelican_model::ids::RunId;
use pelican_model::protocol::{DbOp, DbReply, StreamOp, Unavailable};
use pelican_model::world::Issuer;
use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A batching client (see the module docs): a [`DbClient`] when made by
/// [`Batching::db`], a [`StreamClient`] when made by [`Batching::stream`].
/// Commands of the kinds it does not batch go straight through.
pub struct Batching<C> {
    inner: Arc<C>,
    /// Claims (database) or acknowledgements (stream).
    first: Option<Queue<C>>,
    /// Completions (database).
    second: Option<Queue<C>>,
}

/// The sending end of one kind's queue; its task ends when this is dropped.
struct Queue<C> {
    tx: mpsc::UnboundedSender<Queued>,
    _client: std::marker::PhantomData<fn() -> C>,
}

/// A queued command, database or stream, with where its answer goes.
enum Queued {
    Db(DbOp, Issuer, oneshot::Sender<Result<DbReply, Unavailable>>),
    Stream(
        StreamOp,
        Issuer,
        oneshot::Sender<Result<StreamResult, Unavailable>>,
    ),
}

impl Queued {
    /// Commands on the same run never share a database batch (a second
    /// claim of a run waits for the next one); stream commands may.
    fn run(&self) -> Option<RunId> {
        match self {
            Queued::Db(DbOp::Claim { run, .. } | DbOp::Complete { run, .. }, ..) => Some(*run),
            Queued::Db(..) | Queued::Stream(..) => None,
        }
    }
}

impl<D: DbClient> Batching<D> {
    /// Wraps a database client: claims and completions in batches of at
    /// most `max`, each given up after `timeout` (as a lost reply: the
    /// batch task must not wait forever for an answer that was lost, or
    /// every later claim would wait behind it). `max == 1` sends every
    /// command on its own. Spawns the two batching tasks on the current
    /// runtime; they end when this is dropped.
    #[must_use]
    pub fn db(inner: D, max: usize, timeout: Duration) -> Batching<D> {
        let inner = Arc::new(inner);
        let queue = || (max > 1).then(|| Queue::spawn(Db(inner.clone()), max, timeout));
        Batching {
            first: queue(),
            second: queue(),
            inner: inner.clone(),
        }
    }
}

impl<S: StreamClient> Batching<S> {
    /// Wraps a stream client: acknowledgements pipelined, at most `max` in
    /// one round trip, each pipeline given up after `timeout`. `max == 1`
    /// sends every command on its own. Spawns the batching task on the
    /// current runtime; it ends when this is dropped.
    #[must_use]
    pub fn stream(inner: S, max: usize, timeout: Duration) -> Batching<S> {
        let inner = Arc::new(inner);
        Batching {
            first: (max > 1).then(|| Queue::spawn(Stream(inner.clone()), max, timeout)),
            second: None,
            inner,
        }
    }
}

impl<D: DbClient> DbClient for Batching<D> {
    async fn call(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        let queue = match op {
            DbOp::Claim { .. } => self.first.as_ref(),
            DbOp::Complete { .. } => self.second.as_ref(),
            _ => None,
        };
        let Some(queue) = queue else {
            return self.inner.call(op, by).await;
        };
        let (tx, rx) = oneshot::channel();
        if queue.tx.send(Queued::Db(op, by, tx)).is_err() {
            return Err(Unavailable);
        }
        rx.await.unwrap_or(Err(Unavailable))
    }

    async fn call_batch(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        self.inner.call_batch(ops).await
    }
}

impl<S: StreamClient> StreamClient for Batching<S> {
    async fn call(&self, op: StreamOp, by: Issuer) -> Result<StreamResult, Unavailable> {
        let queue = match op {
            StreamOp::Ack { .. } => self.first.as_ref(),
            _ => None,
        };
        let Some(queue) = queue else {
            return self.inner.call(op, by).await;
        };
        let (tx, rx) = oneshot::channel();
        if queue.tx.send(Queued::Stream(op, by, tx)).is_err() {
            return Err(Unavailable);
        }
        rx.await.unwrap_or(Err(Unavailable))
    }

    async fn call_batch(
        &self,
        ops: Vec<(StreamOp, Issuer)>,
    ) -> Result<Vec<StreamResult>, Unavailable> {
        self.inner.call_batch(ops).await
    }
}

/// What a queue's task sends its batches to.
trait Sink: Send + Sync + 'static {
    /// Sends `batch` (more than one command) as one request and answers each.
    fn send(&self, batch: Vec<Queued>, timeout: Duration) -> impl Future<Output = ()> + Send;
    /// Sends a lone command on its own and answers it.
    fn send_one(&self, one: Queued, timeout: Duration) -> impl Future<Output = ()> + Send;
}

struct Db<D>(Arc<D>);
struct Stream<S>(Arc<S>);

/// Answers each of `answers` from `replies`, or all "no answer" when the
/// request failed, timed out or came back short.
fn answer_all<R>(
    answers: Vec<oneshot::Sender<Result<R, Unavailable>>>,
    replies: Result<Result<Vec<R>, Unavailable>, tokio::time::error::Elapsed>,
) {
    match replies {
        Ok(Ok(replies)) if replies.len() == answers.len() => {
            for (tx, reply) in answers.into_iter().zip(replies) {
                let _ = tx.send(Ok(reply));
            }
        }
        _ => {
            for tx in answers {
                let _ = tx.send(Err(Unavailable));
            }
        }
    }
}

impl<D: DbClient> Sink for Db<D> {
    async fn send(&self, batch: Vec<Queued>, timeout: Duration) {
        let mut ops = Vec::with_capacity(batch.len());
        let mut answers = Vec::with_capacity(batch.len());
        for q in batch {
            if let Queued::Db(op, by, tx) = q {
                ops.push((op, by));
                answers.push(tx);
            }
        }
        answer_all(
            answers,
            tokio::time::timeout(timeout, self.0.call_batch(ops)).await,
        );
    }

    async fn send_one(&self, one: Queued, timeout: Duration) {
        if let Queued::Db(op, by, tx) = one {
            let answer = tokio::time::timeout(timeout, self.0.call(op, by)).await;
            let _ = tx.send(answer.unwrap_or(Err(Unavailable)));
        }
    }
}

impl<S: StreamClient> Sink for Stream<S> {
    async fn send(&self, batch: Vec<Queued>, timeout: Duration) {
        let mut ops = Vec::with_capacity(batch.len());
        let mut answers = Vec::with_capacity(batch.len());
        for q in batch {
            if let Queued::Stream(op, by, tx) = q {
                ops.push((op, by));
                answers.push(tx);
            }
        }
        answer_all(
            answers,
            tokio::time::timeout(timeout, self.0.call_batch(ops)).await,
        );
    }

    async fn send_one(&self, one: Queued, timeout: Duration) {
        if let Queued::Stream(op, by, tx) = one {
            let answer = tokio::time::timeout(timeout, self.0.call(op, by)).await;
            let _ = tx.send(answer.unwrap_or(Err(Unavailable)));
        }
    }
}

impl<C> Queue<C> {
    fn spawn(sink: impl Sink, max: usize, timeout: Duration) -> Queue<C> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(sink, rx, max.max(1), timeout));
        Queue {
            tx,
            _client: std::marker::PhantomData,
        }
    }
}

async fn batcher(
    sink: impl Sink,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    max: usize,
    timeout: Duration,
) {
    let mut queued: VecDeque<Queued> = VecDeque::new();
    loop {
        if queued.is_empty() {
            match rx.recv().await {
                Some(q) => queued.push_back(q),
                None => return,
            }
        }
        while let Ok(q) = rx.try_recv() {
            queued.push_back(q);
        }
        // Up to `max` commands, on distinct runs, in arrival order; a second
        // command on a run waits for the next batch.
        let mut runs = BTreeSet::new();
        let mut batch = Vec::new();
        let mut later = VecDeque::new();
        while let Some(q) = queued.pop_front() {
            let fits = batch.len() < max && q.run().is_none_or(|run| runs.insert(run));
            if fits {
                batch.push(q);
            } else {
                later.push_back(q);
            }
        }
        queued = later;
        if batch.len() == 1 {
            let one = batch.pop().expect("one command");
            sink.send_one(one, timeout).await;
        } else {
            sink.send(batch, timeout).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Queued;
    use pelican_model::ids::{Dispatch, EntryId, RunId, WorkerId};
    use pelican_model::protocol::{DbOp, StreamOp};
    use pelican_model::time::Timestamp;
    use pelican_model::world::Issuer;
    use tokio::sync::oneshot;

    #[test]
    fn only_database_commands_on_a_run_exclude_each_other() {
        let (tx, _rx) = oneshot::channel();
        let claim = Queued::Db(
            DbOp::Claim {
                run: RunId(7),
                dispatch: Dispatch(1),
                entry: EntryId::new(1, 0),
                worker: WorkerId(1).consumer(),
                now: Timestamp(0),
                lease_ms: 2_000,
            },
            Issuer::worker(WorkerId(1)),
            tx,
        );
        assert_eq!(claim.run(), Some(RunId(7)));
        let (tx, _rx) = oneshot::channel();
        let ack = Queued::Stream(
            StreamOp::Ack {
                ids: vec![EntryId::new(1, 0)],
            },
            Issuer::worker(WorkerId(1)),
            tx,
        );
        assert_eq!(ack.run(), None, "acks of one entry may share a pipeline");
    }
}
