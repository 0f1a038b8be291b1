//! The nemesis: the faults a seed strikes during its fault phase (kills,
//! pauses, partitions, Redis and Postgres restarts, a wipe, trims,
//! duplicate and malformed publications, cancels), each drawn from the
//! seed's random numbers in a fixed order, mended after a while, and all
//! healed at the phase's end.

use crate::oracle::{Oracle, Shared, lock};
use crate::scenario::{FaultMix, Scenario};
use crate::seed::ApiCommand;
use madsim::net::NetSim;
use madsim::rand::Rng;
use madsim::runtime::Handle;
use madsim::task::{AbortHandle, NodeId};
use pelican_model::ids::{Dispatch, EntryId, RunId, WorkerId};
use pelican_model::protocol::{JobEntry, StreamOp};
use pelican_model::stream::Trim;
use pelican_model::world::Redis;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What the nemesis has broken and not yet mended.
#[derive(Default)]
pub(crate) struct Damage {
    pub(crate) killed: BTreeSet<u32>,
    pub(crate) paused: BTreeSet<u32>,
    pub(crate) clogged: BTreeSet<(NodeId, NodeId)>,
    pub(crate) redis_down: bool,
    pub(crate) pg_down: bool,
    /// The tasks that will mend it: aborted when the seed ends, as some may
    /// still be waiting.
    pub(crate) mends: Vec<AbortHandle>,
}

pub(crate) struct Nodes {
    pub(crate) redis: NodeId,
    pub(crate) pg: NodeId,
    pub(crate) workers: Vec<NodeId>,
}

/// Faults, one every `fault_every_ms` or so, until the fault phase ends.
pub(crate) async fn nemesis(
    oracle: &Shared,
    scenario: &Scenario,
    mix: &FaultMix,
    nodes: &Arc<Nodes>,
    damage: &Arc<Mutex<Damage>>,
    api: &mpsc::UnboundedSender<ApiCommand>,
) {
    let mut rng = madsim::rand::thread_rng();
    let lease_ms = scenario.driver.policy.lease_ms;
    let weights = [
        mix.kill,
        mix.pause,
        mix.partition,
        mix.redis_restart,
        mix.redis_wipe,
        mix.pg_restart,
        mix.trim,
        mix.duplicate,
        mix.malformed,
        mix.cancel,
    ];
    let total: u32 = weights.iter().sum();
    loop {
        let gap = rng.gen_range(mix.fault_every_ms / 2..=mix.fault_every_ms * 3 / 2);
        madsim::time::sleep(Duration::from_millis(gap)).await;
        if lock(oracle).elapsed_ms() >= scenario.fault_phase_ms {
            return;
        }
        if total == 0 {
            continue;
        }
        let mut pick = rng.gen_range(0..total);
        let mut fault = 0;
        while pick >= weights[fault] {
            pick -= weights[fault];
            fault += 1;
        }
        let w = rng.gen_range(0..u32::try_from(nodes.workers.len()).expect("few workers"));
        let node = nodes.workers[w as usize];
        if fault == 0 {
            let d = damage.lock().expect("single-threaded");
            if !d.killed.contains(&w) && !d.paused.contains(&w) {
                drop(d);
                let back = rng.gen_range(200..3_000);
                kill_worker(w, nodes, damage, oracle, "", back);
            }
            continue;
        }
        let mut d = damage.lock().expect("single-threaded");
        let mut o = lock(oracle);
        let mut strike = Strike {
            rng: &mut rng,
            w,
            node,
            nodes,
            damage,
            oracle,
        };
        match fault {
            1 => strike.pause(&mut d, &mut o, lease_ms),
            2 => strike.partition(&mut d, &mut o),
            3 | 4 => strike.redis_down(&mut d, &mut o, fault == 4),
            5 => strike.pg_down(&mut d, &mut o),
            6 => strike.trim(&mut o),
            7 => strike.duplicate(&mut o),
            8 => strike.malformed(&mut o),
            _ => strike.cancel(&mut o, api, scenario.runs),
        }
    }
}

/// One fault the nemesis strikes, to worker `w` (node `node`) or to the
/// servers, its random choices drawn from `rng` in a fixed order (the
/// schedules of recorded seeds depend on it). A fault that cannot strike
/// now (its target already down) does nothing.
pub(crate) struct Strike<'a, R: Rng> {
    rng: &'a mut R,
    w: u32,
    node: NodeId,
    nodes: &'a Arc<Nodes>,
    damage: &'a Arc<Mutex<Damage>>,
    oracle: &'a Shared,
}

