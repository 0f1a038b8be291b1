//! `pelican`: the worker, the API and the operator's commands, on live Redis
//! Streams and PostgreSQL. `pelican --help` lists the commands; every flag
//! has an environment variable.

mod cli;
mod commands;

use clap::Parser;
use cli::Cli;
use commands::{init_logs, main_inner};
use std::process::ExitCode;

fn main() -> ExitCode {
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
    match runtime.block_on(main_inner(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelican: {e:#}");
            ExitCode::FAILURE
        }
    }
}
