#![cfg(all(loom, leasehold_weak_gate))]
//! Model 4: the deliberately wrong ordering, kept to show that loom catches it.
//!
//! Built only with `RUSTFLAGS="--cfg loom --cfg leasehold_weak_gate"`: the gate's
//! publishing stores and observing loads (`sync::PUBLISH` / `sync::OBSERVE` in core)
//! become `Relaxed`. Then nothing orders a reader's data loads after its first `seq`
//! load or before its second, so it can return halves of two fences as a consistent
//! snapshot. These are the very models `no_torn_snapshot.rs` runs with the real
//! orderings, and they must fail on the torn-read assertion — "torn or mixed gate
//! snapshot" (`snapshot` returned a never-published combination), "torn or mixed
//! gate check" (`check` answered from one) or "fence halves of two terms mixed" — not
//! on anything else.

use leasehold_loom_tests::{
    check, check_bounded, cross_term_fence_race, republish_window, Ending, Witness,
};

/// Across terms: fence A (left by the loss) → closed → fence B.
#[test]
#[should_panic(expected = "torn or mixed gate")]
fn weak_gate_tears_fence_across_terms() {
    check_bounded(
        "weak_gate/Revoked/steps 3-4",
        1,
        republish_window(Ending::Revoked, 3..5, Witness::new()),
    );
}

/// Within a term: one renewal, deadline B → B2.
#[test]
#[should_panic(expected = "torn or mixed gate")]
fn weak_gate_tears_deadline_on_renewal() {
    check(
        "weak_gate/Revoked/step 5",
        republish_window(Ending::Revoked, 5..6, Witness::new()),
    );
}

/// Across terms, aimed: the fence read is the high half of one term's fence with the
/// low half of the other's.
#[test]
#[should_panic(expected = "fence halves of two terms mixed")]
fn weak_gate_mixes_fence_halves_of_two_terms() {
    check_bounded(
        "weak_gate/cross-term fence",
        1,
        cross_term_fence_race(Witness::new()),
    );
}
