//! `cargo xtask dev`: the whole system on a fresh machine. Installs Redis
//! and PostgreSQL with the system's package manager when they are missing
//! (as `.ci/run` does), builds `pelican`, and becomes `pelican dev`.

use crate::{build_pelican, run};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// `cargo xtask dev [PELICAN-DEV-OPTIONS]`.
pub(crate) fn dev(args: &[String]) -> Result<(), String> {
    install_servers()?;
    let pelican = build_pelican(false, &[])?;
    // In place of this process: Ctrl-C reaches `pelican dev` alone, which
    // stops what it started, in order.
    let err = Command::new(pelican).arg("dev").args(args).exec();
    Err(format!("running pelican dev: {err}"))
}

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(name).is_file())
}

/// Whether a Postgres server binary is where `pelican dev` looks: on PATH,
/// or in Debian's or Homebrew's versioned directories.
fn postgres_installed() -> bool {
    on_path("postgres")
        || ["/usr/lib/postgresql", "/opt/homebrew/opt", "/usr/local/opt"]
            .iter()
            .filter_map(|root| std::fs::read_dir(root).ok())
            .flatten()
            .filter_map(Result::ok)
            .any(|e| e.path().join("bin/postgres").is_file())
}

/// Installs what is missing: `redis-server` and `postgresql` with apt (as
/// root, or through sudo), or `redis` and `postgresql@17` with Homebrew.
fn install_servers() -> Result<(), String> {
    let (redis, postgres) = (on_path("redis-server"), postgres_installed());
    if redis && postgres {
        return Ok(());
    }
    if on_path("apt-get") {
        let mut packages = Vec::new();
        if !redis {
            packages.push("redis-server");
        }
        if !postgres {
            packages.push("postgresql");
        }
        eprintln!("xtask: installing {} (apt-get)", packages.join(" "));
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let apt = |args: &[&str]| {
            let mut c = if root {
                Command::new("apt-get")
            } else {
                Command::new("sudo")
            };
            if !root {
                c.arg("apt-get");
            }
            c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        run("apt-get update", apt(&["update", "-q"]))?;
        let mut install = apt(&["install", "-y", "-q"]);
        install.args(&packages);
        return run("apt-get install", install);
    }
    if on_path("brew") {
        let mut install = Command::new("brew");
        install.arg("install");
        if !redis {
            install.arg("redis");
        }
        if !postgres {
            install.arg("postgresql@17");
        }
        return run("brew install", install);
    }
    Err(
        "install Redis (redis-server) and PostgreSQL (postgres, initdb) with your \
         system's package manager, then run `cargo xtask dev` again"
            .into(),
    )
}
