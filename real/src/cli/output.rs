//! What the commands print: tables and lines for people, or with `--json`
//! the API's JSON bodies for scripts.

use pelican_client::wire;
use serde::Serialize;
use std::fmt::Write as _;

/// Prints `value` as JSON when `json`, else as `human` renders it.
pub(crate) fn show<T: Serialize>(json: bool, value: &T, human: impl FnOnce(&T) -> String) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("the API's bodies serialize")
        );
    } else {
        print!("{}", human(value));
    }
}

/// Columns aligned by their widest cell, two spaces apart, without
/// borders (`comfy-table`'s layout, never wrapped to a terminal's width).
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.to_vec())
        .add_rows(rows.iter().cloned());
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Milliseconds since the epoch as the time of day, UTC.
fn utc(ms: u64) -> String {
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        s / 3600 % 24,
        s / 60 % 60,
        s % 60,
        ms % 1000
    )
}

fn or_dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `pelican status RUN`.
pub(crate) fn run(r: &wire::Run) -> String {
    let mut out = format!(
        "run {}  {}  {}  (attempts {}/{}, dispatch {})\n",
        r.run_id.0,
        r.kind,
        r.status.as_str(),
        r.attempts.len(),
        r.attempts_max,
        r.dispatch
    );
    let _ = writeln!(out, "input   {}", r.input);
    if let Some(result) = &r.result {
        let _ = writeln!(out, "result  {result}");
    }
    if let Some(e) = &r.error {
        let _ = writeln!(out, "error   {}: {}", e.class, e.message);
    }
    if let Some(lease) = r.lease_until_ms {
        let _ = writeln!(out, "lease until {} (Postgres's clock)", utc(lease));
    }
    if let Some(due) = r.due_at_ms {
        let _ = writeln!(out, "due at  {} (Postgres's clock)", utc(due));
    }
    if !r.attempts.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .attempts
            .iter()
            .map(|a| {
                vec![
                    a.attempt.to_string(),
                    a.fence.to_string(),
                    a.worker.clone(),
                    a.entry_id.clone(),
                    or_dash(a.outcome.as_deref()),
                ]
            })
            .collect();
        out.push_str(&table(
            &["attempt", "fence", "worker", "entry", "outcome"],
            &rows,
        ));
    }
    if !r.steps.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .steps
            .iter()
            .map(|s| {
                vec![
                    s.step.to_string(),
                    s.name.clone(),
                    s.fence.to_string(),
                    s.output.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(&["step", "name", "fence", "output"], &rows));
    }
    out
}

/// `pelican status`: runs by status, then the queue.
pub(crate) fn status(runs: &[(String, u64)], q: &wire::Queue) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|(s, n)| vec![s.clone(), n.to_string()])
        .collect();
    let mut out = table(&["status", "runs"], &rows);
    let _ = writeln!(
        out,
        "\nstream {} (group {}): {} entries, lag {}, {} pending, oldest idle {}, {} dead-letter entries",
        q.stream,
        q.group,
        q.length,
        or_dash(q.lag),
        q.pending,
        q.oldest_idle_ms.map_or_else(
            || "-".to_owned(),
            |ms| format!("{:.1} s", ms as f64 / 1000.0)
        ),
        q.dead_letters
    );
    if !q.group_exists {
        out.push_str("the consumer group does not exist yet (pelican migrate makes it)\n");
    }
    if !q.consumers.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = q
            .consumers
            .iter()
            .map(|c| vec![c.name.clone(), c.pending.to_string()])
            .collect();
        out.push_str(&table(&["consumer", "pending"], &rows));
    }
    out
}

/// `pelican dlq list`.
pub(crate) fn dead_letters(letters: &[wire::DeadLetter]) -> String {
    if letters.is_empty() {
        return "no dead letters\n".into();
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|d| {
            vec![
                d.run_id.0.to_string(),
                d.class.clone(),
                d.attempts.len().to_string(),
                if d.requeued { "yes" } else { "no" }.to_owned(),
                d.message.clone(),
            ]
        })
        .collect();
    table(&["run", "class", "attempts", "requeued", "message"], &rows)
}

/// A submission's answer.
pub(crate) fn submitted(s: &wire::Submitted) -> String {
    match (s.existing, s.published) {
        (true, _) => format!("run {} exists already for this key\n", s.run_id.0),
        (false, Some(false)) => format!(
            "run {} stored; not yet published (the outbox publishes it)\n",
            s.run_id.0
        ),
        _ => format!("run {} queued\n", s.run_id.0),
    }
}

/// A cancel's or a requeue's answer.
/// Schedules as a table, each with its next tick.
pub(crate) fn schedules(s: &wire::Schedules) -> String {
    if s.schedules.is_empty() {
        return "no schedules\n".into();
    }
    let rows: Vec<Vec<String>> = s
        .schedules
        .iter()
        .map(|s| {
            let next = s
                .next_ticks_ms
                .first()
                .map_or_else(|| "never".into(), |t| rfc3339(*t));
            vec![
                s.spec.name.clone(),
                s.spec.kind.clone(),
                format!("{} ({})", s.spec.cron, s.spec.tz),
                next,
                s.spec.overlap.to_string(),
                s.spec.catchup.to_string(),
                s.fired.to_string(),
                s.skipped.to_string(),
            ]
        })
        .collect();
    let header = [
        "name",
        "kind",
        "cron",
        "next tick",
        "overlap",
        "catch-up",
        "fired",
        "skipped",
    ];
    table(&header, &rows)
}

/// One schedule, after `pelican schedule put` or `delete`.
pub(crate) fn schedule(s: &wire::Schedule) -> String {
    let next: Vec<String> = s.next_ticks_ms.iter().map(|t| rfc3339(*t)).collect();
    format!(
        "schedule {} ({}): {} {} in {}, next ticks {}\n",
        s.spec.name,
        s.id,
        s.spec.kind,
        s.spec.cron,
        s.spec.tz,
        if next.is_empty() {
            "none".into()
        } else {
            next.join(", ")
        }
    )
}

/// `ms` since the Unix epoch as RFC 3339, to the second.
fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

pub(crate) fn changed(c: &wire::Changed) -> String {
    match c.extra_attempts {
        Some(n) => format!(
            "run {} queued again with {n} more attempt{}\n",
            c.run_id.0,
            if n == 1 { "" } else { "s" }
        ),
        None => format!("run {} {}\n", c.run_id.0, c.status.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn times_of_day_are_utc() {
        assert_eq!(super::utc(1_796_192_396_924), "06:19:56.924 UTC");
    }

    #[test]
    fn columns_align_on_their_widest_cell() {
        let t = table(
            &["run", "class"],
            &[
                vec!["7".into(), "retryable".into()],
                vec!["1234".into(), "x".into()],
            ],
        );
        assert_eq!(t, "run   class\n7     retryable\n1234  x\n");
    }
}
