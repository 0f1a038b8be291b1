//! `pelican`: the worker, the API and the operator's commands, on live Redis
//! Streams and PostgreSQL, with the built-in job kinds. `pelican --help`
//! lists the commands; every flag has an environment variable.

use pelican_real::jobs::Registry;
use std::process::ExitCode;

// The worker allocates per delivery (futures, commands, replies); glibc's
// malloc was a fifth of its CPU time in the drain benchmark's profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    pelican_real::cli::main_with(Registry::register_builtins)
}
