#!/usr/bin/env bash
# Every crate compiles with each of its features alone, with none, and with its
# defaults — so an optional feature cannot rot unnoticed (e.g. leasehold-tokio with
# `tracing` off, leasehold-redis with `tls`, the no_std crates with `defmt`):
#
#     bash scripts/features.sh
#
# Uses cargo-hack (`--each-feature`: `--no-default-features`, each feature alone on
# top of it, and the defaults), installed from crates.io when missing. All targets are
# checked (lib, tests, examples, benches), so feature-gated test code compiles too.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo hack --version >/dev/null 2>&1; then
    echo "  installing cargo-hack"
    cargo install cargo-hack --locked -q
fi
cargo hack check --workspace --each-feature --all-targets --keep-going --locked -q
echo "features: every crate compiles with each feature alone, none, and its defaults"
