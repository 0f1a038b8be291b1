//! Symmetry reduction: relabeling the workers, and the fingerprints that
//! give every relabeling of a state one value.

use super::{Proc, State, WorkerProc};
use pelican_model::db::Db;
use pelican_model::ids::{EntryId, WorkerId};
use pelican_model::world::{Redis, World};
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;

/// Worker `i`'s process hashed as if it were worker 0 (computed once per
/// version of the process, for the place it holds).
fn process_fingerprint(w: &Proc, i: usize, n: usize) -> u64 {
    let compute = |w: &WorkerProc| {
        let mut h = fp_hasher();
        if i == 0 {
            w.hash(&mut h);
        } else {
            let mut w = w.clone();
            w.relabel(i, &permutations(n)[swap_index(n, i)]);
            w.hash(&mut h);
        }
        h.finish()
    };
    match w.memo(|v| (i, compute(v))) {
        (at, fp) if at == i => fp,
        _ => compute(w),
    }
}

impl WorkerProc {
    /// Worker `from`'s process as worker `perm[from]`'s (see
    /// [`State::permuted`]): every consumer name it holds renamed.
    fn relabel(&mut self, from: usize, perm: &[u32]) {
        let to = WorkerId(perm[from]);
        if let Some(d) = self.delivery.as_mut() {
            d.relabel(to);
        }
        self.reclaimer.relabel(to);
        for (_, c) in &mut self.outstanding {
            c.rename_consumer(&|name| rename(name, perm));
        }
    }
}

/// Worker `i`'s consumer name, for worker `perm[i]`; other names unchanged.
fn rename(name: &str, perm: &[u32]) -> String {
    match worker_number(name, perm) {
        Some(j) => WorkerId(j).consumer(),
        None => name.to_owned(),
    }
}

/// `perm[i]` if `name` is worker `i`'s consumer name.
fn worker_number(name: &str, perm: &[u32]) -> Option<u32> {
    let i = match name.as_bytes() {
        // The checker's workers are w0..w9: the fast path.
        [b'w', d] if d.is_ascii_digit() => usize::from(d - b'0'),
        _ => name.strip_prefix('w')?.parse::<usize>().ok()?,
    };
    perm.get(i).copied()
}

/// Hashes a consumer name as worker `perm[i]`'s if it is worker `i`'s.
fn hash_consumer<H: Hasher>(name: &str, perm: &[u32], h: &mut H) {
    match worker_number(name, perm) {
        Some(j) => (0u8, j).hash(h),
        None => (1u8, name).hash(h),
    }
}

/// Symmetry: workers are interchangeable, so states that differ only in
/// which worker is which are one. [`State::fingerprint`] gives all of them
/// one fingerprint — the smallest over every relabeling of the workers — so
/// the checker keeps one of them. A relabeling is a symmetry of the model
/// (the test `worker_relabeling_is_a_symmetry` checks it along random
/// walks): it maps enabled actions to enabled actions, successors to
/// successors, and no property tells relabeled states apart. Hence every
/// verdict is unchanged, and a path found in the reduced space is a path of
/// the model (the checker continues from the state it reached, never from a
/// relabeled one).
impl State {
    /// The same state with worker `i` renamed `perm[i]` (fingerprinted with
    /// or without `symmetry`).
    #[must_use]
    pub fn permuted(&self, perm: &[u32], symmetry: bool) -> State {
        let mut next = self.clone();
        let mut workers: Vec<Option<Proc>> = vec![None; self.workers.len()];
        for (i, w) in self.workers.iter().enumerate() {
            let mut w = WorkerProc::clone(w);
            w.relabel(i, perm);
            workers[perm[i] as usize] = Some(Proc::new(w));
        }
        next.workers = workers
            .into_iter()
            .map(|w| w.expect("a permutation"))
            .collect();
        for jobs in &mut next.world.redis.jobs {
            if let Some(g) = jobs.group.as_mut() {
                for p in g.pel.values_mut() {
                    p.consumer = rename(&p.consumer, perm);
                }
                g.consumers = g
                    .consumers
                    .iter()
                    .map(|(c, seen)| (rename(c, perm), *seen))
                    .collect();
            }
        }
        for a in next.world.db.attempts.values_mut() {
            a.worker = rename(&a.worker, perm);
        }
        next.world.trimmed_owed = self
            .world
            .trimmed_owed
            .iter()
            .map(|(w, ids)| (WorkerId(perm[w.0 as usize]), ids.clone()))
            .collect();
        next.fp = next.fingerprint(symmetry);
        next
    }

