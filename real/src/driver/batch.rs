//! Batching of claims and completions: many deliveries' [`DbOp::Claim`]s
//! (and [`DbOp::Complete`]s) executed as one statement and one commit.
//!
//! [`Batching`] wraps a [`DbClient`]. Each delivery still sends its own
//! command and waits for its own answer — the protocol's state machines do
//! not change — but claims and completions go to a queue per kind, whose
//! task takes everything queued (up to `max` commands on distinct runs) and
//! sends it as one [`DbClient::call_batch`]. While a batch is in flight the
//! next one gathers, so batches grow with the load and a lone command
//! waits for nothing.
//!
//! Why this keeps S1–S10: a batch runs as one transaction, i.e. its
//! commands run back to back with nothing in between — one of the
//! interleavings the model checker explores for the same commands sent
//! concurrently. Each role has at most one command outstanding, so no role's
//! own order changes. A batch that fails or whose answer is lost fails every
//! command in it, each as a lost request or a lost reply, which the fault
//! model already covers. The simulator runs this very code against the
//! model's database (one request per batch, lost like any other), and the
//! conformance tests compare the batched statements with their model twin,
//! [`pelican_model::Db::execute_batch`].

use super::DbClient;
use pelican_model::ids::RunId;
use pelican_model::protocol::{DbOp, DbReply, Unavailable};
use pelican_model::world::Issuer;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Answer = oneshot::Sender<Result<DbReply, Unavailable>>;
type Queued = (DbOp, Issuer, Answer);

/// A [`DbClient`] that batches claims and completions (see the module
/// docs). Other commands go straight through.
pub struct Batching<D> {
    inner: Arc<D>,
    max: usize,
    claims: mpsc::UnboundedSender<Queued>,
    completions: mpsc::UnboundedSender<Queued>,
}

impl<D: DbClient> Batching<D> {
    /// Wraps `inner`, with batches of at most `max` commands, each given
    /// up after `timeout` (as a lost reply: the batch task must not wait
    /// forever for an answer that was lost, or every later claim would
    /// wait behind it). Spawns the two batching tasks on the current
    /// runtime; they end when this is dropped.
    #[must_use]
    pub fn new(inner: D, max: usize, timeout: Duration) -> Batching<D> {
        let inner = Arc::new(inner);
        let (claims, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(Arc::clone(&inner), rx, max.max(1), timeout));
        let (completions, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(Arc::clone(&inner), rx, max.max(1), timeout));
        Batching {
            inner,
            max: max.max(1),
            claims,
            completions,
        }
    }
}

impl<D: DbClient> DbClient for Batching<D> {
    async fn call(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        let queue = match op {
            // Batches of one: every command on its own, concurrently.
            _ if self.max == 1 => return self.inner.call(op, by).await,
            DbOp::Claim { .. } => &self.claims,
            DbOp::Complete { .. } => &self.completions,
            _ => return self.inner.call(op, by).await,
        };
        let (tx, rx) = oneshot::channel();
        if queue.send((op, by, tx)).is_err() {
            return Err(Unavailable);
        }
        rx.await.unwrap_or(Err(Unavailable))
    }

    async fn call_batch(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        self.inner.call_batch(ops).await
    }
}

fn run_of(op: &DbOp) -> Option<RunId> {
    match op {
        DbOp::Claim { run, .. } | DbOp::Complete { run, .. } => Some(*run),
        _ => None,
    }
}

async fn batcher<D: DbClient>(
    inner: Arc<D>,
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
        // Up to `max` commands on distinct runs, in arrival order; a second
        // command on a run waits for the next batch.
        let mut runs = BTreeSet::new();
        let mut batch = Vec::new();
        let mut later = VecDeque::new();
        while let Some(q) = queued.pop_front() {
            if batch.len() < max && runs.insert(run_of(&q.0)) {
                batch.push(q);
            } else {
                later.push_back(q);
            }
        }
        queued = later;
        if batch.len() == 1 {
            let (op, by, tx) = batch.pop().expect("one command");
            let answer = tokio::time::timeout(timeout, inner.call(op, by)).await;
            let _ = tx.send(answer.unwrap_or(Err(Unavailable)));
            continue;
        }
        let (ops, answers): (Vec<(DbOp, Issuer)>, Vec<Answer>) =
            batch.into_iter().map(|(op, by, tx)| ((op, by), tx)).unzip();
        match tokio::time::timeout(timeout, inner.call_batch(ops)).await {
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
}
