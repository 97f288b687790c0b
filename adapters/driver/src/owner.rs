//! The one owner generator of the `std` crates.

use leasehold::Owner;

/// A fresh 128-bit owner from the operating system's random source, or `None` when
/// it has none (then no owner can be told apart from another client's: pick one from
/// something unique, such as a serial number, and pass it yourself).
///
/// Use one per client (a process, or a lease where leases in one process must exclude
/// each other). What a lock service stores is its [`OwnerToken`](leasehold::OwnerToken)
/// for the current term.
pub fn random_owner() -> Option<Owner> {
    let mut bytes = [0; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(Owner(bytes))
}
