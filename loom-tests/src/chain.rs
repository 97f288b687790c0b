//! The scenario of model 2 (and of the weak-ordering model): two terms back to back,
//! and windows of it raced by a reader.
//!
//! The driver runs six steps, each one `Lease` call that publishes once:
//!
//! | step | call | publishes (status, term, fence, deadline) |
//! |---|---|---|
//! | 0 | `acquire` | Closed, 1, 0, 0 |
//! | 1 | `handle_response` (granted) | Held, 1, [`FENCE_A`], [`DEADLINE_A`] |
//! | 2 | the [`Ending`] (loss or release) | Lost/Released, 1, [`FENCE_A`], 0 |
//! | 3 | `acquire` | Closed, 2, 0, 0 |
//! | 4 | `handle_response` (granted) | Held, 2, [`FENCE_B`], [`DEADLINE_B`] |
//! | 5 | `handle_timeout` + `handle_response` (renewed) | Held, 2, [`FENCE_B`], [`DEADLINE_B2`] |
//!
//! A whole run raced by a reader is far beyond what loom can explore: each racing
//! publish multiplies the values every reader load may return. Measured here: one
//! racing publish ≈ 1.8·10⁴ executions at preemption bound 2 (snapshot + check); two
//! ≈ 2.6·10⁴ at bound 1 but 1.4·10⁶ (minutes) at bound 2 (snapshot only); three ≈ 8·10⁵
//! even at bound 0. So each model
//! races a *window* of one or two consecutive steps; the steps before it run before the
//! reader is spawned.

use std::ops::Range;

use leasehold::{
    Duration, Fence, GateError, GateSnapshot, GateStatus, Instant, RequestId, WriteGate,
};
use loom::sync::Arc;
use loom::thread;

use crate::{
    assert_check_published, at, published, Driver, Ending, Witness, DEADLINE_A, DEADLINE_B,
    DEADLINE_B2, FENCE_A, FENCE_B, INITIAL,
};

/// Number of steps in the chain.
pub const STEPS: usize = 6;

/// The `now` the racing reader checks with: before every deadline, so a held snapshot
/// passes and hands out its fence.
pub const READER_NOW: Instant = at(1);

/// What the gate shows after `i` steps of the chain ending `ending`'s way, for `i` in
/// `0..=STEPS`.
pub fn chain_published(ending: Ending) -> [GateSnapshot; STEPS + 1] {
    [
        INITIAL,
        published(GateStatus::Closed, 1, Fence(0), Instant::ZERO),
        published(GateStatus::Held, 1, FENCE_A, DEADLINE_A),
        published(ending.status(), 1, FENCE_A, Instant::ZERO),
        published(GateStatus::Closed, 2, Fence(0), Instant::ZERO),
        published(GateStatus::Held, 2, FENCE_B, DEADLINE_B),
        published(GateStatus::Held, 2, FENCE_B, DEADLINE_B2),
    ]
}

/// Panics unless `seen` is one of `window` (what the reader may see: the state when it
/// was spawned, or one published while it ran). The message starts with "torn or mixed
/// gate snapshot" if `seen` was never published at all, "stale gate snapshot" if it was
/// published before the reader was spawned.
#[track_caller]
pub fn assert_in_window(seen: GateSnapshot, window: &[GateSnapshot], all: &[GateSnapshot]) {
    assert!(
        all.contains(&seen),
        "torn or mixed gate snapshot: {seen:?} was never published; the reader may see: {window:#?}"
    );
    assert!(
        window.contains(&seen),
        "stale gate snapshot: {seen:?} was overwritten before the reader started; it may see: {window:#?}"
    );
}

/// [`Witness`] bit: `snapshot` gave up (`None`, every attempt torn by the writer).
pub const SAW_NO_SNAPSHOT: usize = 16;
/// [`Witness`] bit: `check` refused with `Busy`.
pub const SAW_BUSY: usize = 17;

