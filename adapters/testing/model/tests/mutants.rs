//! The check can fail: each cargo feature of this crate puts a known defect back into
//! the client, and the checker must find a counterexample and print its path.
//!
//! Run with `cargo test --release -p leasehold-model --features mutant-late-shortened`
//! (or `mutant-receive-time`); `scripts/model.sh` runs both.

#![cfg(any(feature = "mutant-late-shortened", feature = "mutant-receive-time"))]

use leasehold_model::{check, props, Params};

/// Checks the small space, stopping at the first counterexample, and asserts one was
/// found for `property`.
fn expect_counterexample(property: &str) {
    let outcome = check(Params::SMALL, 2, true);
    println!("{}", outcome.report());
    assert!(
        outcome.failures.contains_key(property),
        "the mutation was not caught: no counterexample to {property:?} (found: {:?})",
        outcome.failures.keys().collect::<Vec<_>>()
    );
    let path = &outcome.failures[property];
    assert!(path.len() > 1, "a counterexample is a path from the start");
}

/// The old core ignored a late `Renewed { ttl < asked }`: a renewal that the service
/// answered after the client had stopped waiting for it. The client then kept writing
/// until a deadline the shortened expiry may not cover.
#[cfg(feature = "mutant-late-shortened")]
#[test]
fn ignoring_a_late_shortened_renewal_is_caught() {
    expect_counterexample(props::ENDING_ANSWER_CLOSES);
}

/// A client that counts the grant from when the answer *arrived* holds the gate open
/// past the service's expiry by the answer's delay: a write after the key is gone.
#[cfg(feature = "mutant-receive-time")]
#[test]
fn a_receive_time_deadline_is_caught() {
    expect_counterexample(props::GATE_BEFORE_EXPIRY);
}
