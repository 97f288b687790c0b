//! The unmutated core passes a small exhaustive check (the CI-sized one runs from
//! `scripts/model.sh` in release: `cargo run --release -p leasehold-model`).

#![cfg(not(any(feature = "mutant-late-shortened", feature = "mutant-receive-time")))]

use leasehold_model::{check, props, Params};

#[test]
fn the_real_core_has_no_counterexample_in_a_small_space() {
    let params = Params {
        horizon: 11,
        fault_window: 2,
        faults: 1,
        ..Params::SMALL
    };
    let outcome = check(params, 2, false);
    println!("{}", outcome.report());
    assert!(outcome.failures.is_empty(), "{}", outcome.report());
    assert!(outcome.unique_states > 1_000, "the space was explored");
}

#[test]
fn the_model_reaches_a_reduced_grant_and_a_stale_write() {
    let params = Params {
        horizon: 11,
        fault_window: 3,
        faults: 1,
        grant_max: 6,
        ..Params::SMALL
    };
    let outcome = check(params, 2, false);
    println!("{}", outcome.report());
    assert!(outcome.failures.is_empty(), "{}", outcome.report());
    for example in [props::REDUCED_GRANT_HELD, props::STALE_WRITE_REFUSED] {
        assert!(
            outcome.examples.contains(&example),
            "not reached: {example:?}\n{}",
            outcome.report()
        );
    }
}

/// The CI run (`scripts/model.sh`, `leasehold-model ci`) fails unless it reaches every
/// `sometimes` property; other bounds only print what they reached.
#[test]
fn the_ci_run_must_reach_every_sometimes_property() {
    assert_eq!(props::required_examples(&Params::CI), props::EXAMPLES);
    assert_eq!(props::EXAMPLES.len(), 4);
    assert!(props::required_examples(&Params::SMALL).is_empty());
}
