//! Live scenarios of run events (S13) and of `pelican-client`: real SSE
//! clients (the client library's reconnecting watcher, and curl) follow
//! runs whose workers and API are killed, and a late attempt's progress is
//! refused by its fence.

use super::{NO_SWEEP, sleep_ms, wait_for};
use crate::{Env, free_port, rt};
use futures_util::StreamExt;
use pelican_client::{Client, Error, EventKind, Retry, RunStatus, Submit};
use pelican_model::events::{self, RunEvent};
use pelican_model::ids::RunId;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TOKEN: &str = "events-token";

/// A client patient enough to outlast an API restart.
fn client(base: &str) -> Client {
    Client::new(base)
        .expect("the API's address")
        .with_token(TOKEN)
        .with_retry(Retry {
            attempts: 40,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_millis(500),
            timeout: Duration::from_secs(10),
        })
}

/// What a background watcher has received, and how its stream ended.
#[derive(Clone, Default)]
struct Watched {
    events: Arc<Mutex<Vec<pelican_client::Event>>>,
    end: Arc<Mutex<Option<Result<(), String>>>>,
}

impl Watched {
    /// Waits for the watcher's stream to end; the events it received.
    fn finish(&self) -> Vec<pelican_client::Event> {
        wait_for("the watcher's stream ends", || {
            self.end.lock().unwrap().is_some()
        });
        if let Some(Err(e)) = &*self.end.lock().unwrap() {
            panic!("the watcher failed: {e}");
        }
        self.events.lock().unwrap().clone()
    }
}

/// Follows `run` with `pelican-client`'s watcher on the test runtime.
fn watch(base: &str, run: RunId) -> Watched {
    let w = Watched::default();
    let (c, out) = (client(base), w.clone());
    rt().spawn(async move {
        let mut stream = std::pin::pin!(c.watch(run));
        let mut end = Ok(());
        while let Some(e) = stream.next().await {
            match e {
                Ok(e) => out.events.lock().unwrap().push(e),
                Err(e) => end = Err(e.to_string()),
            }
        }
        *out.end.lock().unwrap() = Some(end);
    });
    w
}

/// curl following `run`'s events after event `after` (one connection,
/// no reconnect), its output in `out`.
fn curl(base: &str, run: RunId, after: u32, out: &Path) -> Child {
    let file = std::fs::File::create(out).expect("the scratch dir is writable");
    Command::new("curl")
        .args(["--silent", "--no-buffer", "--max-time", "120"])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-H", &format!("Last-Event-ID: {after}")])
        .arg(format!("{base}/runs/{}/events", run.0))
        .stdout(file)
        .stderr(Stdio::null())
        .spawn()
        .expect("curl runs (CI installs it)")
}

/// The events of an SSE text: (id, event name, data).
fn parse_sse(text: &str) -> Vec<(u32, String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut name, mut data) = (None, String::new(), String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if let Some(id) = id {
            let data = serde_json::from_str(&data).expect("an event's data is JSON");
            out.push((id, name, data));
        }
    }
    out
}

/// The run's events as Postgres holds them.
fn log_of(env: &Env, run: RunId) -> Vec<RunEvent> {
    env.db().read_events(run, 0, usize::MAX)
}

/// A log is S13-whole, numbered 1..n, and ends with `last`.
fn assert_whole(log: &[RunEvent], last: EventKind) {
    events::check(0, log).unwrap_or_else(|e| panic!("S13: {e}: {log:?}"));
    let seqs: Vec<u32> = log.iter().map(|e| e.seq).collect();
    let want: Vec<u32> = (1..=u32::try_from(log.len()).unwrap()).collect();
    assert_eq!(seqs, want, "numbered without gaps");
    assert_eq!(log.last().map(|e| e.kind), Some(last), "{log:?}");
}

/// What a client received is the run's log, event for event.
fn assert_received(what: &str, got: &[(u32, EventKind, u64)], log: &[RunEvent]) {
    let want: Vec<(u32, EventKind, u64)> = log.iter().map(|e| (e.seq, e.kind, e.fence.0)).collect();
    assert_eq!(got, want.as_slice(), "{what} received the run's history");
}

fn scratch_file(name: &str) -> PathBuf {
    crate::scratch("pelican-events").join(name)
}