    /// The fingerprint: with `symmetry`, the smallest of
    /// [`State::fingerprint_as`] over every relabeling of the workers (one
    /// value for the whole symmetry class); without, the identity's.
    #[must_use]
    pub fn fingerprint(&self, symmetry: bool) -> u64 {
        let mut common = fp_hasher();
        self.hash_unlabeled(&mut common);
        let procs = self.process_fingerprints();
        let perms = permutations(self.workers.len());
        let mut best = self.hash_labeled(&perms[0], &procs, common.clone());
        if symmetry {
            for perm in &perms[1..] {
                best = best.min(self.hash_labeled(perm, &procs, common.clone()));
            }
        }
        best
    }

    /// The fingerprint `self.permuted(perm)` has without symmetry, computed
    /// without building it.
    #[must_use]
    pub fn fingerprint_as(&self, perm: &[u32]) -> u64 {
        let mut common = fp_hasher();
        self.hash_unlabeled(&mut common);
        self.hash_labeled(perm, &self.process_fingerprints(), common)
    }

    /// Each worker process's hash as if it were worker 0. A process names
    /// no worker but itself, and its place in [`State::workers`] says which
    /// it is, so this loses nothing; and a relabeling of the workers only
    /// reorders these hashes.
    fn process_fingerprints(&self) -> Vec<u64> {
        let n = self.workers.len();
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| process_fingerprint(w, i, n))
            .collect()
    }

    /// Hashes every field that names no worker. The destructuring lists
    /// every field, so that a new one cannot be forgotten here. Redis,
    /// Postgres and the entries' history are hashed once per version
    /// ([`Shared::memo`]): most steps leave one of them as the state before
    /// had it.
    ///
    /// [`Shared::memo`]: pelican_model::shared::Shared::memo
    fn hash_unlabeled(&self, h: &mut FpHasher) {
        let State {
            world,
            workers: _, // labeled
            api,
            budget,
            seen,
            derived: _, // a function of the rest
            fp: _,
        } = self;
        let World {
            redis,
            db,
            accepted,
            entries,
            quarantined,
            effects,
            retired,
            trimmed_owed: _, // labeled
            spent_claims,
            permits,
            tokens,
            keys,
            violations,
        } = world;
        (spent_claims, permits, tokens, keys).hash(h);
        h.write_u64(redis.memo(|r| finish(r, hash_redis_unlabeled)));
        h.write_u64(db.memo(|db| finish(db, hash_db_unlabeled)));
        h.write_u64(entries.memo(|e| finish(e, Hash::hash)));
        (accepted, quarantined, effects, retired, violations).hash(h);
        (api, budget, seen).hash(h);
    }

    /// Finishes `h` with every fingerprinted field that names a worker (the
    /// attempts' workers are not: see [`hash_db_unlabeled`]), each as if worker
    /// `i` were worker `perm[i]` (`procs`: [`State::process_fingerprints`]).
    fn hash_labeled(&self, perm: &[u32], procs: &[u64], mut h: FpHasher) -> u64 {
        for g in self
            .world
            .redis
            .jobs
            .iter()
            .filter_map(|j| j.group.as_ref())
        {
            for p in g.pel.values() {
                hash_consumer(&p.consumer, perm, &mut h);
            }
            // Other names as they come (relabeling moves none of them), then
            // the workers' names as bit sets (known, and seen since the last
            // tick), which do not depend on the order the relabeling puts
            // them in.
            let (mut known, mut seen): (u128, u128) = (0, 0);
            for (c, at) in &g.consumers {
                match worker_number(c, perm) {
                    Some(j) if j < 128 => {
                        known |= 1 << j;
                        seen |= u128::from(at.as_ms() > 0) << j;
                    }
                    _ => (c, at).hash(&mut h),
                }
            }
            (known, seen).hash(&mut h);
        }
        let owed = &self.world.trimmed_owed;
        let mut relabeled: Vec<(u32, &BTreeSet<EntryId>)> = owed
            .iter()
            .map(|(w, ids)| (perm.get(w.0 as usize).copied().unwrap_or(w.0), ids))
            .collect();
        relabeled.sort_unstable_by_key(|(w, _)| *w);
        relabeled.hash(&mut h);
        procs.len().hash(&mut h);
        for j in 0..procs.len() {
            let i = perm
                .iter()
                .position(|p| *p as usize == j)
                .expect("a permutation");
            h.write_u64(procs[i]);
        }
        h.finish()
    }
}

/// `hash(value)` with a fresh fingerprint hasher.
fn finish<T>(value: &T, hash: fn(&T, &mut FpHasher)) -> u64 {
    let mut h = fp_hasher();
    hash(value, &mut h);
    h.finish()
}

