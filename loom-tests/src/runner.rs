//! Runs one loom model and reports how many executions it explored.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set.
///
/// Unbounded exploration of even these small models takes far too long; a bound of 2
/// or 3 is what loom's own guidance suggests, and 2 finishes in seconds here.
/// `scripts/loom.sh` sets `LOOM_MAX_PREEMPTIONS=2` explicitly.
pub const DEFAULT_PREEMPTION_BOUND: usize = 2;

/// Model-checks `f` with loom: every interleaving of its threads (up to the preemption
/// bound: `LOOM_MAX_PREEMPTIONS`, else [`DEFAULT_PREEMPTION_BOUND`]) and every value
/// each atomic load may legally return.
///
/// Prints `loom model <name>: <n> iterations …` when done (visible with
/// `--nocapture`), or the failing iteration's number when the model panics. Never sets
/// `max_duration` / `max_permutations`: those make loom stop early *silently*.
pub fn check<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    check_bounded(name, usize::MAX, f);
}

/// [`check`], with the preemption bound capped at `cap` for a model too large to
/// explore at the configured bound within the time budget. The report says so.
pub fn check_bounded<F>(name: &str, cap: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    let configured = builder.preemption_bound.unwrap_or(DEFAULT_PREEMPTION_BOUND);
    let bound = configured.min(cap);
    builder.preemption_bound = Some(bound);
    let iterations = Arc::new(AtomicUsize::new(0));
    let report = Report {
        name: name.to_owned(),
        iterations: Arc::clone(&iterations),
        bound,
        capped: bound < configured,
    };
    builder.check(move || {
        // A plain std atomic: the counter is outside the model, loom does not see it.
        iterations.fetch_add(1, Ordering::Relaxed);
        f();
    });
    drop(report);
}

/// Prints the outcome when [`check_bounded`] returns or unwinds.
struct Report {
    name: String,
    iterations: Arc<AtomicUsize>,
    bound: usize,
    capped: bool,
}

impl Drop for Report {
    fn drop(&mut self) {
        let n = self.iterations.load(Ordering::Relaxed);
        let capped = if self.capped {
            ", capped for this model"
        } else {
            ""
        };
        let outcome = if std::thread::panicking() {
            format!("FAILED in iteration {n}")
        } else {
            format!("{n} iterations, all passed")
        };
        println!(
            "loom model {}: {outcome} (preemption bound {}{capped})",
            self.name, self.bound
        );
    }
}

/// Records, across all of a model's executions, which outcomes were observed, so a
/// test can assert that its interesting branches actually ran (a model whose reader
/// never sees the racing publish proves nothing).
///
/// Outside the model: a plain std atomic that loom does not see.
#[derive(Clone, Debug, Default)]
pub struct Witness(Arc<AtomicUsize>);

impl Witness {
    /// Nothing seen yet.
    pub fn new() -> Witness {
        Witness::default()
    }

    /// Records outcome number `bit` (0..usize::BITS).
    pub fn saw(&self, bit: usize) {
        self.0.fetch_or(1 << bit, Ordering::Relaxed);
    }

    /// Whether outcome `bit` was ever recorded.
    pub fn seen(&self, bit: usize) -> bool {
        self.0.load(Ordering::Relaxed) & (1 << bit) != 0
    }

    /// Panics unless outcome `bit` was recorded at least once.
    #[track_caller]
    pub fn assert_seen(&self, bit: usize, what: &str) {
        assert!(self.seen(bit), "vacuous model: never saw {what}");
    }
}
