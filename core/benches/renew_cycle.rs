//! Placeholder; replaced by the criterion benchmark.
fn main() {}