/// Model: runs the chain's steps before `racing.start` alone, then spawns a reader and
/// runs the steps in `racing` while it takes one snapshot and, if only one step races,
/// one `check`. Everything the reader gets must have been published together, in that
/// window (or be a `Busy` refusal).
///
/// With two racing steps the reader skips the `check`: a second read multiplies the
/// executions by five (≈ 1.3·10⁵ instead of 2.6·10⁴), and `check` is a snapshot plus a
/// pure function of it, raced in every single-step window.
///
/// `seen` records bit `i` when the snapshot was the `i`-th of the window (0: the state
/// the reader was spawned in), and [`SAW_NO_SNAPSHOT`] / [`SAW_BUSY`].
pub fn republish_window(
    ending: Ending,
    racing: Range<usize>,
    seen: Witness,
) -> impl Fn() + Sync + Send + 'static {
    assert!(
        racing.start < racing.end && racing.end <= STEPS,
        "bad window {racing:?}"
    );
    move || {
        let all = chain_published(ending);
        let gate = Arc::new(WriteGate::new());
        let mut driver = Driver::new();
        let mut acquire_id = RequestId(0);
        let ended = ending.time(DEADLINE_A);
        let t2 = ended + Duration::from_secs(1);
        let mut reader = None;
        for step in 0..racing.end {
            if step == racing.start {
                let gate = Arc::clone(&gate);
                let window = all[racing.start..=racing.end].to_vec();
                let seen = seen.clone();
                reader = Some(thread::spawn(move || {
                    match gate.snapshot() {
                        Some(snap) => {
                            assert_in_window(snap, &window, &all);
                            let i = window.iter().position(|s| *s == snap);
                            seen.saw(i.expect("in the window"));
                        }
                        None => seen.saw(SAW_NO_SNAPSHOT),
                    }
                    if window.len() == 2 {
                        let checked = gate.check(READER_NOW);
                        assert_check_published(checked, READER_NOW, &window);
                        if checked == Err(GateError::Busy) {
                            seen.saw(SAW_BUSY);
                        }
                    }
                }));
            }
            match step {
                0 => acquire_id = driver.acquire(at(0), &gate),
                1 => driver.grant(at(0), acquire_id, FENCE_A, DEADLINE_A, &gate),
                2 => driver.end(ending, ended, &gate),
                3 => acquire_id = driver.acquire(t2, &gate),
                4 => driver.grant(t2, acquire_id, FENCE_B, DEADLINE_B, &gate),
                // A renewal counts for at most the TTL granted (`DEADLINE_B - t2`), so
                // it goes out when `DEADLINE_B2` is exactly that far away.
                _ => driver.renew(t2 + (DEADLINE_B2 - DEADLINE_B), DEADLINE_B2, &gate),
            }
        }
        reader.expect("spawned").join().expect("reader");
    }
}

/// The two fences made of one half of [`FENCE_A`] and one half of [`FENCE_B`].
pub const MIXED_FENCES: [Fence; 2] = [
    Fence((FENCE_A.0 & 0xffff_ffff_0000_0000) | (FENCE_B.0 & 0xffff_ffff)),
    Fence((FENCE_B.0 & 0xffff_ffff_0000_0000) | (FENCE_A.0 & 0xffff_ffff)),
];

/// Model: the narrowest form of model 2, aimed at one failure: term 1 (fence A) is
/// lost, then term 2 is acquired and granted fence B while a reader takes one snapshot.
/// Its fence must never be [`MIXED_FENCES`] (message: "fence halves of two terms
/// mixed"). Steps 3-4 of the chain, with a reader that checks nothing else, so that
/// with weak orderings loom reports exactly this mix rather than another torn read.
///
/// `seen` records bit 0 when the reader got fence A, bit 1 when it got fence B.
pub fn cross_term_fence_race(seen: Witness) -> impl Fn() + Sync + Send + 'static {
    move || {
        let gate = Arc::new(WriteGate::new());
        let mut driver = Driver::new();
        driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, &gate);
        driver.end(Ending::Revoked, at(1_000), &gate);
        let reader = {
            let (gate, seen) = (Arc::clone(&gate), seen.clone());
            thread::spawn(move || {
                if let Some(snap) = gate.snapshot() {
                    assert!(
                        !MIXED_FENCES.contains(&snap.fence),
                        "fence halves of two terms mixed: {:#x} in {snap:?}",
                        snap.fence.0
                    );
                    if snap.fence == FENCE_A {
                        seen.saw(0);
                    } else if snap.fence == FENCE_B {
                        seen.saw(1);
                    }
                }
            })
        };
        driver.acquire_granted(at(2_000), FENCE_B, DEADLINE_B, &gate);
        reader.join().expect("reader");
    }
}
