//! Deterministic simulation of Pelican under madsim.
//!
//! One seed is one simulated world: a Redis node and a Postgres node serving
//! the model's reference semantics ([`pelican_model::world::World`]) over
//! madsim's network, N worker nodes running `pelican-real`'s driver (the
//! code the live worker runs), an API node submitting and cancelling runs,
//! and a tool service applying idempotency keys. Every random choice — the
//! workload, which faults this seed uses and how often (swarm testing), the
//! fault schedule, network latency, lost messages — comes from the seed.
//!
//! A seed has a fault phase, then a healing phase in which every fault
//! stops and every accepted run must reach a terminal state with the PEL
//! empty within a bound (liveness). The oracle checks the guarantees while
//! the seed runs (every command is applied through `World`, which checks the
//! step guarantees) and at the end ([`pelican_model::invariants`]).
//!
//! Build with `RUSTFLAGS="--cfg madsim"` (`cargo xtask sim` does); without
//! it this crate is empty.

#![warn(missing_docs)]

#[cfg(madsim)]
pub mod harness;
#[cfg(madsim)]
pub mod nemesis;
#[cfg(madsim)]
pub mod net;
#[cfg(madsim)]
pub mod oracle;
pub mod scenario;
#[cfg(madsim)]
pub mod seed;
pub mod trace;

#[cfg(madsim)]
pub use harness::{External, JobSim, Sweep};
pub use scenario::{FaultMix, Scenario};
#[cfg(madsim)]
pub use seed::{Failure, SeedOutcome, run_seed};

/// Silences the panic messages of jobs of kind `panic`, which panic on
/// purpose (the driver catches them and records a `Panic` failure); every
/// other panic is reported as usual. Installs the hook once per process.
pub fn quiet_job_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !text.contains(pelican_real::jobs::PANIC_ON_PURPOSE) {
                default(info);
            }
        }));
    });
}
