//! Batching: many deliveries' claims, completions, reads (and
//! acknowledgements), and many submissions' inserts and publications, sent
//! as one request.
//!
//! [`Batching`] wraps a client. Each delivery still sends its own command
//! and waits for its own answer — the protocol's state machines do not
//! change — but the batched kinds of command go to a queue per kind, whose
//! task takes everything queued (up to `max` commands, on distinct runs for
//! the database) and sends it as one request. While a batch is in flight the
//! next one gathers, so batches grow with the load and a lone command waits
//! for nothing.
//!
//! - [`Batching::db`] wraps a [`DbClient`]: [`DbOp::Claim`]s, on distinct
//!   runs, go out as one batch, [`DbOp::Complete`]s as another,
//!   [`DbOp::ReadRun`]s as a third, and a submission's [`DbOp::InsertRun`]
//!   and [`DbOp::MarkPublished`] as two more ([`DbClient::call_batch`]);
//!   the Postgres binding sends each as one statement (its batched form).
//! - [`Batching::stream`] wraps a [`StreamClient`]: [`StreamOp::Ack`]s go
//!   out as one `XACK` of all their IDs per partition, and
//!   [`StreamOp::Publish`]es as one pipeline of `XADD`s
//!   ([`StreamClient::call_batch`]).
//!
//! Why this keeps S1–S10: a batch is what
//! [`pelican_model::Db::execute_batch`] defines, independent commands as if
//! sent concurrently; fused into one statement on distinct runs, they run
//! back to back with nothing in between — one of the interleavings the
//! model checker explores for the same commands sent concurrently. One
//! `XACK` of many IDs is the same: Redis removes them one after another
//! with nothing in between, as if each delivery's `XACK` had arrived back
//! to back. Its answer counts the lot, so a delivery learns only that its
//! ID is no longer pending (the protocol reads no more of it; see
//! [`fused_acks`]). A pipeline of `XADD`s is even less: each is its own
//! command, and other clients' commands may run between them. Each role
//! has at most one command outstanding, so no role's own order changes. A
//! batch that fails or whose answer is lost fails every command in it,
//! each as a lost request or a lost reply (a pipeline cut short applied a
//! prefix of its commands, and on a cluster one partition's `XACK` may be
//! applied while another's is lost: lost replies), which the fault model
//! already covers. The simulator runs this very code
//! against the model's servers (one request per batch, lost like any
//! other), and the conformance tests compare the batched statements with
//! their model twin, [`pelican_model::Db::execute_batch`].

use super::{DbClient, StreamClient, StreamResult};
use pelican_model::ids::RunId;
use pelican_model::protocol::{DbOp, DbReply, StreamOp, StreamReply, Unavailable};
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
    claims: Option<Queue<Issued, DbReply>>,
    completions: Option<Queue<Issued, DbReply>>,
    reads: Option<Queue<Issued, DbReply>>,
    inserts: Option<Queue<Issued, DbReply>>,
    marks: Option<Queue<Issued, DbReply>>,
    acks: Option<Queue<StreamOp, StreamResult>>,
    publishes: Option<Queue<StreamOp, StreamResult>>,
}

/// A statement with who issued it (see [`DbClient::call_as`]).
type Issued = (DbOp, Issuer);

/// A command waiting in a queue, with where its answer goes.
type Queued<O, R> = (O, oneshot::Sender<Result<R, Unavailable>>);

/// The sending end of one kind's queue; its task ends when this is dropped.
struct Queue<O, R> {
    tx: mpsc::UnboundedSender<Queued<O, R>>,
}

impl<O: Send + 'static, R: Send + 'static> Queue<O, R> {
    fn spawn(sink: impl Sink<O, R>, max: usize, timeout: Duration) -> Queue<O, R> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(sink, rx, max.max(1), timeout));
        Queue { tx }
    }

    /// Queues `op` and waits for its answer ("no answer" if the queue's
    /// task is gone).
    async fn call(&self, op: O) -> Result<R, Unavailable> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((op, tx)).is_err() {
            return Err(Unavailable);
        }
        rx.await.unwrap_or(Err(Unavailable))
    }
}