/// Two real SSE clients follow a run across a worker's kill -9 and an API
/// restart: the client library's watcher, which reconnects with
/// `Last-Event-ID`, and curl, reconnected by hand from the last id it
/// printed. Each receives every committed event exactly once, numbered
/// 1..n without a gap, none from the killed attempt after the reclaim; and
/// the stream ends after the terminal event.
pub fn run_events_survive_a_kill_and_a_reconnect(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let port = free_port();
    let (mut api, base) = env.api_on(TOKEN, 3, &[], port);
    let run = env.submit("steps", r#"{"calls":6,"ms":400}"#, 3);
    let watched = watch(&base, run);
    let first = scratch_file("curl-1.txt");
    let mut curl1 = curl(&base, run, 0, &first);
    let mut w1 = env.worker(1, None, NO_SWEEP);
    wait_for("w1 reports progress twice", || {
        log_of(&env, run)
            .iter()
            .filter(|e| e.kind == EventKind::Progress)
            .count()
            >= 2
    });
    w1.kill9();
    let _w2 = env.worker(2, None, NO_SWEEP);
    wait_for("w2 takes the run over", || {
        env.db().runs[&run].attempts >= 2
    });
    api.kill9();
    let _ = curl1.wait();
    sleep_ms(300);
    let (_api, _) = env.api_on(TOKEN, 3, &[], port);
    let before = parse_sse(&std::fs::read_to_string(&first).unwrap());
    let after = before.last().map_or(0, |e| e.0);
    let second = scratch_file("curl-2.txt");
    let mut curl2 = curl(&base, run, after, &second);
    env.settle();
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    let log = db.read_events(run, 0, usize::MAX);
    assert_whole(&log, EventKind::Succeeded);
    let claims: Vec<u64> = log
        .iter()
        .filter(|e| e.kind == EventKind::Claimed)
        .map(|e| e.fence.0)
        .collect();
    assert!(
        claims.len() >= 2,
        "the killed attempt was reclaimed: {log:?}"
    );
    let got: Vec<_> = watched
        .finish()
        .iter()
        .map(|e| (e.seq, e.kind, e.fence))
        .collect();
    assert_received("the client library's watcher", &got, &log);
    let status = curl2.wait().expect("curl ends");
    assert!(
        status.success(),
        "the stream ends after the terminal event: {status}"
    );
    let mut sse = before;
    sse.extend(parse_sse(&std::fs::read_to_string(&second).unwrap()));
    let got: Vec<_> = sse
        .iter()
        .map(|(id, name, data)| {
            let kind = EventKind::parse(name).unwrap_or_else(|| panic!("event name {name:?}"));
            assert_eq!(data["seq"], json!(id), "an event's id is its number");
            (*id, kind, data["fence"].as_u64().expect("a fence"))
        })
        .collect();
    assert_received("curl, reconnected by hand", &got, &log);
}

/// An attempt whose heartbeats are lost (a zombie: its job goes on, its
/// lease runs out) and whose run another worker took over goes on
/// reporting progress: the fence refuses it, and neither a reader nor the
/// run's log ever holds an event of the old attempt after the takeover
/// (ZombieProgress writes it).
pub fn a_late_attempts_progress_is_refused(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api(TOKEN);
    let run = env.submit("effect", r#"{"calls":4,"ms":2000}"#, 5);
    let watched = watch(&base, run);
    // w1 never renews its lease nor reclaims: w2 takes the run over while
    // w1's job is between its calls.
    let mut flags = NO_SWEEP.to_vec();
    flags.extend(["--reclaim-every-ms", "600000"]);
    let _w1 = env.worker(1, Some("lose_heartbeat=return"), &flags);
    wait_for("w1 runs the job", || {
        env.db().runs[&run].status == RunStatus::Running
    });
    let _w2 = env.worker(2, None, NO_SWEEP);
    env.settle();
    // S13 on the final log is part of the audit.
    let db = env.check(&[]);
    assert_eq!(db.runs[&run].status, RunStatus::Succeeded);
    let log = db.read_events(run, 0, usize::MAX);
    assert_whole(&log, EventKind::Succeeded);
    let first = db.read_attempts(run)[0].1.clone();
    assert_eq!(first.worker, "w1");
    assert_eq!(
        first.outcome, None,
        "the stalled attempt's outcome was refused"
    );
    let watched: Vec<_> = watched
        .finish()
        .iter()
        .map(|e| (e.seq, e.kind, e.fence))
        .collect();
    assert_received("the watcher", &watched, &log);
}

/// The client's schedules: put (and refused with the API's reason),
/// listed with their next ticks, deleted once.
async fn client_schedules(c: &Client) {
    use pelican_client::wire::{Catchup, NewSchedule, Overlap};
    let mut new = NewSchedule {
        name: "weekday-report".into(),
        kind: "noop".into(),
        input: json!({"report": "daily"}),
        cron: "0 9 * * 1-5".into(),
        tz: "Europe/Berlin".into(),
        overlap: Overlap::Skip,
        catchup: Catchup::One,
    };
    let made = c.put_schedule(&new).await.expect("a schedule is made");
    assert_eq!(
        (made.spec.clone(), made.next_ticks_ms.len()),
        (new.clone(), 3)
    );
    let listed = c.schedules().await.expect("the schedules read");
    assert_eq!(listed, vec![made.clone()]);
    new.tz = "Nowhere/Else".into();
    let refused = c.put_schedule(&new).await;
    assert!(
        matches!(&refused, Err(Error::Rejected { status: 400, message }) if message.contains("time zone")),
        "{refused:?}"
    );
    let gone = c.delete_schedule("weekday-report").await.expect("deleted");
    assert_eq!(gone.map(|s| s.id), Some(made.id));
    assert_eq!(c.delete_schedule("weekday-report").await, Ok(None));
}

/// `pelican-client` against the live API: keyed submissions answer their
/// first run, a key reused for another request is a typed error, a bulk
/// submission answers each item, reads and cancels answer typed errors
/// (no such run, already ended, a wrong token, nobody listening), a
/// submission made while the API is down succeeds once it is up (the key
/// makes the retries safe), and a watch follows a run to its end.
pub fn the_client_library_against_the_api(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let c = client(&base);
    // Down at first: the submission retries until the API is up.
    let early = {
        let c = c.clone();
        rt().spawn(async move {
            c.submit(&Submit::new("noop", json!({"early": true})).key("early"))
                .await
        })
    };
    sleep_ms(800);
    let (_api, _) = env.api_on(TOKEN, 3, &[], port);
    let early = rt()
        .block_on(early)
        .expect("the task ends")
        .expect("submitted once the API is up");
    assert!(!early.existing);
    let (keyed, again, conflict, bad, bulk, cancelled) = rt().block_on(async {
        let keyed = c
            .submit(&Submit::new("noop", json!({"n": 1})).key("k-1"))
            .await
            .unwrap();
        let again = c
            .submit(&Submit::new("noop", json!({"n": 1})).key("k-1"))
            .await
            .unwrap();
        let conflict = c
            .submit(&Submit::new("noop", json!({"n": 2})).key("k-1"))
            .await;
        let bad = c.submit(&Submit::new("Not A Kind", json!({}))).await;
        let bulk = c
            .submit_many(&[
                Submit::new("noop", json!({"b": 1})),
                Submit::new("Bad Kind", json!({})),
                Submit::new("noop", json!({"n": 1})).key("k-1"),
            ])
            .await
            .expect("the bulk request is answered");
        // Delayed an hour: it waits `delayed`, with its due time, and is
        // cancelled while it waits.
        let hour = Duration::from_secs(3_600);
        let queued = c
            .submit(&Submit::new("noop", json!({"cancel": true})).delay(hour))
            .await
            .unwrap();
        assert_eq!(queued.status, Some(RunStatus::Delayed));
        let waiting = c.run(queued.run_id).await.expect("the run reads");
        assert_eq!(waiting.status, RunStatus::Delayed);
        assert!(waiting.due_at_ms.is_some(), "{waiting:?}");
        c.cancel(queued.run_id)
            .await
            .expect("a delayed run is cancelled");
        c.cancel(queued.run_id)
            .await
            .expect("cancelling a cancelled run again is no error");
        client_schedules(&c).await;
        (keyed, again, conflict, bad, bulk, queued.run_id)
    });
    assert_eq!((again.run_id, again.existing), (keyed.run_id, true));
    assert!(
        matches!(conflict, Err(Error::KeyConflict(_))),
        "{conflict:?}"
    );
    assert!(
        matches!(bad, Err(Error::Rejected { status: 400, .. })),
        "{bad:?}"
    );
    assert_eq!(bulk.len(), 3);
    let fresh = bulk[0].as_ref().expect("a good item is stored");
    assert!(
        matches!(bulk[1], Err(Error::Rejected { status: 400, .. })),
        "{:?}",
        bulk[1]
    );
    assert_eq!(
        bulk[2].as_ref().map(|s| (s.run_id, s.existing)),
        Ok((keyed.run_id, true))
    );
    for run in [early.run_id, keyed.run_id, fresh.run_id, cancelled] {
        env.accepted.insert(run);
    }
    let _w = env.worker(1, None, &[]);
    env.settle();
    rt().block_on(async {
        let done = c.run(keyed.run_id).await.expect("the run reads");
        assert_eq!(
            (done.status, done.kind.as_str()),
            (RunStatus::Succeeded, "noop")
        );
        assert_eq!(done.attempts.len(), 1);
        assert_eq!(c.run(cancelled).await.unwrap().status, RunStatus::Cancelled);
        let ended = c.cancel(keyed.run_id).await;
        assert_eq!(
            ended,
            Err(Error::Ended {
                run: keyed.run_id,
                status: RunStatus::Succeeded
            })
        );
        let missing = RunId(9_999_999);
        assert_eq!(c.run(missing).await, Err(Error::NotFound(missing)));
        let wrong = Client::new(&base).unwrap().with_token("wrong");
        assert!(matches!(
            wrong.run(keyed.run_id).await,
            Err(Error::Unauthorized(_))
        ));
        let nobody = Client::new(&format!("http://127.0.0.1:{}", free_port()))
            .unwrap()
            .with_retry(Retry {
                attempts: 2,
                ..Retry::default()
            });
        assert!(matches!(
            nobody.run(keyed.run_id).await,
            Err(Error::Unavailable(_))
        ));
        assert!(matches!(Client::new("ftp://x"), Err(Error::Address(_))));
        let kinds: Vec<EventKind> = c
            .watch(keyed.run_id)
            .map(|e| e.expect("an event").kind)
            .collect()
            .await;
        assert_eq!(
            kinds,
            [EventKind::Queued, EventKind::Claimed, EventKind::Succeeded]
        );
        let none: Vec<_> = c.watch_after(keyed.run_id, 3).collect().await;
        assert!(
            none.is_empty(),
            "an ended run's stream after its last event is empty"
        );
        let missing_events: Vec<_> = c.watch(missing).collect().await;
        assert!(matches!(
            missing_events.as_slice(),
            [Err(Error::NotFound(_))]
        ));
    });
    env.check(&[]);
}

/// Waits for `child` to exit by itself within `limit`; kills it and panics
/// otherwise.
fn exits_within(child: &mut Child, what: &str, limit: Duration) {
    let start = std::time::Instant::now();
    while child.try_wait().expect("the child is ours").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what}: still open after {limit:?}");
        }
        sleep_ms(100);
    }
}

