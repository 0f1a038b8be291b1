//! The `pelican` command line, for the `pelican` binary and for a user's
//! own worker binary: [`main_with`] parses the usual commands, flags and
//! environment, and runs the worker with the handlers the caller registers.
//!
//! ```no_run
//! use pelican_real::jobs::{JobContext, JobError, Registry};
//!
//! async fn hello(ctx: JobContext) -> Result<String, JobError> {
//!     Ok(format!("hello, run {}", ctx.run))
//! }
//!
//! fn handlers(registry: &mut Registry) {
//!     registry.register("hello", hello);
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     pelican_real::cli::main_with(handlers)
//! }
//! ```

mod args;
mod bench;
mod commands;
mod deployment;
mod dev;
mod output;
mod reference;
mod schedules;

pub use reference::{command, configuration_tables};

use crate::jobs::Registry;
use args::Cli;
use clap::{CommandFactory, FromArgMatches};
use commands::{init_logs, main_inner};
use std::process::ExitCode;

/// Whether argument `id` was given (on the command line or as its
/// variable) rather than left at its default, at the top or in the
/// subcommand (a global argument may be given at either).
fn given(matches: &clap::ArgMatches, id: &str) -> bool {
    let here = matches
        .value_source(id)
        .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue);
    here || matches.subcommand().is_some_and(|(_, sub)| given(sub, id))
}

/// Runs the command line given to this process (`migrate`, `api`,
/// `worker`, `submit`, ...: `--help` lists them), on a tokio runtime of its
/// own. `handlers` registers the job handlers a `worker` runs (the
/// `pelican` binary registers the built-in kinds,
/// [`Registry::register_builtins`]). Answers the process's exit code, after
/// printing any error.
pub fn main_with(handlers: fn(&mut Registry)) -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let args::Cmd::Dev(a) = &mut cli.command {
        a.existing_redis = given(&matches, "redis_url");
        a.existing_database = given(&matches, "database_url");
    }
    init_logs(cli.log_format, cli.log_level);
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pelican: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_inner(cli, handlers)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelican: {e:#}");
            ExitCode::FAILURE
        }
    }
}
