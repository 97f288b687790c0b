//! Concurrent writers against a fenced store, and the check of what it admitted: the
//! one copy every fenced-storage test (SQL, Redis) uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold::Fence;

/// Fences for concurrent writers, interleaved: most are fresh (a shared counter, so
/// they rise across writers), every fourth repeats the writer's previous fence (the
/// same holder writing again) and every fourth is older than the counter (a holder
/// that paused while others moved on).
#[derive(Debug, Default)]
pub struct FencePlan {
    counter: AtomicU64,
}

impl FencePlan {
    /// A plan whose first fresh fence is 1.
    pub fn new() -> FencePlan {
        FencePlan::default()
    }

    /// The fence writer `writer` presents for its `i`-th write, after presenting
    /// `previous` (`None` for the first).
    pub fn fence(&self, writer: usize, i: usize, previous: Option<Fence>) -> Fence {
        let fresh = || Fence(self.counter.fetch_add(1, Ordering::Relaxed) + 1);
        match (i % 4, previous) {
            (1, Some(previous)) => previous,
            (3, _) => {
                let now = self.counter.load(Ordering::Relaxed);
                Fence(now.saturating_sub(1 + writer as u64 % 4).max(1))
            }
            _ => fresh(),
        }
    }
}

/// One write as its writer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The fence presented.
    pub fence: Fence,
    /// `None`: admitted; `Some(newest)`: refused as stale, with the newest fence the
    /// store reported.
    pub stale: Option<Fence>,
}

/// What [`check_fenced_history`] counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryCounts {
    /// Writes admitted.
    pub admitted: usize,
    /// Writes refused as stale.
    pub stale: usize,
    /// Admitted writes whose fence equals the one admitted just before (the same
    /// holder writing again).
    pub equal_admitted: usize,
}

/// Panics unless the store behaved as a fence gate:
///
/// * `admitted_in_order` (the store's own record of every admitted write's fence, in
///   the order it admitted them: a trigger, `MONITOR`) never goes back;
/// * it holds exactly the fences the writers were told were admitted;
/// * every refusal named a newest fence newer than the one presented;
/// * the workload did exercise refusals and equal fences (else the test proves
///   nothing).
pub fn check_fenced_history(admitted_in_order: &[Fence], answers: &[Answer]) -> HistoryCounts {
    for pair in admitted_in_order.windows(2) {
        if let [before, after] = pair {
            assert!(
                after >= before,
                "the store admitted {after} after {before}: an older fence after a newer one"
            );
        }
    }
    let mut told: HashMap<Fence, i64> = HashMap::new();
    for answer in answers {
        match answer.stale {
            None => *told.entry(answer.fence).or_default() += 1,
            Some(newest) => assert!(
                newest > answer.fence,
                "refused {} naming newest {newest}, which is not newer",
                answer.fence
            ),
        }
    }
    for fence in admitted_in_order {
        *told.entry(*fence).or_default() -= 1;
    }
    told.retain(|_, n| *n != 0);
    assert!(
        told.is_empty(),
        "admitted per the store and per the writers differ (fence: writers − store): {told:?}"
    );
    let counts = HistoryCounts {
        admitted: admitted_in_order.len(),
        stale: answers.iter().filter(|a| a.stale.is_some()).count(),
        equal_admitted: admitted_in_order
            .windows(2)
            .filter(|pair| matches!(pair, [a, b] if a == b))
            .count(),
    };
    assert!(
        counts.stale > 0 && counts.equal_admitted > 0,
        "the workload exercised too little: {counts:?}"
    );
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(f: u64) -> Answer {
        Answer {
            fence: Fence(f),
            stale: None,
        }
    }

    fn stale(f: u64, newest: u64) -> Answer {
        Answer {
            fence: Fence(f),
            stale: Some(Fence(newest)),
        }
    }

    #[test]
    fn a_good_history_passes_and_is_counted() {
        let counts = check_fenced_history(
            &[Fence(1), Fence(1), Fence(3)],
            &[ok(1), ok(3), ok(1), stale(2, 3)],
        );
        assert_eq!(
            counts,
            HistoryCounts {
                admitted: 3,
                stale: 1,
                equal_admitted: 1
            }
        );
    }

    #[test]
    #[should_panic(expected = "an older fence after a newer one")]
    fn an_older_fence_after_a_newer_one_fails() {
        check_fenced_history(&[Fence(3), Fence(2)], &[ok(3), ok(2)]);
    }

    #[test]
    #[should_panic(expected = "differ")]
    fn a_write_the_store_did_not_log_fails() {
        check_fenced_history(&[Fence(1), Fence(1)], &[ok(1), ok(1), ok(2), stale(1, 2)]);
    }

    #[test]
    #[should_panic(expected = "not newer")]
    fn a_refusal_naming_an_older_newest_fails() {
        check_fenced_history(&[Fence(1), Fence(1)], &[ok(1), ok(1), stale(2, 1)]);
    }

    #[test]
    fn the_plan_interleaves_fresh_repeated_and_older_fences() {
        let plan = FencePlan::new();
        let mut previous = None;
        let fences: Vec<Fence> = (0..8)
            .map(|i| {
                let f = plan.fence(2, i, previous);
                previous = Some(f);
                f
            })
            .collect();
        assert_eq!(fences[1], fences[0], "every fourth repeats");
        assert!(fences[3] < fences[2], "every fourth is older: {fences:?}");
    }
}