impl<C> Batching<C> {
    /// The wrapped client, for what it does besides the protocol's
    /// commands.
    #[must_use]
    pub fn inner(&self) -> &C {
        &self.inner
    }
}

impl<D: DbClient> Batching<D> {
    /// Wraps a database client: claims, completions, reads, inserts and
    /// publication marks in batches of at most `max`, each given up after
    /// `timeout` (as a lost reply: the batch task must not wait forever for
    /// an answer that was lost, or every later claim would wait behind it).
    /// `max == 1` sends every command on its own. Spawns the five batching
    /// tasks on the current runtime; they end when this is dropped.
    #[must_use]
    pub fn db(inner: D, max: usize, timeout: Duration) -> Batching<D> {
        let inner = Arc::new(inner);
        let queue = || (max > 1).then(|| Queue::spawn(Db(inner.clone()), max, timeout));
        Batching {
            claims: queue(),
            completions: queue(),
            reads: queue(),
            inserts: queue(),
            marks: queue(),
            acks: None,
            publishes: None,
            inner: inner.clone(),
        }
    }
}

impl<S: StreamClient> Batching<S> {
    /// Wraps a stream client: acknowledgements pipelined, and publications
    /// apart from them, at most `max` in one round trip, each pipeline given
    /// up after `timeout`. `max == 1` sends every command on its own.
    /// Spawns the two batching tasks on the current runtime; they end when
    /// this is dropped.
    #[must_use]
    pub fn stream(inner: S, max: usize, timeout: Duration) -> Batching<S> {
        let inner = Arc::new(inner);
        let queue = || (max > 1).then(|| Queue::spawn(Stream(inner.clone()), max, timeout));
        Batching {
            claims: None,
            completions: None,
            reads: None,
            inserts: None,
            marks: None,
            acks: queue(),
            publishes: queue(),
            inner,
        }
    }
}

impl<D> Batching<D> {
    fn db_queue(&self, op: &DbOp) -> Option<&Queue<Issued, DbReply>> {
        match op {
            DbOp::Claim { .. } => self.claims.as_ref(),
            DbOp::Complete { .. } => self.completions.as_ref(),
            DbOp::ReadRun { .. } => self.reads.as_ref(),
            DbOp::InsertRun { .. } => self.inserts.as_ref(),
            DbOp::MarkPublished { .. } => self.marks.as_ref(),
            _ => None,
        }
    }

    fn stream_queue(&self, op: &StreamOp) -> Option<&Queue<StreamOp, StreamResult>> {
        match op {
            StreamOp::Ack { .. } => self.acks.as_ref(),
            StreamOp::Publish { .. } => self.publishes.as_ref(),
            _ => None,
        }
    }
}

impl<D: DbClient> DbClient for Batching<D> {
    /// A queued command's wait is bounded: each request of its queue is
    /// given up after the queue's timeout, and the commands ahead of it
    /// are at most one per role.
    fn bounds_wait(&self, op: &DbOp) -> bool {
        self.db_queue(op).is_some()
    }

    async fn call(&self, op: DbOp) -> Result<DbReply, Unavailable> {
        self.call_as(op, Issuer::default()).await
    }

    async fn call_batch(&self, ops: Vec<DbOp>) -> Result<Vec<DbReply>, Unavailable> {
        self.inner.call_batch(ops).await
    }

    async fn call_as(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        match self.db_queue(&op) {
            Some(queue) => queue.call((op, by)).await,
            // Boxed: the binding's own future (sqlx's, about 9 KB) would
            // otherwise size every call's future, and so every delivery's
            // task, which is moved and zeroed once per delivery; the
            // commands that come this way (heartbeats, steps) are the rare
            // ones.
            None => Box::pin(self.inner.call_as(op, by)).await,
        }
    }

    async fn call_batch_as(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        self.inner.call_batch_as(ops).await
    }
}

impl<S: StreamClient> StreamClient for Batching<S> {
    /// As the database's (see there).
    fn bounds_wait(&self, op: &StreamOp) -> bool {
        self.stream_queue(op).is_some()
    }

