//! The model's own tests: pinned state counts (silent model drift fails
//! here), the correct protocol passes, each mutant yields a counterexample.

use crate::Config;
use crate::report::{self, Options, Report, Verdict};

fn opts() -> Options {
    Options {
        threads: 2,
        ..Options::default()
    }
}

fn assert_correct(r: &Report) {
    assert!(r.complete, "incomplete exploration");
    for (name, v) in &r.properties {
        assert!(
            matches!(v, Verdict::Holds | Verdict::Reached),
            "{name}: {v:?}\n{}",
            r.counterexamples
                .iter()
                .map(|c| c.timeline.as_str())
                .collect::<String>()
        );
    }
}

/// Pinned: a change to the model or the protocol that changes how many
/// states `small` has must update these numbers on purpose.
const SMALL_UNIQUE_STATES: usize = 1086;
/// The same, with symmetry reduction over workers.
const SMALL_SYMMETRIC_STATES: usize = 544;

#[test]
fn small_state_count_is_pinned() {
    let plain = Options {
        symmetry: false,
        ..opts()
    };
    let r = report::check(&Config::small(), &plain);
    assert!(r.complete);
    assert_eq!(
        r.unique_states, SMALL_UNIQUE_STATES,
        "the model drifted: update the pin on purpose"
    );
    for name in crate::PelicanModel::ALWAYS {
        assert_eq!(r.properties[name], Verdict::Holds, "{name}");
    }
    let sym = report::check(
        &Config::small(),
        &Options {
            symmetry: true,
            ..opts()
        },
    );
    assert_eq!(
        sym.unique_states, SMALL_SYMMETRIC_STATES,
        "the model drifted: update the pin on purpose"
    );
    assert_eq!(
        sym.properties, r.properties,
        "symmetry reduction changed a verdict"
    );
}

#[test]
fn small_bfs_and_dfs_agree() {
    let dfs = report::check(
        &Config::small(),
        &Options {
            symmetry: false,
            ..opts()
        },
    );
    let bfs = report::check(
        &Config::small(),
        &Options {
            bfs: true,
            ..opts()
        },
    );
    assert_eq!(dfs.unique_states, bfs.unique_states);
    assert_eq!(dfs.properties, bfs.properties);
}

/// The symmetry reduction is sound only if relabeling workers changes
/// nothing a property or an action depends on, and the representative is the
/// same for every relabeling. Checked along random walks of `standard`.
#[test]
fn worker_relabeling_is_a_symmetry() {
    use crate::state::{State, representative};
    let cfg = Config::standard();
    let mut seed: u64 = 7;
    let mut rnd = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let mut seen_both_busy = false;
    for _ in 0..200 {
        let mut s = State::initial(&cfg);
        for _ in 0..80 {
            let swapped = s.permuted(&[1, 0]);
            assert_eq!(
                swapped.permuted(&[1, 0]),
                s,
                "swapping twice is the identity"
            );
            assert_eq!(representative(&swapped), representative(&s));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            s.actions(&cfg, &mut a);
            swapped.actions(&cfg, &mut b);
            assert_eq!(
                a.len(),
                b.len(),
                "a relabeled state enables as many actions"
            );
            assert_eq!(s.compute_derived(&cfg), swapped.compute_derived(&cfg));
            seen_both_busy |= s.workers.iter().all(|w| w.delivery.is_some());
            if a.is_empty() {
                break;
            }
            let action = a[rnd(a.len())];
            s.step(&cfg, action);
        }
    }
    assert!(seen_both_busy, "the walks never had both workers busy");
}

/// The standard configuration: complete, every `always` property holds and
/// every `sometimes` property is reached. Slow in debug builds: `cargo xtask
/// test` runs it in release mode.
#[test]
#[ignore = "release mode only: run by `cargo xtask test`"]
fn standard_holds_and_reaches_every_interesting_path() {
    assert_correct(&report::check(&Config::standard(), &opts()));
}

#[cfg(feature = "mutants")]
mod mutants {
    use super::*;
    use pelican_model::protocol::Mutant;

    fn caught(config: Config, m: Mutant) -> usize {
        let r = report::check(
            &config.with_mutant(Some(m)),
            &Options {
                stop_at_failure: true,
                bfs: true,
                ..opts()
            },
        );
        let c = r
            .shortest()
            .unwrap_or_else(|| panic!("mutant {m} was not caught"));
        assert!(!c.timeline.is_empty());
        c.path_len
    }

    macro_rules! mutant_tests {
        ($($name:ident: $mutant:ident on $config:ident;)*) => {$(
            #[test]
            #[ignore = "release mode only: run by `cargo xtask test`"]
            fn $name() {
                let len = caught(Config::$config(), Mutant::$mutant);
                assert!(len > 0);
            }
        )*};
    }

    mutant_tests! {
        mutant_ack_before_commit: AckBeforeCommit on standard;
        mutant_no_fence: NoFence on standard;
        mutant_no_terminal_check: NoTerminalCheck on standard;
        mutant_no_idempotency_key: NoIdempotencyKey on standard;
        mutant_retry_in_pel: RetryInPel on standard;
        mutant_no_dead_letter: NoDeadLetter on standard;
        mutant_stale_ack: StaleAck on standard;
        mutant_ignore_trimmed: IgnoreTrimmed on standard;
        mutant_revive_cancelled: ReviveCancelled on standard;
        mutant_no_publish_recovery: NoPublishRecovery on standard;
    }
}