/// Hashes Redis but for the consumer names (labeled) and its history
/// counters.
///
/// The counters (`entries-added`, `max-deleted-entry-id`, `entries-read`
/// and the PEL's delivery counts) are written by the model's commands and
/// read only by XINFO's lag and XPENDING's rows: the queue health that the
/// API and the CLI report ([`StreamOp::Queue`]), which no role of the model
/// sends and no property reads. States that differ only in them have the
/// same actions, properties and futures, so they are one state (the test
/// `unread_history_changes_nothing` checks it along random walks).
///
/// [`StreamOp::Queue`]: pelican_model::protocol::StreamOp::Queue
fn hash_redis_unlabeled(redis: &Redis, h: &mut FpHasher) {
    let Redis { jobs, dead } = redis;
    jobs.len().hash(h);
    for jobs in jobs {
        let pelican_model::stream::Stream {
            exists,
            entries: stream_entries,
            last_id,
            entries_added: _, // history
            max_deleted: _,   // history
            group,
        } = jobs;
        (exists, stream_entries, last_id).hash(h);
        match group {
            None => 0u8.hash(h),
            Some(pelican_model::stream::Group {
                name,
                last_delivered,
                entries_read: _, // history
                pel,
                consumers: _, // labeled
            }) => {
                (1u8, name, last_delivered, pel.len()).hash(h);
                for (id, p) in pel {
                    let pelican_model::stream::Pending {
                        consumer: _, // labeled
                        delivery_time,
                        delivery_count: _, // history
                    } = p;
                    (id, delivery_time).hash(h);
                }
            }
        }
    }
    dead.hash(h);
}

/// Hashes Postgres but for the worker each attempt row names.
///
/// That name is written once, by the claim that inserts the row, and read
/// only by a run's event log (the data of its `claimed` event: the API's
/// reads, and S13's check around a statement, which compares the log with
/// itself read just before). No role of the model reads the log and no
/// decision or property reads the name, so states that differ only in who
/// ran past attempts are one state: with two workers, every history of
/// which worker claimed which attempt multiplied the space (27.2 million
/// states of `standard` against 4.1 million). The test
/// `unread_history_changes_nothing` checks it along random walks.
fn hash_db_unlabeled(db: &Db, h: &mut FpHasher) {
    let Db {
        runs,
        attempts,
        effects: db_effects,
        dead_letters,
        run_ids,
        keys,
        clock,
        workers: registered,
        steps,
        slots,
        rates,
        events: run_events,
        partitions,
        schedules,
        schedule_ids,
    } = db;
    (registered, steps, slots, rates, run_events, partitions).hash(h);
    (schedules, schedule_ids).hash(h);
    clock.hash(h);
    (
        runs,
        db_effects,
        dead_letters,
        run_ids,
        keys,
        attempts.len(),
    )
        .hash(h);
    for (key, a) in attempts {
        let pelican_model::db::AttemptRow {
            fence,
            worker: _, // unread history (above)
            entry_id,
            dispatch,
            outcome,
            claimed_seq,
            claimed_at: _, // unread history, as the worker
            ended_at: _,
        } = a;
        (key, fence, entry_id, dispatch, outcome, claimed_seq).hash(h);
    }
}

/// The fingerprints' hash function: foldhash's quality variant with a fixed
/// seed (64 well-mixed bits, a few times faster than SipHash on the many
/// small writes of a derived `Hash`; the visited set trusts 64-bit
/// fingerprints either way, as stateright's own do).
type FpHasher = foldhash::quality::FoldHasher<'static>;

fn fp_hasher() -> FpHasher {
    foldhash::quality::FixedState::with_seed(0x7065_6c69_6361_6e21).build_hasher()
}

/// The index in [`permutations`]`(n)` of the transposition of 0 and `i`.
fn swap_index(n: usize, i: usize) -> usize {
    permutations(n)
        .iter()
        .position(|p| {
            p.iter().enumerate().all(|(k, v)| {
                *v as usize
                    == match k {
                        0 => i,
                        k if k == i => 0,
                        k => k,
                    }
            })
        })
        .expect("every transposition is a permutation")
}

/// Every permutation of `0..n`, the identity first (cached for small `n`).
pub(super) fn permutations(n: usize) -> &'static [Vec<u32>] {
    static CACHE: OnceLock<Vec<Vec<Vec<u32>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| (0..=5).map(all_permutations).collect());
    cache
        .get(n)
        .expect("symmetry reduction over at most five workers")
}

fn all_permutations(n: usize) -> Vec<Vec<u32>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in all_permutations(n - 1) {
        for at in (0..=p.len()).rev() {
            let mut q = p.clone();
            q.insert(at, (n - 1) as u32);
            out.push(q);
        }
    }
    out
}
