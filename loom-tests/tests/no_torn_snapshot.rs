#![cfg(all(loom, not(leasehold_weak_gate)))]
//! Model 2: no torn or mixed fence or deadline across terms.
//!
//! A reader racing the driver's republishes (see the chain in
//! `leasehold_loom_tests::chain`) only ever gets a (status, term, fence, deadline) that
//! the driver really published together — never halves of two fences or deadlines —
//! and never one overwritten before it started. `check` may refuse with `Busy`.

use leasehold_loom_tests::{
    check, check_bounded, cross_term_fence_race, republish_window, Ending, Witness, SAW_BUSY,
    SAW_NO_SNAPSHOT, STEPS,
};

/// Preemption bound for the two-publish windows. At bound 2 one such model runs over
/// 10⁶ executions (minutes on this machine); at bound 1 ≈ 2.6·10⁴ (seconds). The reader
/// never writes anything the driver reads, so what these models must explore is the
/// set of values each reader load may return, which loom enumerates at any bound (see
/// docs/decisions/loom-models-race-one-or-two-publishes.md).
const TWO_STEP_BOUND: usize = 1;

/// Races step `step` alone.
#[track_caller]
fn race(ending: Ending, step: usize) {
    let name = format!("no_torn_snapshot/{ending:?}/step {step}");
    let seen = Witness::new();
    check(
        &name,
        republish_window(ending, step..step + 1, seen.clone()),
    );
    assert_not_vacuous(&name, &seen, 2);
}

/// Races steps `first` and `first + 1`.
#[track_caller]
fn race_two(ending: Ending, first: usize) {
    let name = format!("no_torn_snapshot/{ending:?}/steps {first}-{}", first + 1);
    let seen = Witness::new();
    check_bounded(
        &name,
        TWO_STEP_BOUND,
        republish_window(ending, first..first + 2, seen.clone()),
    );
    assert_not_vacuous(&name, &seen, 3);
}

/// The reader must have seen every state of its window (before, between and after the
/// racing publishes), else the model proved little.
#[track_caller]
fn assert_not_vacuous(name: &str, seen: &Witness, states: usize) {
    for i in 0..states {
        seen.assert_seen(i, &format!("window state {i} in {name}"));
    }
    let busy = if states == 2 {
        format!(", check Busy: {}", seen.seen(SAW_BUSY))
    } else {
        String::new() // no check with two racing publishes
    };
    println!(
        "  {name}: reader saw all {states} window states; snapshot gave up: {}{busy}",
        seen.seen(SAW_NO_SNAPSHOT),
    );
}

#[test]
fn each_publish_of_two_terms_raced_alone() {
    for step in 0..STEPS {
        race(Ending::Revoked, step);
    }
}

#[test]
fn every_ending_raced_alone() {
    // Revoked is raced by the test above.
    for ending in Ending::ALL.into_iter().filter(|e| *e != Ending::Revoked) {
        race(ending, 2);
    }
}

#[test]
fn grant_then_revoke() {
    race_two(Ending::Revoked, 1);
}

#[test]
fn revoke_then_reacquire() {
    race_two(Ending::Revoked, 2);
}

/// The term change itself: fence A (left by the loss) → closed → fence B.
#[test]
fn new_term_after_loss_closed_then_granted() {
    race_two(Ending::Revoked, 3);
}

/// The term change after a release: fence A (left by the release) → closed → fence B.
#[test]
fn new_term_after_release_closed_then_granted() {
    race_two(Ending::Released, 3);
}

/// Deadline B → B2 within term 2.
#[test]
fn grant_then_renew() {
    race_two(Ending::Revoked, 4);
}

/// The aimed form of the term change (the one `weak_gate.rs` shows failing with weak
/// orderings): no fence made of halves of fence A and fence B.
#[test]
fn no_fence_mixed_from_two_terms() {
    let seen = Witness::new();
    check_bounded(
        "no_torn_snapshot/cross-term fence",
        TWO_STEP_BOUND,
        cross_term_fence_race(seen.clone()),
    );
    seen.assert_seen(0, "fence A");
    seen.assert_seen(1, "fence B");
}
