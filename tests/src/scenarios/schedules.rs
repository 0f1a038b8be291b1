//! Cron schedules (S16) against real processes: a schedule every second,
//! its ticks raced for by workers' schedulers, one of them slow between
//! reading a tick and handling it, while workers are killed around it.

use super::{FAST_TAKEOVER, agent, sleep_ms};
use crate::Env;
use pelican_model::schedule::tick_of;
use pelican_model::status::RunStatus;
use pelican_model::time::Timestamp;
use serde_json::{Value, json};

/// A scheduler that reads a tick, then sleeps this long before its
/// statement lands: every plan it sends is stale by then.
const SLOW_FIRE: &str = "before_fire_tick=sleep(1500)";

/// A schedule every second, made through the API, with three workers'
/// schedulers racing for its ticks: one of them sleeps 1.5 s between
/// reading each tick and handling it, and the two others are killed in
/// turn (for 2.5 s only the slow one runs). Once every worker is stopped,
/// the schedule has handled each second from its first tick to its last
/// once: one run per tick, under the tick's own id, none skipped, and its
/// count of ticks that made a run is its number of runs. Every run
/// succeeds. A bad expression, time zone or policy is refused.
pub fn schedule_ticks_run_once(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api("sekret");
    let agent = agent();
    let call = |method: &str, path: &str, body: Option<&Value>| -> (u16, Value) {
        let url = format!("{base}{path}");
        let auth = "Bearer sekret";
        let mut resp = match (method, body) {
            ("POST", Some(b)) => agent.post(url).header("Authorization", auth).send_json(b),
            ("DELETE", _) => agent.delete(url).header("Authorization", auth).call(),
            _ => agent.get(url).header("Authorization", auth).call(),
        }
        .expect("the API answers");
        let code = resp.status().as_u16();
        (code, resp.body_mut().read_json().unwrap_or(Value::Null))
    };
    let input = json!({"calls": 1, "ms": 100});
    let spec = json!({"name": "every-second", "kind": "effect", "input": input,
                      "cron": "* * * * * *", "overlap": "queue", "catchup": "one"});
    for (bad, field) in [
        ("cron", "* * *"),
        ("tz", "Mars/Olympus"),
        ("name", "No Spaces"),
    ] {
        let mut b = spec.clone();
        b[bad] = json!(field);
        let (code, body) = call("POST", "/schedules", Some(&b));
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let mut b = spec.clone();
    b["overlap"] = json!("sometimes");
    assert_eq!(call("POST", "/schedules", Some(&b)).0, 422);
    let (code, made) = call("POST", "/schedules", Some(&spec));
    assert_eq!(code, 200, "{made}");
    let next: Vec<u64> = serde_json::from_value(made["next_ticks_ms"].clone()).expect("ticks");
    assert_eq!(next.len(), 3, "{made}");
    assert!(next.windows(2).all(|w| w[1] == w[0] + 1_000), "{made}");
    let (code, listed) = call("GET", "/schedules", None);
    assert_eq!(
        (code, listed["schedules"][0]["name"].as_str()),
        (200, Some("every-second"))
    );

    let mut w1 = env.worker(1, None, FAST_TAKEOVER);
    let mut slow = env.worker(2, Some(SLOW_FIRE), FAST_TAKEOVER);
    sleep_ms(3_000);
    w1.kill9();
    sleep_ms(2_500);
    let mut w3 = env.worker(3, None, FAST_TAKEOVER);
    sleep_ms(3_000);
    w3.kill9();
    let mut w4 = env.worker(4, None, FAST_TAKEOVER);
    sleep_ms(2_000);
    // Every scheduler stops (the slow one's last stale statement lands
    // first), then the schedule is read and deleted; a worker finishes
    // its runs.
    w4.kill9();
    sleep_ms(1_600);
    slow.kill9();
    let db = env.db();
    let s = db.schedules["every-second"].clone();
    let (code, _) = call("DELETE", "/schedules/every-second", None);
    assert_eq!(code, 200);
    assert_eq!(call("DELETE", "/schedules/every-second", None).0, 404);
    let mut ticks: Vec<(Timestamp, pelican_model::ids::RunId)> = Vec::new();
    for r in db.runs.values() {
        let (schedule, tick) = tick_of(r.run_id).expect("only the schedule makes runs");
        assert_eq!(schedule, s.id, "{r:?}");
        ticks.push((tick, r.run_id));
        env.accepted.insert(r.run_id);
        let effects = pelican_real::jobs::effects_of("effect", &input.to_string());
        env.effects.insert(r.run_id, effects);
    }
    ticks.sort_unstable();
    assert!(ticks.len() >= 5, "{} ticks in 11 s: {s:?}", ticks.len());
    assert_eq!(
        (s.fired, s.skipped),
        (ticks.len() as u64, 0),
        "ticks that made a run, and runs (S16): {s:?}"
    );
    let first = ticks[0].0;
    for (i, (tick, _)) in ticks.iter().enumerate() {
        assert_eq!(
            *tick,
            first.add_ms(1_000 * i as u64),
            "every second handled once, none missed (S16): {ticks:?}"
        );
    }
    assert_eq!(s.last_tick, ticks[ticks.len() - 1].0, "{s:?}");
    let _w5 = env.worker(5, None, FAST_TAKEOVER);
    env.settle();
    let done = env.check(&[]);
    let mut late_ms = Vec::new();
    for (tick, run) in &ticks {
        let r = &done.runs[run];
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        late_ms.push(
            r.due_at
                .expect("a tick's run is due when made")
                .ms_since(*tick),
        );
    }
    late_ms.sort_unstable();
    eprintln!(
        "schedule: {} ticks, each run made {:?} ms after its tick (min, median, max)",
        ticks.len(),
        (
            late_ms[0],
            late_ms[late_ms.len() / 2],
            late_ms[late_ms.len() - 1]
        )
    );
}
