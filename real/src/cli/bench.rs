//! `pelican bench`: a benchmark of a running deployment, through its API
//! alone. It submits `--runs` runs of `--kind` (`noop`) in bulk, follows
//! them to their ends through `GET /runs`, and reports the submission rate,
//! the drain rate and each run's latency from its submission to its end
//! (Postgres's `finished_at` against this machine's clock at the
//! submission: run it where the clocks agree). Runs still unfinished when
//! `--timeout-s` runs out are cancelled, so the bench leaves no work behind;
//! finished runs go with retention, as every other.

use super::args::BenchArgs;
use anyhow::{Context, Result, bail};
use pelican_client::{Client, RunId, RunStatus, Submit};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a bench found.
#[derive(Debug, Serialize)]
struct Report {
    /// Runs asked for.
    runs: u64,
    /// Runs the API accepted.
    accepted: u64,
    /// Accepted runs per second, over the submission.
    submitted_per_s: f64,
    /// Finished runs per second, from the first submission to the last end.
    drained_per_s: f64,
    /// Latency from submission to end, in ms: p50, p90, p99, max.
    latency_ms: [u64; 4],
    /// Finished runs by status.
    ended: BTreeMap<String, u64>,
    /// Runs cancelled because the bench timed out.
    cancelled: u64,
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// `pelican bench`.
///
/// # Errors
/// The API refused the token or the kind, or did not answer.
pub(crate) async fn bench(a: &BenchArgs, json: bool) -> Result<()> {
    let mut client = Client::new(&a.api_url)?;
    if let Some(t) = &a.api_token {
        client = client.with_token(t);
    }
    let started = Instant::now();
    let submitted = submit(&client, a).await?;
    let submit_s = started.elapsed().as_secs_f64();
    let deadline = started + Duration::from_secs(a.timeout_s);
    let ended = follow(&client, a, &submitted, deadline).await?;
    let unfinished: Vec<RunId> = (submitted.keys())
        .filter(|r| !ended.contains_key(r))
        .copied()
        .collect();
    for run in &unfinished {
        let _ = client.cancel(*run).await;
    }
    let report = summarize(a.runs, &submitted, &ended, submit_s, unfinished.len());
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    if !unfinished.is_empty() {
        bail!(
            "{} runs had not finished after {} s; they were cancelled",
            unfinished.len(),
            a.timeout_s
        );
    }
    Ok(())
}

/// Submits the runs in bulk requests of `--batch`: each accepted run, with
/// the time (ms since the epoch) its request was sent.
async fn submit(client: &Client, a: &BenchArgs) -> Result<BTreeMap<RunId, u64>> {
    let mut submitted = BTreeMap::new();
    let mut left = a.runs;
    while left > 0 {
        let n = left.min(a.batch);
        left -= n;
        let runs: Vec<Submit> = (0..n)
            .map(|_| Submit::new(&a.kind, serde_json::json!({})))
            .collect();
        let at = now_ms();
        let answers = client.submit_many(&runs).await.with_context(|| {
            format!(
                "submitting a batch of {n} (a smaller --batch fits a smaller \
                 --body-limit-bytes or --bulk-max of the API)"
            )
        })?;
        for answer in answers {
            match answer {
                Ok(s) => {
                    submitted.insert(s.run_id, at);
                }
                Err(e) => bail!("a run was refused: {e}"),
            }
        }
    }
    Ok(submitted)
}

/// Pages through the runs from the first unfinished one until every
/// submitted run has ended or `deadline` passes: each ended run's status
/// and end (ms since the epoch, Postgres's clock).
async fn follow(
    client: &Client,
    a: &BenchArgs,
    submitted: &BTreeMap<RunId, u64>,
    deadline: Instant,
) -> Result<BTreeMap<RunId, (RunStatus, u64)>> {
    let mut ended = BTreeMap::new();
    while ended.len() < submitted.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let first = submitted.keys().find(|r| !ended.contains_key(*r));
        let mut after = first.map(|r| RunId(r.0.saturating_sub(1)));
        loop {
            let page = client.runs(after, Some(&a.kind), None, 1_000).await?;
            for r in &page.runs {
                if let (true, Some(at)) = (submitted.contains_key(&r.run_id), r.finished_at_ms) {
                    ended.insert(r.run_id, (r.status, at));
                }
            }
            let last = page.runs.last().map(|r| r.run_id);
            match (page.next_cursor, last) {
                (Some(_), Some(last)) if submitted.keys().next_back() > Some(&last) => {
                    after = Some(last);
                }
                _ => break,
            }
        }
    }
    Ok(ended)
}

/// The report of a bench: rates, latency percentiles, ends by status.
fn summarize(
    runs: u64,
    submitted: &BTreeMap<RunId, u64>,
    ended: &BTreeMap<RunId, (RunStatus, u64)>,
    submit_s: f64,
    cancelled: usize,
) -> Report {
    let mut latencies: Vec<u64> = ended
        .iter()
        .map(|(r, (_, at))| at.saturating_sub(submitted[r]))
        .collect();
    latencies.sort_unstable();
    let pick = |q: f64| {
        let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies.get(i).copied().unwrap_or(0)
    };
    let first = submitted.values().min().copied().unwrap_or(0);
    let last = ended.values().map(|(_, at)| *at).max().unwrap_or(first);
    let drain_s = (last.saturating_sub(first) as f64 / 1_000.0).max(0.001);
    let mut by_status = BTreeMap::new();
    for (status, _) in ended.values() {
        *by_status.entry(status.as_str().to_owned()).or_insert(0) += 1;
    }
    Report {
        runs,
        accepted: submitted.len() as u64,
        submitted_per_s: submitted.len() as f64 / submit_s.max(0.001),
        drained_per_s: ended.len() as f64 / drain_s,
        latency_ms: [pick(0.5), pick(0.9), pick(0.99), pick(1.0)],
        ended: by_status,
        cancelled: cancelled as u64,
    }
}

fn print_report(r: &Report) {
    println!("runs          {} asked, {} accepted", r.runs, r.accepted);
    println!("submitted     {:.0} runs/s", r.submitted_per_s);
    println!("drained       {:.0} runs/s", r.drained_per_s);
    let [p50, p90, p99, max] = r.latency_ms;
    println!("latency (ms)  p50 {p50}  p90 {p90}  p99 {p99}  max {max}");
    let ended: Vec<String> = r.ended.iter().map(|(s, n)| format!("{s} {n}")).collect();
    println!("ended         {}", ended.join(", "));
    if r.cancelled > 0 {
        println!("cancelled     {} (unfinished at the timeout)", r.cancelled);
    }
}
