//! `pelican dev`: the whole system on one machine, in one command. Redis
//! and Postgres start from the machine's own binaries with their data in
//! one directory (kept between runs), the schema is migrated, and the API
//! and the workers start as child processes of this one, each line of
//! their logs prefixed with its source. Ctrl-C stops them in order: the
//! workers and the API first (they finish what they hold), then Postgres
//! and Redis, and nothing is left running.

use super::args::{Connection, DevArgs};
use anyhow::{Context, Result, bail};
use std::io::IsTerminal as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to accept connections, and a child to stop.
const WAIT: Duration = Duration::from_secs(30);

/// How to start a child again: the API and the workers, when one exits
/// on its own (a `kill -9` to watch a takeover, say), start again.
type Again = Box<dyn Fn() -> std::process::Command + Send + Sync>;

/// One child process: its name, the process, and how to start it again
/// (`None`: a server, whose exit ends `pelican dev`).
struct Entry {
    name: String,
    child: Child,
    again: Option<Again>,
}

/// The child processes, in the order they started; stopped in reverse.
#[derive(Default)]
struct Children(Vec<Entry>);

impl Children {
    /// Starts `cmd` as `name` (see [`start_child`]); `again`, if given,
    /// starts it again when it exits on its own.
    fn spawn(
        &mut self,
        name: &str,
        cmd: std::process::Command,
        again: Option<Again>,
    ) -> Result<()> {
        let child = start_child(name, cmd)?;
        self.0.push(Entry {
            name: name.to_owned(),
            child,
            again,
        });
        Ok(())
    }

    /// Starts again each child that exited and can be; the name of a
    /// server that exited, if one did.
    fn check(&mut self) -> Result<Option<String>> {
        for e in &mut self.0 {
            let Some(status) = e.child.try_wait().ok().flatten() else {
                continue;
            };
            let Some(again) = &e.again else {
                return Ok(Some(e.name.clone()));
            };
            println!(
                "pelican dev: {} exited ({status}); starting it again",
                e.name
            );
            e.child = start_child(&e.name, again())?;
        }
        Ok(None)
    }

    /// Stops every child, the last started first: `signal` for the
    /// servers, SIGTERM (a graceful stop) for the rest; SIGKILL for one
    /// that takes longer than [`WAIT`].
    async fn stop(&mut self) {
        while let Some(Entry {
            name, mut child, ..
        }) = self.0.pop()
        {
            let signal = match name.as_str() {
                // Postgres's fast shutdown; Redis saves and exits on TERM.
                "postgres" => "INT",
                _ => "TERM",
            };
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-s", signal, &pid.to_string()])
                    .status();
            }
            if tokio::time::timeout(WAIT, child.wait()).await.is_err() {
                eprintln!("pelican dev: {name} did not stop within {WAIT:?}; killing it");
                let _ = child.kill().await;
            }
        }
    }
}

/// Starts `cmd` as `name`: in a process group of its own (a terminal's
/// Ctrl-C reaches this process only, which stops the children in order),
/// its output's lines prefixed with `name`.
fn start_child(name: &str, mut cmd: std::process::Command) -> Result<Child> {
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let outputs: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
        child.stdout.take().map(|o| Box::new(o) as _),
        child.stderr.take().map(|e| Box::new(e) as _),
    ];
    for out in outputs.into_iter().flatten() {
        let prefix = format!("{name:>9} |");
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                println!("{prefix} {line}");
            }
        });
    }
    Ok(child)
}

/// `pelican dev`.
///
/// # Errors
/// A server's binary is missing, a server or child did not start, or
/// migrating failed.
pub(crate) async fn dev(c: &Connection, a: DevArgs) -> Result<()> {
    let dir = a.data_dir.clone();
    if a.reset && dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let mut children = Children::default();
    // Ctrl-C while starting stops what has started, as later.
    let run = tokio::select! {
        started = start(c, &a, &dir, &mut children) => started,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted while starting")),
    };
    let outcome = match run {
        Ok(()) => wait(&mut children).await,
        Err(e) => Err(e),
    };
    println!("pelican dev: stopping");
    children.stop().await;
    println!("pelican dev: stopped");
    outcome
}

