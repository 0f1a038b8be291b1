//! Cron schedules: what a schedule is, when its ticks fall, and what the
//! scheduler does with a due one.
//!
//! A schedule (`schedules`, migration 21) names a kind, an input, a cron
//! expression in a time zone, an overlap policy and a catch-up policy. Its
//! row keeps `next_tick`, the next tick nobody has handled yet (0: not
//! planned). Every worker runs the scheduler ([`MaintenanceTask::Schedules`]):
//! it reads the due schedules with Postgres's clock, [`plan`]s each, and
//! sends one [`FireTick`] statement a schedule. That statement is the
//! whole protocol: it moves `next_tick` only from the value the planner
//! read (a compare-and-set), and in the same statement records the tick and
//! inserts its run. So two schedulers that read the same tick handle it
//! once between them, and a scheduler that dies, or whose reply is lost,
//! leaves the tick to the next pass (S16).
//!
//! A tick's run id is [`tick_run`]`(schedule, tick)`: the same for every
//! scheduler, so it is also an idempotency key a job can hand downstream.
//!
//! [`MaintenanceTask::Schedules`]: crate::protocol::MaintenanceTask::Schedules
//! [`FireTick`]: crate::db::Statement::FireTick

use crate::db::DbOp;
use crate::ids::RunId;
use crate::protocol::Policy;
use crate::time::Timestamp;
use chrono::DateTime;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};
use std::fmt;

/// "Never": the `next_tick` of a schedule whose expression has no tick
/// left (a pattern bound to years that have passed).
pub const NEVER: Timestamp = Timestamp(i64::MAX as u64);

/// The first run id [`tick_run`] hands out: above every id the `run_ids`
/// sequence will reach (2^52, 4.5 quadrillion), so a tick's run never
/// takes a submitted run's id. Every tick's run id is below 2^53, so it is
/// exact as a JSON number in JavaScript too (the dashboard's).
pub const TICK_RUNS: u64 = 1 << 52;

/// Bits of a tick's second since the Unix epoch: past the year 3000.
const TICK_BITS: u32 = 35;

/// Schedule numbers [`tick_run`] can encode (the `schedule_ids` sequence
/// stops below it): the 17 bits between the tick's and [`TICK_RUNS`].
pub const SCHEDULE_IDS_MAX: u64 = 1 << (52 - TICK_BITS);

/// The run id of `schedule`'s tick at `tick`: [`TICK_RUNS`], the
/// schedule's number in the next 17 bits, the tick's second in the low 35
/// (ticks fall on whole seconds).
#[must_use]
pub const fn tick_run(schedule: u64, tick: Timestamp) -> RunId {
    let second = (tick.0 / 1_000) & ((1 << TICK_BITS) - 1);
    RunId(TICK_RUNS | (schedule % SCHEDULE_IDS_MAX) << TICK_BITS | second)
}

/// The schedule and tick a run id of [`tick_run`] names, if it is one.
#[must_use]
pub const fn tick_of(run: RunId) -> Option<(u64, Timestamp)> {
    if run.0 < TICK_RUNS || run.0 >= TICK_RUNS << 1 {
        return None;
    }
    let schedule = (run.0 >> TICK_BITS) & (SCHEDULE_IDS_MAX - 1);
    Some((
        schedule,
        Timestamp((run.0 & ((1 << TICK_BITS) - 1)) * 1_000),
    ))
}

