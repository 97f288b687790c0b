//! The unmutated core passes a small exhaustive check (the CI-sized one runs from
//! `scripts/model.sh` in release: `cargo run --release -p leasehold-model`).

#![cfg(not(any(feature = "mutant-late-shortened", feature = "mutant-receive-time")))]

use leasehold_model::{check, Params};

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
    assert!(
        outcome.examples.contains(&"a reduced grant is held"),
        "{}",
        outcome.report()
    );
}
