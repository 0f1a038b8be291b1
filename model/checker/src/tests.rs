//! The model's own tests: pinned state counts, the correct protocol passes,
//! and each mutant yields a counterexample.

use crate::Config;
use crate::report::{self, Options, Verdict};

fn opts() -> Options {
    Options {
        threads: 2,
        ..Options::default()
    }
}

#[test]
fn small_is_complete_and_correct() {
    let r = report::check(&Config::small(), &opts());
    assert!(r.complete);
    for (name, v) in &r.properties {
        assert!(
            matches!(v, Verdict::Holds) || !crate::PelicanModel::ALWAYS.contains(&name.as_str()),
            "{name}: {v:?}\n{:#?}",
            r.counterexamples
        );
    }
}