    async fn call(&self, op: StreamOp) -> Result<StreamResult, Unavailable> {
        match self.stream_queue(&op) {
            Some(queue) => queue.call(op).await,
            // Boxed, as the database's (see there).
            None => Box::pin(self.inner.call(op)).await,
        }
    }

    async fn call_batch(&self, ops: Vec<StreamOp>) -> Result<Vec<StreamResult>, Unavailable> {
        self.inner.call_batch(ops).await
    }
}

/// Where a queue's task sends its commands: `O`s answered by `R`s.
trait Sink<O, R>: Send + Sync + 'static {
    /// The run a command is on: commands on one run never share a batch.
    fn run(op: &O) -> Option<RunId>;
    /// Sends a lone command.
    fn one(&self, op: O) -> impl Future<Output = Result<R, Unavailable>> + Send;
    /// Sends a batch as one request.
    fn many(&self, ops: Vec<O>) -> impl Future<Output = Result<Vec<R>, Unavailable>> + Send;
}

struct Db<D>(Arc<D>);
struct Stream<S>(Arc<S>);

impl<D: DbClient> Sink<Issued, DbReply> for Db<D> {
    /// Writes on one run never share a batch; reads of one run may.
    fn run((op, _): &Issued) -> Option<RunId> {
        match op {
            DbOp::Claim { run, .. }
            | DbOp::Complete { run, .. }
            | DbOp::InsertRun { run, .. }
            | DbOp::MarkPublished { run, .. } => Some(*run),
            _ => None,
        }
    }
    fn one(&self, (op, by): Issued) -> impl Future<Output = Result<DbReply, Unavailable>> {
        self.0.call_as(op, by)
    }
    fn many(&self, ops: Vec<Issued>) -> impl Future<Output = Result<Vec<DbReply>, Unavailable>> {
        self.0.call_batch_as(ops)
    }
}

impl<S: StreamClient> Sink<StreamOp, StreamResult> for Stream<S> {
    /// Acks of one entry, or publications of one run, may share a
    /// pipeline: each is its own command.
    fn run(_: &StreamOp) -> Option<RunId> {
        None
    }
    fn one(&self, op: StreamOp) -> impl Future<Output = Result<StreamResult, Unavailable>> {
        self.0.call(op)
    }
    async fn many(&self, ops: Vec<StreamOp>) -> Result<Vec<StreamResult>, Unavailable> {
        match fused_acks(&ops) {
            Some((fused, of)) => {
                let count = fused.len();
                let replies = self.0.call_batch(fused).await?;
                if replies.len() != count {
                    return Err(Unavailable);
                }
                Ok(of.iter().map(|&g| each_ack(&replies[g])).collect())
            }
            None => self.0.call_batch(ops).await,
        }
    }
}

/// A batch of acknowledgements as one `XACK` per partition: the fused
/// commands, and for each acknowledgement the index of the one that carries
/// its IDs. `None` unless every command is an acknowledgement.
fn fused_acks(ops: &[StreamOp]) -> Option<(Vec<StreamOp>, Vec<usize>)> {
    let mut fused: Vec<StreamOp> = Vec::new();
    let mut of = Vec::with_capacity(ops.len());
    for op in ops {
        let StreamOp::Ack { ids } = op else {
            return None;
        };
        let partition = StreamOp::ack_partition(ids);
        let at = fused.iter().position(
            |f| matches!(f, StreamOp::Ack { ids } if StreamOp::ack_partition(ids) == partition),
        );
        let at = at.unwrap_or_else(|| {
            fused.push(StreamOp::Ack { ids: Vec::new() });
            fused.len() - 1
        });
        if let StreamOp::Ack { ids: all } = &mut fused[at] {
            all.extend_from_slice(ids);
        }
        of.push(at);
    }
    Some((fused, of))
}

/// One acknowledgement's answer from its fused `XACK`'s: an error as the
/// fused command's. A count of the lot does not say whose IDs were still
/// pending, so each is told one when any was and none otherwise: the
/// protocol reads only that the `XACK` was answered.
fn each_ack(reply: &StreamResult) -> StreamResult {
    match reply {
        Ok(StreamReply::Acked(n)) => Ok(StreamReply::Acked(u64::from(*n > 0))),
        other => other.clone(),
    }
}

