//! The soak's series as plots: one PNG a group of series (tables, streams,
//! Postgres's load, memory, latencies) against time, drawn by gnuplot from
//! a report's samples, for docs/PERFORMANCE.md.

use super::Sample;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One plot: its file's stem, its title, the series it draws (by name
/// prefix) and its y axis's label.
struct Panel {
    file: &'static str,
    title: &'static str,
    prefixes: &'static [&'static str],
    unit: &'static str,
    /// A logarithmic y axis (series far apart, or spikes).
    log: bool,
}

const PANELS: &[Panel] = &[
    Panel {
        file: "soak-rows",
        title: "Postgres rows by table",
        prefixes: &["pg.rows."],
        unit: "rows",
        log: false,
    },
    Panel {
        file: "soak-mib",
        title: "Postgres size by table (indexes and TOAST included)",
        prefixes: &["pg.mib."],
        unit: "MiB",
        log: false,
    },
    Panel {
        file: "soak-redis",
        title: "Redis: job and dead-letter streams, PEL, consumers",
        prefixes: &["redis."],
        unit: "entries",
        log: true,
    },
    Panel {
        file: "soak-postgres-load",
        title: "Postgres: connections and commits a second",
        prefixes: &["pg.connections", "pg.commits_per_s"],
        unit: "",
        log: true,
    },
    Panel {
        file: "soak-rss",
        title: "Resident memory by process",
        prefixes: &["rss_mib."],
        unit: "MiB",
        log: false,
    },
    Panel {
        file: "soak-latency",
        title: "Submission latency and event lag to watchers (p50, p99)",
        prefixes: &["submit_ms.", "watch_lag_ms."],
        unit: "ms",
        log: true,
    },
];

/// Draws every panel of `samples` into `dir` (made if missing), marking
/// the wipe at `wipe_s`. Answers the PNGs written.
///
/// # Errors
/// gnuplot missing or failing, or `dir` not writable.
pub fn plot(samples: &[Sample], wipe_s: f64, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for panel in PANELS {
        let series: Vec<&String> = samples
            .iter()
            .flat_map(|s| s.values.keys())
            .filter(|k| panel.prefixes.iter().any(|p| k.starts_with(p)))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if series.is_empty() {
            continue;
        }
        let data = dir.join(format!("{}.tsv", panel.file));
        std::fs::write(&data, table(samples, &series))
            .map_err(|e| format!("{}: {e}", data.display()))?;
        let png = dir.join(format!("{}.png", panel.file));
        let script = script(panel, &series, &data, &png, wipe_s);
        let out = Command::new("gnuplot")
            .arg("-e")
            .arg(&script)
            .output()
            .map_err(|e| format!("gnuplot: {e} (install it: apt-get install gnuplot-nox)"))?;
        let _ = std::fs::remove_file(&data);
        if !out.status.success() {
            return Err(format!(
                "gnuplot failed on {}: {}",
                panel.file,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        written.push(png);
    }
    Ok(written)
}

/// The samples as tab-separated columns: time, then each series (NaN
/// where a sample lacks it).
fn table(samples: &[Sample], series: &[&String]) -> String {
    let mut text = String::new();
    for s in samples {
        let _ = write!(text, "{:.1}", s.t_s);
        for name in series {
            let v = s.values.get(*name).copied().unwrap_or(f64::NAN);
            let _ = write!(text, "\t{v}");
        }
        text.push('\n');
    }
    text
}

fn script(panel: &Panel, series: &[&String], data: &Path, png: &Path, wipe_s: f64) -> String {
    let mut s = format!(
        "set terminal png size 960,420 font ',10' noenhanced; set output '{}'; \
         set title '{}'; set xlabel 'seconds'; set ylabel '{}'; \
         set key outside right top; set grid; set datafile missing 'NaN'; \
         set arrow from {wipe_s},graph 0 to {wipe_s},graph 1 nohead dt 2 lc rgb 'red'; \
         set label 'Redis wiped' at {wipe_s},graph 0.95 offset 0.5,0 tc rgb 'red'; plot ",
        png.display(),
        panel.title,
        panel.unit
    );
    if panel.log {
        s.insert_str(0, "set logscale y; ");
    }
    for (i, name) in series.iter().enumerate() {
        // One group's series by what follows their prefix; several groups'
        // by their whole names.
        let label = match panel.prefixes {
            [p] => name
                .strip_prefix(p)
                .filter(|l| !l.is_empty())
                .unwrap_or(name),
            _ => name,
        };
        let _ = write!(
            s,
            "{}'{}' using 1:{} with lines lw 2 title '{label}'",
            if i == 0 { "" } else { ", " },
            data.display(),
            i + 2,
        );
    }
    s
}
