//! One reader of run events per API process, shared by every open events
//! stream: Postgres's load grows with the runs that change, not with the
//! number of watchers.
//!
//! Every [`POLL`] the reader asks Postgres for the head of every watched
//! run at once ([`query::ReadRunHead`]'s batched form: its status and event
//! count, none of its values), then reads the new events of the runs whose
//! count moved past what some watcher has, one read per such run, and
//! hands each watcher the events after its own position. A watcher whose
//! queue is full (a slow client) keeps its position and is served again on
//! a later poll; nothing waits for it. A watcher ends once it has been
//! handed a terminal event that is its run's last, or its run is gone
//! (retention deleted it).

use super::pg::PgDb;
use pelican_model::db::query;
use pelican_model::events::RunEvent;
use pelican_model::ids::RunId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, mpsc};

/// How often the reader polls the watched runs.
pub const POLL: Duration = Duration::from_millis(100);

/// The most events one read of a run takes (a watcher further behind gets
/// the rest on the next polls).
pub const READ_MAX: usize = 256;

/// The most event data one read of a run takes past its first event: a
/// read holds at most this plus one event (a progress value is at most
/// `--value-bytes-max`), not `READ_MAX` of the largest.
pub const READ_BYTES_MAX: u64 = 1 << 20;

/// Batches a watcher may have queued before the reader skips it.
const QUEUE: usize = 4;

/// Runs whose heads one statement reads at most.
const HEADS_MAX: usize = 5_000;

/// One open events stream: where it is, and where its events go.
struct Watcher {
    /// The last event it was handed.
    after: u32,
    /// Whether that event was terminal.
    terminal: bool,
    tx: mpsc::Sender<Vec<RunEvent>>,
}

/// The watched runs and their watchers, and the cap on open streams.
pub struct Watchers {
    runs: Mutex<BTreeMap<RunId, Vec<Watcher>>>,
    slots: Arc<Semaphore>,
    /// A new watcher wakes the reader: its backlog comes at once.
    wake: Notify,
}

/// What a watcher receives: batches of its run's events, in order,
/// numbered without gaps from after its start; the channel closes when its
/// stream is over. Holding it holds one of the process's stream slots.
pub struct Subscription {
    /// The batches.
    pub events: mpsc::Receiver<Vec<RunEvent>>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Watchers {
    /// No watchers yet, at most `streams_max` at once; the reader runs on
    /// `db` until the process ends.
    #[must_use]
    pub fn start(db: PgDb, streams_max: usize) -> Arc<Watchers> {
        let w = Arc::new(Watchers {
            runs: Mutex::new(BTreeMap::new()),
            slots: Arc::new(Semaphore::new(streams_max)),
            wake: Notify::new(),
        });
        tokio::spawn(read_loop(Arc::downgrade(&w), db));
        w
    }

    /// Follows `run` from after event `after`; `None` when the process has
    /// `streams_max` streams open already.
    pub fn subscribe(&self, run: RunId, after: u32) -> Option<Subscription> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        let (tx, events) = mpsc::channel(QUEUE);
        let w = Watcher {
            after,
            terminal: false,
            tx,
        };
        self.lock().entry(run).or_default().push(w);
        self.wake.notify_one();
        Some(Subscription {
            events,
            _slot: slot,
        })
    }

    /// Streams open now.
    #[must_use]
    pub fn open(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunId, Vec<Watcher>>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The watched runs, each with the earliest position of its watchers
    /// that can take a batch now (closed watchers dropped first): a client
    /// that stopped reading holds no other watcher of its run back. A run
    /// none of whose watchers can take one waits for the next poll.
    fn positions(&self) -> Vec<(RunId, u32)> {
        let mut runs = self.lock();
        runs.retain(|_, ws| {
            ws.retain(|w| !w.tx.is_closed());
            !ws.is_empty()
        });
        runs.iter()
            .filter_map(|(run, ws)| {
                let ready = ws.iter().filter(|w| w.tx.capacity() > 0);
                Some((*run, ready.map(|w| w.after).min()?))
            })
            .collect()
    }

    /// Hands `run`'s new events (those after the earliest watcher's
    /// position; `events` is the run's count of events, `None` once it is
    /// gone) to each of its watchers, and ends those that are done.
    fn deliver(&self, run: RunId, batch: &[RunEvent], events: Option<u32>) {
        let mut runs = self.lock();
        let Some(ws) = runs.get_mut(&run) else { return };
        ws.retain_mut(|w| {
            let Some(events) = events else { return false };
            let new: Vec<RunEvent> = batch.iter().filter(|e| e.seq > w.after).cloned().collect();
            if let Some(last) = new.last() {
                let (after, terminal) = (last.seq, last.kind.is_terminal());
                match w.tx.try_send(new) {
                    Ok(()) => (w.after, w.terminal) = (after, terminal),
                    // Full: served again on a later poll. Closed: dropped.
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                    Err(mpsc::error::TrySendError::Closed(_)) => return false,
                }
            }
            // Done: its last event is terminal and is its run's last.
            !(w.terminal && w.after >= events)
        });
        if ws.is_empty() {
            runs.remove(&run);
        }
    }
}

/// The reader: every [`POLL`], or at once for a new watcher, while the
/// process lives.
async fn read_loop(watchers: std::sync::Weak<Watchers>, db: PgDb) {
    loop {
        let Some(w) = watchers.upgrade() else { return };
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = w.wake.notified() => {}
        }
        let watched = w.positions();
        metrics::gauge!("pelican_events_streams").set(w.open() as f64);
        for chunk in watched.chunks(HEADS_MAX) {
            poll(&w, &db, chunk).await;
        }
    }
}

