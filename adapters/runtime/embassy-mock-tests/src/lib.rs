//! Tests only: see `tests/`. `leasehold-embassy` on embassy-time's mock driver, with
//! virtual time advanced by the tests, and a host build with the `defmt` feature on.
