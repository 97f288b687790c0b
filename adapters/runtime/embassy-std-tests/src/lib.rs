//! Tests only: see `tests/`. `leasehold-embassy` on embassy-time's `std` driver and
//! embassy-executor's std platform, with real (short) time and a reader on another OS
//! thread; and the `defmt` host build, whose global logger is an `unsafe impl`.
