//! A provider's limits under two sessions at once: permits and tokens
//! taken, made and released concurrently answer as the model does in one
//! order or the other, and never hand out one slot or token twice.
//!
//! Each case runs statement A in an open transaction in one session and
//! statement B in another, then commits A. A case says whether B must wait
//! for A's row lock (a token's GCRA row, slots being made) or must go
//! through at once (an acquire skips a slot another session has locked),
//! and which of the model's orders the answers and rows must equal: A then
//! B when B waited or found nothing A held back; B then A when B went
//! through before A's change was visible.

use super::db::{START, migrated, reset, same_state};
use super::lock_order::until;
use pelican_model::db::{Db, DbOp, DbReply};
use pelican_model::protocol::{Policy, ProviderLimit};
use pelican_real::live::PgDb;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(10);

/// Which order of the model the two answers must equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    AThenB,
    BThenA,
}

/// One race.
struct Race {
    name: &'static str,
    /// Run (and committed) before the race.
    setup: Vec<DbOp>,
    /// How far the clock moves after the setup.
    later_ms: u64,
    a: DbOp,
    b: DbOp,
    /// Whether B must wait for A's locks (else it must not).
    b_waits: bool,
    order: Order,
}

/// The acquire `policy` sends (a mutant's twin, if it injects one).
fn acquire(policy: &Policy, slots: u32, holder: &str) -> DbOp {
    let limit = ProviderLimit::default().concurrent(slots).hold_ms(60_000);
    limit
        .acquire(policy, "p", holder)
        .expect("a concurrency limit")
        .into()
}

fn ensure(slots: u32) -> DbOp {
    DbOp::EnsureSlots {
        provider: "p".into(),
        slots,
    }
}

fn token(burst: u32) -> DbOp {
    DbOp::TakeToken {
        provider: "p".into(),
        interval_ns: 1_000_000_000,
        burst,
    }
}

fn races(policy: &Policy) -> Vec<Race> {
    let acquire = |slots, holder| acquire(policy, slots, holder);
    let release = DbOp::ReleaseSlot {
        provider: "p".into(),
        holder: "a".into(),
    };
    vec![
        Race {
            name: "two acquires of the last slot",
            setup: vec![ensure(1)],
            later_ms: 0,
            a: acquire(1, "a"),
            b: acquire(1, "b"),
            b_waits: false,
            order: Order::AThenB,
        },
        Race {
            name: "two acquires of two slots",
            setup: vec![ensure(2)],
            later_ms: 0,
            a: acquire(2, "a"),
            b: acquire(2, "b"),
            b_waits: false,
            order: Order::AThenB,
        },
        Race {
            name: "an acquire racing the release of the only slot",
            setup: vec![ensure(1), acquire(1, "a")],
            later_ms: 0,
            a: release,
            b: acquire(1, "b"),
            b_waits: false,
            order: Order::BThenA,
        },
        Race {
            name: "two sessions making the slots",
            setup: vec![],
            later_ms: 0,
            a: ensure(2),
            b: ensure(3),
            b_waits: true,
            order: Order::AThenB,
        },
        Race {
            name: "two first tokens (no rate row yet), burst 1",
            setup: vec![],
            later_ms: 0,
            a: token(1),
            b: token(1),
            b_waits: true,
            order: Order::AThenB,
        },
        Race {
            name: "two tokens, burst 1",
            setup: vec![token(1)],
            later_ms: 1_000,
            a: token(1),
            b: token(1),
            b_waits: true,
            order: Order::AThenB,
        },
        Race {
            name: "two tokens, burst 2",
            setup: vec![],
            later_ms: 0,
            a: token(2),
            b: token(2),
            b_waits: true,
            order: Order::AThenB,
        },
    ]
}

/// Runs every race against the database at `url` (migrated, then emptied
/// before each), with the statements `policy` sends. Answers how many ran.
///
/// # Errors
/// The first race whose answers, rows or waiting differ from what it
/// states.
///
/// # Panics
/// When Postgres cannot be reached.
pub fn provider_limits_race(url: &str, policy: &Policy) -> Result<usize, String> {
    let db = migrated(url);
    crate::rt().block_on(async {
        let all = races(policy);
        for race in &all {
            run(url, &db, race)
                .await
                .map_err(|e| format!("{}: {e}", race.name))?;
        }
        Ok(all.len())
    })
}

async fn run(url: &str, db: &PgDb, race: &Race) -> Result<(), String> {
    let pg = |e: pelican_real::live::pg::PgError| e.to_string();
    reset(db).await?;
    let pool = PgDb::connect(url, 2, PATIENCE).await.map_err(pg)?;
    let (mut a, mut b) = (
        pool.session().await.map_err(pg)?,
        pool.session().await.map_err(pg)?,
    );
    let clock = format!("SET pelican.now_ms = '{}'", START.0);
    for s in [&mut a, &mut b] {
        s.raw(&clock).await.map_err(pg)?;
    }
    let mut model = Db::new();
    model.clock = START;
    for op in &race.setup {
        let want = model.execute(op);
        let got = a.execute(op).await.map_err(pg)?;
        if got != want {
            return Err(format!("setup {op:?}: Postgres {got:?}, model {want:?}"));
        }
    }
    model.clock = START.add_ms(race.later_ms);
    let clock = format!("SET pelican.now_ms = '{}'", model.clock.0);
    for s in [&mut a, &mut b] {
        s.raw(&clock).await.map_err(pg)?;
    }
    let (a_pid, b_pid) = (a.pid().await.map_err(pg)?, b.pid().await.map_err(pg)?);
    a.raw("BEGIN").await.map_err(pg)?;
    let got_a = a.execute(&race.a).await.map_err(pg)?;
    let b_op = race.b.clone();
    let b_task = tokio::spawn(async move { b.execute(&b_op).await.map_err(|e| e.to_string()) });
    let got_b = if race.b_waits {
        until(db, "B waits for A", b_pid, |by| by.contains(&a_pid)).await?;
        a.raw("COMMIT").await.map_err(pg)?;
        joined(b_task).await?
    } else {
        let got_b = joined(b_task)
            .await
            .map_err(|e| format!("B waited for A, or failed: {e}"))?;
        a.raw("COMMIT").await.map_err(pg)?;
        got_b
    };
    let want = match race.order {
        Order::AThenB => {
            let a = model.execute(&race.a);
            (a, model.execute(&race.b))
        }
        Order::BThenA => {
            let b = model.execute(&race.b);
            (model.execute(&race.a), b)
        }
    };
    if (&got_a, &got_b) != (&want.0, &want.1) {
        return Err(format!(
            "Postgres answered A {got_a:?} and B {got_b:?}; the model's {:?}: {:?} and {:?}",
            race.order, want.0, want.1
        ));
    }
    same_state(&model, db).await
}

/// B's answer, within [`PATIENCE`].
async fn joined(task: tokio::task::JoinHandle<Result<DbReply, String>>) -> Result<DbReply, String> {
    tokio::time::timeout(PATIENCE, task)
        .await
        .map_err(|_| "B did not finish".to_owned())?
        .map_err(|e| e.to_string())?
}
