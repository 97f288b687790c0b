//! The lease is a plain value and the gate a handful of atomics: both stay small enough
//! for a Cortex-M0's RAM (at most 128 and 24 bytes). `cargo bench --bench
//! renew_cycle` prints the exact figures.

use std::mem::size_of;

use leasehold::{Config, Lease, WriteGate};

#[test]
fn a_lease_fits_in_128_bytes() {
    let size = size_of::<Lease>();
    assert!(size <= 128, "size_of::<Lease>() is {size} bytes, over 128");
}

/// Leases that share one config keep a reference to it, not its 48 bytes each.
#[test]
fn a_lease_that_borrows_its_config_keeps_only_the_reference() {
    let (owned, lent) = (size_of::<Lease>(), size_of::<Lease<&'static Config>>());
    let config = size_of::<Config>();
    assert!(
        lent <= owned - config + size_of::<&Config>(),
        "size_of::<Lease<&Config>>() is {lent} bytes, of an owning lease's {owned}"
    );
}

#[test]
fn a_write_gate_fits_in_24_bytes() {
    let size = size_of::<WriteGate>();
    assert!(
        size <= 24,
        "size_of::<WriteGate>() is {size} bytes, over 24"
    );
}