async fn batcher<O, R, K: Sink<O, R>>(
    sink: K,
    mut rx: mpsc::UnboundedReceiver<Queued<O, R>>,
    max: usize,
    timeout: Duration,
) {
    // The buffers live as long as the task: a batch's worth of pushes into
    // new ones cost a growth and a copy per few commands.
    let (mut queued, mut later) = (VecDeque::new(), VecDeque::new());
    let mut batch = Vec::new();
    let mut runs = BTreeSet::new();
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
        runs.clear();
        while let Some(q) = queued.pop_front() {
            if batch.len() < max && K::run(&q.0).is_none_or(|run| runs.insert(run)) {
                batch.push(q);
            } else {
                later.push_back(q);
            }
        }
        std::mem::swap(&mut queued, &mut later);
        if batch.len() == 1 {
            let (op, tx) = batch.pop().expect("one command");
            let answer = tokio::time::timeout(timeout, sink.one(op)).await;
            let _ = tx.send(answer.unwrap_or(Err(Unavailable)));
            continue;
        }
        let (ops, answers): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        match tokio::time::timeout(timeout, sink.many(ops)).await {
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

#[cfg(test)]
mod tests {
    use super::{Db, Sink, Stream, each_ack, fused_acks};
    use pelican_model::ids::{Dispatch, EntryId, RunId, WorkerId};
    use pelican_model::protocol::{DbOp, DbReply, StreamOp, Unavailable};
    use pelican_model::world::Issuer;

    /// A client that is never called: only the batching rules are tested.
    struct Never;

    impl crate::DbClient for Never {
        async fn call(&self, _: DbOp) -> Result<DbReply, Unavailable> {
            unreachable!("the rules call no client")
        }
    }

    impl crate::StreamClient for Never {
        async fn call(&self, _: StreamOp) -> Result<crate::StreamResult, Unavailable> {
            unreachable!("the rules call no client")
        }
    }

    #[test]
    fn only_database_writes_on_a_run_exclude_each_other() {
        let claim = DbOp::Claim {
            run: RunId(7),
            dispatch: Dispatch(1),
            entry: EntryId::new(1, 0),
            worker: WorkerId(1).consumer(),
            lease_ms: 2_000,
        };
        let by = Issuer::default();
        assert_eq!(<Db<Never> as Sink<_, _>>::run(&(claim, by)), Some(RunId(7)));
        let read = DbOp::ReadRun { run: RunId(7) };
        assert_eq!(
            <Db<Never> as Sink<_, _>>::run(&(read, by)),
            None,
            "reads of one run may share a batch"
        );
        let ack = StreamOp::Ack {
            ids: vec![EntryId::new(1, 0)],
        };
        assert_eq!(
            <Stream<Never> as Sink<_, _>>::run(&ack),
            None,
            "acks of one entry may share an XACK"
        );
    }

    #[test]
    fn acknowledgements_fuse_into_one_xack_per_partition() {
        let ack = |partition, seq| StreamOp::Ack {
            ids: vec![EntryId {
                partition,
                ..EntryId::new(1, seq)
            }],
        };
        let ops = [ack(0, 1), ack(2, 1), ack(0, 2), ack(0, 1)];
        let (fused, of) = fused_acks(&ops).expect("acks only");
        assert_eq!(of, [0, 1, 0, 0]);
        let ids = |op: &StreamOp| match op {
            StreamOp::Ack { ids } => ids.iter().map(|i| (i.partition, i.seq)).collect::<Vec<_>>(),
            _ => unreachable!(),
        };
        assert_eq!(ids(&fused[0]), [(0, 1), (0, 2), (0, 1)]);
        assert_eq!(ids(&fused[1]), [(2, 1)]);
        let locate = StreamOp::Locate {
            id: EntryId::new(1, 0),
        };
        assert!(fused_acks(&[ack(0, 1), locate]).is_none(), "acks only");
        use pelican_model::protocol::StreamReply::Acked;
        assert_eq!(each_ack(&Ok(Acked(3))), Ok(Acked(1)));
        assert_eq!(each_ack(&Ok(Acked(0))), Ok(Acked(0)));
    }
}