macro_rules! policy_enum {
    ($(#[doc = $doc:literal])* $name:ident { $($(#[doc = $vdoc:literal])* $v:ident = $s:literal,)* }) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[doc = $vdoc])* $v,)*
        }

        impl $name {
            /// Every value, as the API and the schema's check list them.
            pub const ALL: &'static [$name] = &[$($name::$v),*];

            /// Its name in the API, the CLI and the `schedules` table.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }

            /// The value named `s`.
            pub fn parse(s: &str) -> Result<$name, String> {
                match s {
                    $($s => Ok($name::$v),)*
                    _ => Err(format!(
                        "unknown {} {s:?}; known: {}",
                        stringify!($name).to_lowercase(),
                        [$($s),*].join(", ")
                    )),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

policy_enum! {
    /// What a tick does while the schedule's previous run is still live.
    Overlap {
        /// The tick makes no run (it is counted as skipped).
        Skip = "skip",
        /// The tick's run is queued as any run is, beside the live one.
        Queue = "queue",
        /// The live run is cancelled, in the statement that makes the
        /// tick's run.
        Cancel = "cancel",
    }
}

policy_enum! {
    /// What the scheduler does with ticks it reaches more than
    /// [`Policy::catchup_after_ms`] late: ticks missed while no scheduler
    /// ran.
    Catchup {
        /// Missed ticks make no run; the schedule goes on from the first
        /// tick that is not missed.
        Skip = "skip",
        /// The first missed tick makes one run, for all of them; the rest
        /// are skipped.
        One = "one",
    }
}

/// One row of `schedules`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleRow {
    /// Its name (primary key).
    pub name: String,
    /// Its number, from the `schedule_ids` sequence: its ticks' run ids
    /// carry it ([`tick_run`]). A schedule put again under its name keeps
    /// it; one deleted and made again gets a new one.
    pub id: u64,
    /// The kind of its runs.
    pub kind: String,
    /// The input of its runs (JSON text).
    pub input: String,
    /// The cron expression (five fields, or six with seconds first).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub tz: String,
    /// What a tick does while the previous run is live.
    pub overlap: Overlap,
    /// What happens to ticks missed while no scheduler ran.
    pub catchup: Catchup,
    /// The next tick nobody has handled (0: not planned yet; [`NEVER`]:
    /// none left).
    pub next_tick: Timestamp,
    /// The last tick handled (0: none yet).
    pub last_tick: Timestamp,
    /// The run of the last tick that made one.
    pub last_run: Option<RunId>,
    /// Ticks that made a run.
    pub fired: u64,
    /// Ticks that made none (overlap or catch-up).
    pub skipped: u64,
}

/// A cron expression read in a time zone: when its ticks fall.
#[derive(Clone, Debug)]
pub struct Cron {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

impl Cron {
    /// Parses `expr` (five fields, or six with seconds first) in the IANA
    /// time zone `tz`; the error says what is wrong, for the API's 400.
    pub fn parse(expr: &str, tz: &str) -> Result<Cron, String> {
        let tz: chrono_tz::Tz = tz.parse().map_err(|_| {
            format!("unknown time zone {tz:?} (an IANA name such as Europe/Berlin)")
        })?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("invalid cron expression {expr:?}: {e}"))?;
        Ok(Cron { cron, tz })
    }

    /// The first tick strictly after `t` (Unix ms); `None`: no tick left.
    #[must_use]
    pub fn after(&self, t: Timestamp) -> Option<Timestamp> {
        let ms = i64::try_from(t.0).ok()?;
        let at = DateTime::from_timestamp_millis(ms)?.with_timezone(&self.tz);
        let next = self.cron.find_next_occurrence(&at, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok().map(Timestamp)
    }
}

/// What the scheduler sends for due schedule `s` at `now` (Postgres's
/// clock, as [`Statement::DueSchedules`] answers it):
///
/// * not planned yet: its first tick after `now`, no tick handled;
/// * a tick more than [`Policy::catchup_after_ms`] late (missed): the
///   catch-up policy's run, if any, under that tick's id, and the schedule
///   goes on from its first tick that is not missed;
/// * a due tick: its run, and the schedule goes on from the next tick.
///
/// An expression that no longer parses (the row was written by hand)
/// parks the schedule at [`NEVER`].
///
/// [`Statement::DueSchedules`]: crate::db::Statement::DueSchedules
#[must_use]
pub fn plan(s: &ScheduleRow, now: Timestamp, policy: &Policy) -> DbOp {
    let cron = Cron::parse(&s.cron, &s.tz).ok();
    let after = |t: Timestamp| cron.as_ref().and_then(|c| c.after(t)).unwrap_or(NEVER);
    let tick = s.next_tick;
    let missed = now.sub_ms(policy.catchup_after_ms);
    let (tick, next, fire) = if tick == Timestamp::ZERO || cron.is_none() {
        (Timestamp::ZERO, after(now), false)
    } else if tick < missed {
        (tick, after(missed.sub_ms(1)), s.catchup == Catchup::One)
    } else {
        (tick, after(tick), true)
    };
    let run = if fire { tick_run(s.id, tick) } else { RunId(0) };
    let (schedule, expect) = (s.name.clone(), s.next_tick);
    let attempts_max = policy.attempts_max_of(&s.kind);
    let budget_ms = policy.kind(&s.kind).budget_ms.unwrap_or(0);
    #[cfg(feature = "mutants")]
    if crate::injects!(policy, TickUnfenced) {
        let _ = expect;
        return DbOp::FireTickUnfenced {
            schedule,
            tick,
            next,
            run,
            attempts_max,
            budget_ms,
        };
    }
    DbOp::FireTick {
        schedule,
        expect,
        tick,
        next,
        run,
        attempts_max,
        budget_ms,
    }
}

impl DbOp {
    /// The next tick a statement that handles a tick moves its schedule
    /// to (`None`: not such a statement).
    #[must_use]
    pub fn next_tick(&self) -> Option<Timestamp> {
        match self {
            DbOp::FireTick { next, .. } => Some(*next),
            #[cfg(feature = "mutants")]
            DbOp::FireTickUnfenced { next, .. } => Some(*next),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
