//! Fault injection: what can go wrong between a client and the service, globally or
//! for one client (owner).

use std::collections::HashMap;
use std::time::Duration;

use leasehold::Owner;

/// Whom a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every client.
    All,
    /// The client presenting this owner (any term).
    Owner(Owner),
}

impl From<Owner> for Scope {
    fn from(owner: Owner) -> Scope {
        Scope::Owner(owner)
    }
}

/// The faults in force for one [`Scope`]. A client suffers its own faults *and* the
/// global ones: latencies add up, any stall or partition applies, and a drop counter
/// is taken from the client's own first.
///
/// Every fault acts on acquire, renew and release requests; revocation notices are
/// always delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added round trip: half of it before the service acts, half on the way back.
    pub latency: Duration,
    /// Requests wait before the service acts on them, until un-stalled; then they are
    /// carried out and answered (late). Models a service or link that hangs.
    pub stalled: bool,
    /// Requests are lost, and so are the answers of requests caught in flight: never
    /// answered, not even after the partition heals. The client's request timeout makes
    /// them indeterminate.
    pub partitioned: bool,
    /// The next this many requests are lost before reaching the service: never acted
    /// on, never answered.
    pub drop_requests: u32,
    /// The next this many requests are carried out, but their answers are lost: the
    /// service acted, the client never learns.
    pub drop_responses: u32,
}

impl Faults {
    /// No fault at all.
    pub const NONE: Faults = Faults {
        latency: Duration::ZERO,
        stalled: false,
        partitioned: false,
        drop_requests: 0,
        drop_responses: 0,
    };
}

/// What happens to one request, decided when it is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) latency: Duration,
    pub(crate) lose_request: bool,
    pub(crate) lose_response: bool,
}

#[derive(Debug, Default)]
pub(crate) struct FaultTable {
    global: Faults,
    clients: HashMap<Owner, Faults>,
}

impl FaultTable {
    pub(crate) fn get(&self, scope: Scope) -> Faults {
        match scope {
            Scope::All => self.global,
            Scope::Owner(owner) => self.clients.get(&owner).copied().unwrap_or_default(),
        }
    }

    pub(crate) fn update(&mut self, scope: Scope, change: impl FnOnce(&mut Faults)) {
        match scope {
            Scope::All => change(&mut self.global),
            Scope::Owner(owner) => {
                let faults = self.clients.entry(owner).or_default();
                change(faults);
                if *faults == Faults::NONE {
                    self.clients.remove(&owner);
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = FaultTable::default();
    }

    /// Whether any fault is set, for any scope.
    pub(crate) fn any(&self) -> bool {
        self.global != Faults::NONE || !self.clients.is_empty()
    }

    /// Whether `owner`'s requests currently wait (stall) or vanish (partition).
    pub(crate) fn blocked(&self, owner: Owner) -> (bool, bool) {
        let own = self.clients.get(&owner).copied().unwrap_or_default();
        (
            self.global.stalled || own.stalled,
            self.global.partitioned || own.partitioned,
        )
    }

    /// Decides the fate of a request `owner` sends now, using up drop counters.
    /// `None` when no fault touches it: the service answers at once.
    pub(crate) fn plan(&mut self, owner: Owner) -> Option<Plan> {
        if !self.any() {
            return None;
        }
        let before = self.get(Scope::Owner(owner));
        let mut own = before;
        let global = &mut self.global;
        let lose_request = global.partitioned
            || own.partitioned
            || take(&mut own.drop_requests)
            || take(&mut global.drop_requests);
        let lose_response =
            !lose_request && (take(&mut own.drop_responses) || take(&mut global.drop_responses));
        let plan = Plan {
            latency: global.latency + own.latency,
            lose_request,
            lose_response,
        };
        let stalled = global.stalled || own.stalled;
        if own != before {
            self.update(Scope::Owner(owner), |faults| *faults = own);
        }
        (plan != Plan::default() || stalled).then_some(plan)
    }
}

/// Uses one unit of a counter, if any is left.
fn take(counter: &mut u32) -> bool {
    if *counter == 0 {
        false
    } else {
        *counter -= 1;
        true
    }
}
