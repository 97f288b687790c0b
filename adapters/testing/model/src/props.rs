//! The properties checked on every reachable state.

use stateright::Property;

use crate::client::local;
use crate::model::{LeaseModel, Sys};

/// (a) A gate admits a write only before the service's expiry of that very grant:
/// the service holds the key for this client with the fence the gate hands out.
pub const GATE_BEFORE_EXPIRY: &str = "(a) a gate admits only before the service expires its grant";
/// (b) Storage never admits a fence older than one it admitted.
pub const STORAGE_MONOTONIC: &str = "(b) storage never admits an older fence";
/// (c) A term that was lost never holds again.
pub const NO_RELAPSE: &str = "(c) never lost-then-held within a term";
/// (d) At most one gate admits at any tick (clocks within the drift bound).
pub const ONE_WRITER: &str = "(d) at most one gate admits at any tick";
/// (e) Once a client received a renewal answer that ends its term — a TTL shorter
/// than asked (in time or late), NOT_OWNER (also from an older request after a newer
/// success), a final refusal — its gate stays closed for that term.
pub const ENDING_ANSWER_CLOSES: &str =
    "(e) a shortened, NOT_OWNER or refused renewal answer closes the gate";
/// (f) A final refusal of an acquire ends the acquire (never retried).
pub const REFUSAL_FINAL: &str = "(f) a refused acquire is not retried";
/// (g) Liveness: after the fault window, some client holds before the horizon.
pub const LIVENESS: &str = "(g) once faults stop, some client holds";

/// Sometimes: storage refuses a stale fence (the fence gate is exercised).
pub const STALE_WRITE_REFUSED: &str = "a stale write is refused by storage";
/// Sometimes: a client's term ends on a NOT_OWNER renewal answer.
pub const LOST_BY_NOT_OWNER: &str = "a client loses by NOT_OWNER";
/// Sometimes: a client's term ends on a renewal answered shorter than asked.
pub const LOST_BY_SHORTENED: &str = "a client loses by a shortened renewal";
/// Sometimes: a client holds a grant the service reduced below the TTL asked.
pub const REDUCED_GRANT_HELD: &str = "a reduced grant is held";

/// Every `sometimes` property: behaviours the `always` properties are about, which a
/// run must reach for them not to hold vacuously.
pub const EXAMPLES: &[&str] = &[
    STALE_WRITE_REFUSED,
    LOST_BY_NOT_OWNER,
    LOST_BY_SHORTENED,
    REDUCED_GRANT_HELD,
];

/// The `sometimes` properties a run with `params` must reach: all of them with the CI
/// bounds ([`Params::CI`](crate::Params::CI), the run CI makes). Other bounds print
/// what they reached and require nothing: fewer faults, or a shorter fault window,
/// cannot reach some of them (one fault until tick 2 reaches none of the first
/// three), and the deep run's service never reduces a grant.
pub fn required_examples(params: &crate::Params) -> &'static [&'static str] {
    if *params == crate::Params::CI {
        EXAMPLES
    } else {
        &[]
    }
}

/// How many clients' gates admit a write right now.
pub fn admitting(s: &Sys) -> usize {
    s.clients
        .iter()
        .filter(|c| c.gate.admits(local(s.now)).is_some())
        .count()
}

/// Every property.
pub fn all() -> Vec<Property<LeaseModel>> {
    vec![
        Property::always(GATE_BEFORE_EXPIRY, |_, s: &Sys| {
            s.clients
                .iter()
                .enumerate()
                .all(|(i, c)| match c.gate.admits(local(s.now)) {
                    None => true,
                    Some(fence) => s
                        .service
                        .live(s.now)
                        .is_some_and(|g| usize::from(g.client) == i && g.fence == fence.0),
                })
        }),
        Property::always(STORAGE_MONOTONIC, |_, s: &Sys| !s.storage_went_back),
        Property::always(NO_RELAPSE, |_, s: &Sys| {
            s.clients.iter().all(|c| !c.relapsed)
        }),
        Property::always(ONE_WRITER, |_, s: &Sys| admitting(s) <= 1),
        Property::always(ENDING_ANSWER_CLOSES, |_, s: &Sys| {
            s.clients.iter().all(|c| {
                let term = c.gate.snapshot().map(|g| g.term.0);
                c.must_close.is_none()
                    || c.must_close != term
                    || c.gate.admits(local(s.now)).is_none()
            })
        }),
        Property::always(REFUSAL_FINAL, |_, s: &Sys| {
            s.clients.iter().all(|c| !c.refusal_ignored)
        }),
        Property::eventually(LIVENESS, |_, s: &Sys| s.held_after_faults),
        Property::sometimes(STALE_WRITE_REFUSED, |_, s: &Sys| s.stale_write_refused),
        Property::sometimes(LOST_BY_NOT_OWNER, |_, s: &Sys| {
            s.clients.iter().any(|c| {
                c.gate.snapshot().is_some_and(|g| {
                    g.status == leasehold::GateStatus::Lost(leasehold::LossReason::NotOwner)
                })
            })
        }),
        Property::sometimes(LOST_BY_SHORTENED, |_, s: &Sys| {
            s.clients.iter().any(|c| {
                c.gate.snapshot().is_some_and(|g| {
                    g.status == leasehold::GateStatus::Lost(leasehold::LossReason::Shortened)
                })
            })
        }),
        Property::sometimes(REDUCED_GRANT_HELD, |_, s: &Sys| {
            s.service.grant_max < 9 && admitting(s) > 0
        }),
    ]
}
