//! Running the checker and reporting what it found.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

use crate::model::{LeaseModel, Step, Sys};
use crate::params::Params;
use crate::props;

/// What one exhaustive run found.
#[derive(Debug)]
pub struct Outcome {
    /// The bounds checked.
    pub params: Params,
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored, in steps.
    pub max_depth: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Counterexamples to `always`/`eventually` properties, by property.
    pub failures: BTreeMap<&'static str, Vec<(Sys, Option<Step>)>>,
    /// Examples found for `sometimes` properties.
    pub examples: Vec<&'static str>,
    /// The `sometimes` properties these bounds must reach
    /// ([`props::required_examples`]) that the run did not reach: the check would be
    /// vacuous for them.
    pub unreached: Vec<&'static str>,
}

/// Checks every behaviour within `params` by breadth-first search; with
/// `stop_at_first_failure`, stops at the first counterexample.
pub fn check(params: Params, threads: usize, stop_at_first_failure: bool) -> Outcome {
    let model = LeaseModel { params };
    let properties = model.properties();
    let start = Instant::now();
    let mut builder = model.checker().threads(threads.max(1));
    if stop_at_first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = start.elapsed();
    let mut failures = BTreeMap::new();
    let mut examples = Vec::new();
    for (name, path) in checker.discoveries() {
        let is_failure = properties
            .iter()
            .any(|p| p.name == name && p.expectation.discovery_is_failure());
        if is_failure {
            failures.insert(name, path_steps(path));
        } else {
            examples.push(name);
        }
    }
    examples.sort_unstable();
    let unreached = if stop_at_first_failure {
        // A run that stops early is not asked to reach anything.
        Vec::new()
    } else {
        props::required_examples(&params)
            .iter()
            .copied()
            .filter(|name| !examples.contains(name))
            .collect()
    };
    Outcome {
        params,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        failures,
        examples,
        unreached,
    }
}

fn path_steps(path: Path<Sys, Step>) -> Vec<(Sys, Option<Step>)> {
    path.into_vec()
}

impl Outcome {
    /// No counterexample, and every `sometimes` property these bounds must reach
    /// was reached.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.unreached.is_empty()
    }

    /// A human-readable report: figures, then every counterexample path.
    pub fn report(&self) -> String {
        let mut out = format!(
            "leasehold model: {} clients, horizon {} ticks, faults {} (until tick {}), \
             pause {} ticks, late {} ticks, {} in flight, {} releases, grant max {}\n\
             states explored: {} ({} unique), depth reached: {}, time: {:.1} s\n",
            self.params.clients,
            self.params.horizon,
            self.params.faults,
            self.params.fault_window,
            self.params.pause_ticks,
            self.params.late_ticks,
            self.params.capacity,
            self.params.releases,
            match self.params.grant_max {
                0 => "9 and 6".to_string(),
                g => g.to_string(),
            },
            self.states,
            self.unique_states,
            self.max_depth,
            self.elapsed.as_secs_f64(),
        );
        for name in &self.examples {
            out += &format!("  example found (sometimes): {name}\n");
        }
        for name in &self.unreached {
            out += &format!("UNREACHED (sometimes, required by these bounds): {name}\n");
        }
        if self.failures.is_empty() {
            out += "  no counterexample: every always/eventually property holds\n";
        }
        for (name, path) in &self.failures {
            out += &format!("COUNTEREXAMPLE to {name} ({} steps):\n", path.len());
            for (state, step) in path {
                out += &format!("    {state}\n");
                if let Some(step) = step {
                    out += &format!("  --> {}\n", describe(state, *step));
                }
            }
        }
        out
    }
}

/// A step, with the message it concerns spelled out.
pub fn describe(state: &Sys, step: Step) -> String {
    let msg = |k: u8| {
        state
            .net
            .get(usize::from(k))
            .map(|m| m.to_string())
            .unwrap_or_default()
    };
    match step {
        Step::Deliver(k, v) => format!("Deliver {} as {v:?}", msg(k)),
        Step::Drop(k) => format!("Drop {}", msg(k)),
        Step::Dup(k) => format!("Duplicate {}", msg(k)),
        Step::Late(k) => format!("Delay {}", msg(k)),
        other => format!("{other:?}"),
    }
}