impl<R: Rng> Strike<'_, R> {
    /// Pauses the worker past its lease.
    fn pause(&mut self, d: &mut Damage, o: &mut Oracle, lease_ms: u64) {
        let (w, node) = (self.w, self.node);
        if d.killed.contains(&w) || d.paused.contains(&w) {
            return;
        }
        Handle::current().pause(node);
        d.paused.insert(w);
        o.count("pauses");
        o.note("nemesis", format!("pause w{w}"));
        let back = lease_ms + self.rng.gen_range(0..3_000);
        mend_later(back, self.damage, d, self.oracle, move |d, o| {
            if d.paused.remove(&w) {
                Handle::current().resume(node);
                o.note("nemesis", format!("resume w{w}"));
            }
        });
    }

    /// Cuts the worker off from Redis or Postgres for a while.
    fn partition(&mut self, d: &mut Damage, o: &mut Oracle) {
        let (w, node) = (self.w, self.node);
        let (target, name) = if self.rng.gen_bool(0.5) {
            (self.nodes.redis, "redis")
        } else {
            (self.nodes.pg, "postgres")
        };
        let net = NetSim::current();
        net.clog_link(node, target);
        net.clog_link(target, node);
        d.clogged.insert((node, target));
        o.count("partitions");
        o.note("nemesis", format!("partition w{w} from {name}"));
        let back = self.rng.gen_range(300..4_000);
        mend_later(back, self.damage, d, self.oracle, move |d, o| {
            if d.clogged.remove(&(node, target)) {
                let net = NetSim::current();
                net.unclog_link(node, target);
                net.unclog_link(target, node);
                o.note("nemesis", format!("heal partition w{w} / {name}"));
            }
        });
    }

    /// Restarts Redis: with what it last fsynced, or (`wipe`) with nothing.
    fn redis_down(&mut self, d: &mut Damage, o: &mut Oracle, wipe: bool) {
        if d.redis_down {
            return;
        }
        Handle::current().kill(self.nodes.redis);
        d.redis_down = true;
        if wipe {
            o.world.redis_wiped();
            o.fsynced = Redis::partitioned(o.policy.partitions).into();
            o.count("redis_wipes");
            o.note(
                "nemesis",
                "restart Redis with nothing: stream and group gone".into(),
            );
        } else {
            o.world.redis = o.fsynced.clone();
            o.count("redis_restarts");
            o.note("nemesis", "restart Redis, keeping its last fsync".into());
        }
        let redis = self.nodes.redis;
        let back = self.rng.gen_range(100..2_000);
        mend_later(back, self.damage, d, self.oracle, move |d, o| {
            if std::mem::take(&mut d.redis_down) {
                Handle::current().restart(redis);
                o.note("nemesis", "Redis is back".into());
            }
        });
    }

    /// Restarts Postgres.
    fn pg_down(&mut self, d: &mut Damage, o: &mut Oracle) {
        if d.pg_down {
            return;
        }
        Handle::current().kill(self.nodes.pg);
        d.pg_down = true;
        o.count("pg_restarts");
        o.note("nemesis", "restart Postgres".into());
        let pg = self.nodes.pg;
        let back = self.rng.gen_range(200..3_000);
        mend_later(back, self.damage, d, self.oracle, move |d, o| {
            if std::mem::take(&mut d.pg_down) {
                Handle::current().restart(pg);
                o.note("nemesis", "Postgres is back".into());
            }
        });
    }

    /// Deletes a pending entry of a partition, or trims the partition to a
    /// few entries.
    fn trim(&mut self, o: &mut Oracle) {
        let p = self.rng.gen_range(0..o.policy.partitions.max(1));
        let jobs = o.world.redis.part_mut(p);
        let pending: Vec<EntryId> = jobs
            .group
            .as_ref()
            .map(|g| g.pel.keys().copied().collect())
            .unwrap_or_default();
        if self.rng.gen_bool(0.5) && !pending.is_empty() {
            let id = pending[self.rng.gen_range(0..pending.len())];
            jobs.xdel(&[id]);
            let id = id.in_partition(p);
            o.note("nemesis", format!("XDEL pending {id}"));
        } else {
            let keep = self.rng.gen_range(0..3);
            let n = jobs.xtrim(Trim::MaxLen(keep));
            o.note(
                "nemesis",
                format!("XTRIM MAXLEN {keep} partition {p}: {n} removed"),
            );
        }
        o.count("trims");
    }

    /// Publishes a run's current dispatch again, in any partition (a run's
    /// entries may sit in another partition than its own, after
    /// `partitions` grew).
    fn duplicate(&mut self, o: &mut Oracle) {
        let runs: Vec<(RunId, Dispatch)> = o
            .world
            .db
            .runs
            .values()
            .map(|r| (r.run_id, r.dispatch))
            .collect();
        if runs.is_empty() {
            return;
        }
        let (run, dispatch) = runs[self.rng.gen_range(0..runs.len())];
        let now = pelican_real::now();
        let partition = self.rng.gen_range(0..o.policy.partitions.max(1));
        let entry = JobEntry::Job { run, dispatch };
        let publish = StreamOp::Publish {
            partition,
            entry,
            now,
        };
        let _ = o.stream("nemesis", &publish);
        o.count("duplicates");
    }

    /// Publishes a malformed entry, or one of a run that does not exist.
    fn malformed(&mut self, o: &mut Oracle) {
        let entry = if self.rng.gen_bool(0.5) {
            JobEntry::Malformed {
                reason: "missing field run_id".into(),
            }
        } else {
            JobEntry::Job {
                run: RunId(1_000_000 + self.rng.gen_range(0..1_000)),
                dispatch: Dispatch(1),
            }
        };
        let now = pelican_real::now();
        let partition = self.rng.gen_range(0..o.policy.partitions.max(1));
        let publish = StreamOp::Publish {
            partition,
            entry,
            now,
        };
        let _ = o.stream("nemesis", &publish);
        o.count("malformed");
    }

    /// Asks the API to cancel one of the `runs` planned runs.
    fn cancel(&mut self, o: &mut Oracle, api: &mpsc::UnboundedSender<ApiCommand>, runs: u32) {
        let run = RunId(self.rng.gen_range(1..=u64::from(runs)));
        let _ = api.send(ApiCommand::Cancel(run));
        o.count("cancels_sent");
        o.note("nemesis", format!("cancel {run}"));
    }
}