/// One poll of `watched` (run, earliest position): their heads in one
/// statement, then the new events of each run that has some.
async fn poll(w: &Watchers, db: &PgDb, watched: &[(RunId, u32)]) {
    let heads: Vec<_> = watched
        .iter()
        .map(|(run, _)| query::ReadRunHead { run: *run })
        .collect();
    let statements = metrics::counter!("pelican_events_statements_total");
    statements.increment(1);
    let Ok(heads) = db.query_batch(heads).await else {
        tracing::warn!(runs = watched.len(), "reading the watched runs failed");
        return;
    };
    for (&(run, after), head) in watched.iter().zip(heads) {
        let Some(events) = head.map(|r| r.events) else {
            // Gone: retention deleted it.
            w.deliver(run, &[], None);
            continue;
        };
        if events <= after {
            w.deliver(run, &[], Some(events));
            continue;
        }
        let read = query::ReadEvents {
            run,
            after,
            limit: READ_MAX,
            bytes_max: READ_BYTES_MAX,
        };
        statements.increment(1);
        match db.query(read).await {
            Ok(batch) => w.deliver(run, &batch, Some(events)),
            Err(e) => tracing::warn!(run = run.0, error = %e, "reading events failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_model::events::EventKind;
    use pelican_model::ids::{AttemptNo, Fence};

    fn hub() -> Watchers {
        Watchers {
            runs: Mutex::new(BTreeMap::new()),
            slots: Arc::new(Semaphore::new(8)),
            wake: Notify::new(),
        }
    }

    fn events(from: u32, to: u32, last: EventKind) -> Vec<RunEvent> {
        (from..=to)
            .map(|seq| RunEvent {
                seq,
                kind: if seq == to { last } else { EventKind::Progress },
                attempt: AttemptNo(1),
                fence: Fence(1),
                class: None,
                data: String::new(),
            })
            .collect()
    }

    /// A client that stops reading holds its run's other watchers back
    /// from nothing: the reader reads from the earliest position of the
    /// watchers that can take a batch.
    #[test]
    fn a_stuck_watcher_does_not_hold_the_others_back() {
        let w = hub();
        let run = RunId(1);
        let _stuck = w.subscribe(run, 0).expect("a slot");
        let mut ahead = w.subscribe(run, 500).expect("a slot");
        for n in 0..QUEUE as u32 {
            let batch = events(n * 10 + 1, n * 10 + 10, EventKind::Progress);
            w.deliver(run, &batch, Some(600));
        }
        assert_eq!(w.positions(), [(run, 500)], "only the watcher with room");
        let batch = events(501, 600, EventKind::Succeeded);
        w.deliver(run, &batch, Some(600));
        let got = ahead.events.try_recv().expect("its events");
        assert_eq!((got[0].seq, got.len()), (501, 100));
        assert_eq!(w.open(), 1, "it ended on its run's terminal, last event");
        assert!(w.positions().is_empty(), "the stuck one has no room");
    }

    /// A stream ends when handed a terminal event that is its run's last,
    /// not before: a full read that ends on one is followed by a look at
    /// the run's count; and when its run is deleted.
    #[test]
    fn a_stream_ends_on_its_runs_last_terminal_event_or_its_deletion() {
        let w = hub();
        let mut sub = w.subscribe(RunId(1), 0).expect("a slot");
        w.deliver(RunId(1), &events(1, 256, EventKind::Dead), Some(257));
        assert_eq!(w.open(), 1, "a requeue came after the dead event");
        w.deliver(RunId(1), &events(257, 257, EventKind::Requeued), Some(257));
        assert_eq!(w.open(), 1);
        w.deliver(RunId(1), &[], None);
        assert_eq!(w.open(), 0, "deleted");
        let mut seen = 0;
        while let Ok(b) = sub.events.try_recv() {
            seen += b.len();
        }
        assert_eq!(seen, 257);
        assert!(sub.events.try_recv().is_err());
    }
}