/// An events stream whose read ends exactly on the terminal event (the
/// run's 256th event, a full read) ends, as one whose terminal event comes
/// earlier in a read does. curl follows each from the first event and must
/// be let go by the API with the whole log.
pub fn an_events_stream_ends_at_a_full_reads_terminal_event(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_on(TOKEN, 3, &[], free_port());
    // queued, claimed, one progress event a call, succeeded.
    let full = env.submit("effect", r#"{"calls":253}"#, 3);
    let short = env.submit("effect", r#"{"calls":20}"#, 3);
    let _w = env.worker(1, None, &[]);
    env.settle();
    for (run, events) in [(full, 256), (short, 23)] {
        let out = scratch_file(&format!("curl-{}.txt", run.0));
        let mut c = curl(&base, run, 0, &out);
        exits_within(
            &mut c,
            "the stream of a finished run",
            Duration::from_secs(15),
        );
        let got = parse_sse(&std::fs::read_to_string(&out).expect("curl's output"));
        let log = log_of(&env, run);
        assert_eq!(log.len(), events, "{run}'s log");
        assert_whole(&log, EventKind::Succeeded);
        let got: Vec<u32> = got.iter().map(|(id, _, _)| *id).collect();
        let want: Vec<u32> = log.iter().map(|e| e.seq).collect();
        assert_eq!(got, want, "{run}: curl received the whole log");
    }
    env.check(&[]);
}

/// SIGTERM stops an API that has an events stream open: the stream ends
/// (curl sees the end of its response), the process exits 0 well within
/// its grace, and a client resuming with `Last-Event-ID` at the API's
/// successor receives the rest of the log, each event once.
pub fn sigterm_ends_an_apis_events_streams(mutant: Option<&str>) {
    let mut env = Env::mutated(mutant);
    let port = free_port();
    let (mut api, base) = env.api_on(TOKEN, 3, &[], port);
    // Far longer than the API may take to stop.
    let run = env.submit("sleep", r#"{"ms":60000}"#, 3);
    let _w = env.worker(1, None, &[]);
    wait_for("the run is claimed", || log_of(&env, run).len() >= 2);
    let first = scratch_file("curl-term-1.txt");
    let mut c1 = curl(&base, run, 0, &first);
    wait_for("curl receives the claim", || {
        parse_sse(&std::fs::read_to_string(&first).unwrap_or_default()).len() >= 2
    });
    api.term();
    let status = api.wait(Duration::from_secs(10));
    assert!(status.success(), "exit 0; log:\n{}", api.log_text());
    exits_within(
        &mut c1,
        "curl after the API stopped",
        Duration::from_secs(5),
    );
    let before = parse_sse(&std::fs::read_to_string(&first).unwrap());
    let last = before.last().map_or(0, |(id, _, _)| *id);
    let (_api2, base) = env.api_on(TOKEN, 3, &[], port);
    let second = scratch_file("curl-term-2.txt");
    let mut c2 = curl(&base, run, last, &second);
    let out = env.cli(&["cancel", &run.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exits_within(&mut c2, "the resumed stream", Duration::from_secs(30));
    let after = parse_sse(&std::fs::read_to_string(&second).unwrap());
    let got: Vec<u32> = before.iter().chain(&after).map(|(id, _, _)| *id).collect();
    let log = log_of(&env, run);
    assert_whole(&log, EventKind::Cancelled);
    let want: Vec<u32> = log.iter().map(|e| e.seq).collect();
    assert_eq!(got, want, "each event once, across the two APIs");
    env.settle();
    env.check(&[]);
}

/// The series (as exposed, with its labels) on the API's `/metrics`.
fn api_metric(base: &str, series: &str) -> Option<f64> {
    crate::metric(&format!("{base}/metrics"), Some(TOKEN), series)
}

/// One reader feeds every events stream of an API: sixty curl clients
/// follow one running run while the reader's statements grow with its
/// polls, not with the watchers (a poll a stream would be sixty times as
/// many); the sixty-first stream is refused with 503 and Retry-After;
/// and when the run ends, every stream ends with the whole log.
pub fn one_reader_feeds_every_events_stream(mutant: Option<&str>) {
    const STREAMS: usize = 60;
    let mut env = Env::mutated(mutant);
    let cap = STREAMS.to_string();
    let (_api, base) = env.api_on(TOKEN, 3, &["--events-streams-max", &cap], free_port());
    let run = env.submit("sleep", r#"{"ms":60000}"#, 3);
    let _w = env.worker(1, None, &[]);
    wait_for("the run is claimed", || log_of(&env, run).len() >= 2);
    let mut curls: Vec<(Child, PathBuf)> = (0..STREAMS)
        .map(|i| {
            let out = scratch_file(&format!("curl-many-{i}.txt"));
            (curl(&base, run, 0, &out), out)
        })
        .collect();
    wait_for("every stream is open", || {
        api_metric(&base, "pelican_events_streams") == Some(STREAMS as f64)
    });
    let resp = super::agent()
        .get(format!("{base}/runs/{}/events", run.0))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .call()
        .expect("the API answers");
    assert_eq!(resp.status().as_u16(), 503, "one stream past the cap");
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let statements = || api_metric(&base, "pelican_events_statements_total").unwrap_or(0.0);
    let before = statements();
    sleep_ms(2_000);
    let sent = statements() - before;
    // 20 polls of 100 ms: a heads statement each, and an events read when
    // the run has new ones (none here). Sixty streams polling on their own
    // would have sent 1,200.
    assert!(
        sent <= 60.0,
        "{sent} statements in 2 s for {STREAMS} streams"
    );
    let out = env.cli(&["cancel", &run.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.settle();
    let log = log_of(&env, run);
    assert_whole(&log, EventKind::Cancelled);
    let want: Vec<u32> = log.iter().map(|e| e.seq).collect();
    for (c, out) in &mut curls {
        exits_within(c, "a stream of the cancelled run", Duration::from_secs(10));
        let got: Vec<u32> = parse_sse(&std::fs::read_to_string(&*out).unwrap())
            .iter()
            .map(|(id, _, _)| *id)
            .collect();
        assert_eq!(got, want, "every stream received the whole log");
    }
    env.check(&[]);
}