/// Starts the servers (unless given), migrates, starts the API and the
/// workers, and prints where everything is.
async fn start(c: &Connection, a: &DevArgs, dir: &Path, children: &mut Children) -> Result<()> {
    let mut conn = c.clone();
    if !a.existing_redis {
        conn.redis_url = start_redis(dir, children)?;
    }
    if !a.existing_database {
        conn.database_url = start_postgres(dir, children).await?;
    }
    let deadline = Instant::now() + WAIT;
    while let Err(e) = super::commands::migrate(&conn).await {
        if Instant::now() > deadline {
            return Err(e.context("the servers did not come up"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let token = (a.api_token.clone()).unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let me = std::env::current_exe().context("finding this binary")?;
    let plain = !std::io::stdout().is_terminal();
    let listen = a.listen.to_string();
    let recipe = |args: &[&str], token: Option<&str>| -> Again {
        let (me, env) = (me.clone(), settings(&conn));
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let token = token.map(str::to_owned);
        Box::new(move || {
            let mut cmd = std::process::Command::new(&me);
            cmd.args(&args).envs(env.clone());
            if let Some(token) = &token {
                // A variable, not an argument, which `ps` would show.
                cmd.env("PELICAN_API_TOKEN", token);
            }
            if plain {
                // Their lines go to a file or a pipe: no colours.
                cmd.env("NO_COLOR", "1");
            }
            cmd
        })
    };
    let api = recipe(&["api", "--listen", &listen], Some(&token));
    children.spawn("api", api(), Some(api))?;
    for n in 1..=a.workers {
        let worker = recipe(&["worker", "--id", &n.to_string()], None);
        children.spawn(&format!("worker-{n}"), worker(), Some(worker))?;
    }
    println!("pelican dev: redis {}", conn.redis_url);
    println!("pelican dev: postgres {}", conn.database_url);
    println!("pelican dev: dashboard http://{listen}/  (token {token})");
    println!(
        "pelican dev: from another shell: export REDIS_URL={} DATABASE_URL={} \
         PELICAN_API_URL=http://{listen} PELICAN_API_TOKEN={token}; then `pelican submit noop` \
         and `pelican watch 1`. Ctrl-C here stops everything.",
        conn.redis_url, conn.database_url
    );
    Ok(())
}

/// The connection's settings as the variables the children read (the rest
/// of their settings they inherit as variables).
fn settings(c: &Connection) -> Vec<(&'static str, String)> {
    let mut settings = vec![
        ("REDIS_URL", c.redis_url.clone()),
        ("DATABASE_URL", c.database_url.clone()),
        ("PELICAN_STREAM", c.stream.clone()),
        ("PELICAN_GROUP", c.group.clone()),
        ("PELICAN_PARTITIONS", c.partitions.to_string()),
        ("PELICAN_CALL_TIMEOUT_MS", c.call_timeout_ms.to_string()),
    ];
    if let Some(otlp) = &c.otlp_endpoint {
        settings.push(("PELICAN_OTLP_ENDPOINT", otlp.clone()));
    }
    settings
}

/// Until Ctrl-C (or SIGTERM), or a child exits on its own.
async fn wait(children: &mut Children) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = tick.tick() => {
                if let Some(name) = children.check()? {
                    bail!("{name} exited; see its log above");
                }
            }
        }
    }
}

/// A port nobody listens on now, on 127.0.0.1.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `redis-server` with its data in `dir/redis` (an append-only file,
/// so the data survive a restart); its URL.
fn start_redis(dir: &Path, children: &mut Children) -> Result<String> {
    let server = find("redis-server", &[]).context(
        "redis-server is not installed: install the package `redis-server` (Debian, Ubuntu) \
         or `redis` (Homebrew), or give --redis-url",
    )?;
    let data = dir.join("redis");
    std::fs::create_dir_all(&data)?;
    let port = free_port()?.to_string();
    let mut cmd = std::process::Command::new(server);
    cmd.args([
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--appendonly",
        "yes",
        "--save",
        "",
    ])
    .arg("--dir")
    .arg(&data);
    children.spawn("redis", cmd, None)?;
    Ok(format!("redis://127.0.0.1:{port}"))
}

/// Starts `postgres` with its cluster in `dir/postgres` (made by `initdb`
/// the first time); its URL. Run as root, the servers run as the
/// `postgres` user, which Postgres requires.
async fn start_postgres(dir: &Path, children: &mut Children) -> Result<String> {
    let missing = "PostgreSQL is not installed: install the package `postgresql` (Debian, \
                   Ubuntu) or `postgresql@17` (Homebrew), or give --database-url";
    let postgres = find("postgres", &pg_dirs()).context(missing)?;
    let initdb = find("initdb", &pg_dirs()).context(missing)?;
    let owner = owner()?;
    let data = dir.join("postgres");
    if !data.join("PG_VERSION").exists() {
        std::fs::create_dir_all(&data)?;
        chown(dir, owner)?;
        let mut cmd = as_user(std::process::Command::new(initdb), owner);
        cmd.args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D"])
            .arg(&data);
        let out = Command::from(cmd)
            .output()
            .await
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let port = free_port()?.to_string();
    let mut cmd = as_user(std::process::Command::new(postgres), owner);
    cmd.arg("-D").arg(&data).args([
        "-p",
        &port,
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
    ]);
    children.spawn("postgres", cmd, None)?;
    Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
}

/// Where Debian and Homebrew keep Postgres's server binaries, newest
/// version first (Debian keeps them off PATH).
fn pg_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (root, prefix) in [
        ("/usr/lib/postgresql", ""),
        ("/opt/homebrew/opt", "postgresql@"),
        ("/usr/local/opt", "postgresql@"),
    ] {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .map(|p| p.join("bin"))
            .collect();
        found.sort();
        dirs.extend(found.into_iter().rev());
    }
    dirs
}

/// `name` on PATH, else in the first of `dirs` that has it.
fn find(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(dirs.iter().cloned())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The user the Postgres server runs as: this process's, or, run as root,
/// `postgres` (uid and gid).
fn owner() -> Result<Option<(u32, u32)>> {
    let uid = std::process::Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let ids = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres"))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    });
    match ids {
        Some(ids) => Ok(Some(ids)),
        None => bail!(
            "Postgres does not run as root, and there is no `postgres` user to run it as: run `pelican dev` as another user"
        ),
    }
}

/// `cmd`, run as `owner` when there is one.
fn as_user(mut cmd: std::process::Command, owner: Option<(u32, u32)>) -> std::process::Command {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// Gives `dir` to `owner` (recursively), when there is one.
fn chown(dir: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    let ok = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(dir)
        .status()?
        .success();
    if !ok {
        bail!("cannot give {} to the postgres user", dir.display());
    }
    Ok(())
}
