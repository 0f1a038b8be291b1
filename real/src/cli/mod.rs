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
mod commands;
mod deployment;
mod output;
mod reference;

pub use reference::{command, configuration_tables};

use crate::jobs::Registry;
use args::Cli;
use clap::Parser;
use commands::{init_logs, main_inner};
use std::process::ExitCode;

/// Runs the command line given to this process (`migrate`, `api`,
/// `worker`, `submit`, ...: `--help` lists them), on a tokio runtime of its
/// own. `handlers` registers the job handlers a `worker` runs (the
/// `pelican` binary registers the built-in kinds,
/// [`Registry::register_builtins`]). Answers the process's exit code, after
/// printing any error.
pub fn main_with(handlers: fn(&mut Registry)) -> ExitCode {
    let cli = Cli::parse();
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