/// Kills worker `w` (unless it is down already, or paused and `why` is
/// empty: the nemesis's kills leave paused workers alone) and restarts it
/// after `back_ms`. A worker asking to die at a step boundary dies even if
/// it was paused since: its job waits for that.
pub(crate) fn kill_worker(
    w: u32,
    nodes: &Nodes,
    damage: &Arc<Mutex<Damage>>,
    oracle: &Shared,
    why: &str,
    back_ms: u64,
) {
    let mut d = damage.lock().expect("single-threaded");
    if d.killed.contains(&w) || (why.is_empty() && d.paused.contains(&w)) {
        return;
    }
    d.paused.remove(&w);
    let node = nodes.workers[w as usize];
    Handle::current().kill(node);
    d.killed.insert(w);
    let mut o = lock(oracle);
    o.world.worker_crashed(WorkerId(w));
    o.count(if why.is_empty() {
        "kills"
    } else {
        "step_boundary_kills"
    });
    o.note("nemesis", format!("kill w{w} {why}").trim_end().to_owned());
    drop(o);
    mend_later(back_ms, damage, &mut d, oracle, move |d, o| {
        if d.killed.remove(&w) {
            Handle::current().restart(node);
            o.note("nemesis", format!("restart w{w}"));
        }
    });
}

/// Mends damage after `ms`, unless healing mended it first. `held` is
/// `damage`, locked by the caller; the task's handle goes to its
/// [`Damage::mends`].
pub(crate) fn mend_later(
    ms: u64,
    damage: &Arc<Mutex<Damage>>,
    held: &mut Damage,
    oracle: &Shared,
    mend: impl FnOnce(&mut Damage, &mut Oracle) + Send + 'static,
) {
    let (damage, oracle) = (damage.clone(), oracle.clone());
    let task = madsim::task::spawn(async move {
        madsim::time::sleep(Duration::from_millis(ms)).await;
        let mut d = damage.lock().expect("single-threaded");
        mend(&mut d, &mut lock(&oracle));
    });
    held.mends.push(task.abort_handle());
}

/// Ends every fault: restart, resume, reconnect; no more lost messages.
pub(crate) fn heal(oracle: &Shared, nodes: &Nodes, damage: &Arc<Mutex<Damage>>) {
    let h = Handle::current();
    let net = NetSim::current();
    let mut d = damage.lock().expect("single-threaded");
    let mut o = lock(oracle);
    o.faulty = false;
    for w in std::mem::take(&mut d.killed) {
        h.restart(nodes.workers[w as usize]);
    }
    for w in std::mem::take(&mut d.paused) {
        h.resume(nodes.workers[w as usize]);
    }
    for (a, b) in std::mem::take(&mut d.clogged) {
        net.unclog_link(a, b);
        net.unclog_link(b, a);
    }
    if std::mem::take(&mut d.redis_down) {
        h.restart(nodes.redis);
    }
    if std::mem::take(&mut d.pg_down) {
        h.restart(nodes.pg);
    }
    o.note("nemesis", "healed: every fault ends".into());
}
