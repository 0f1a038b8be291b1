//! The agent's worker: the `pelican` command line (`worker`, `api`,
//! `migrate`, ...) with the `agent` kind registered beside the built-in
//! ones. Build it with `cargo worker`; run `agent worker --help`.

use pelican_example_agent::CountingProvider;
use pelican_sdk::Registry;
use std::sync::Arc;

fn handlers(registry: &mut Registry) {
    registry.register_builtins();
    pelican_example_agent::register(registry, Arc::new(CountingProvider::default()));
}

fn main() -> std::process::ExitCode {
    pelican_sdk::main_with(handlers)
}
