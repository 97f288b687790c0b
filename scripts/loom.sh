#!/usr/bin/env bash
# Model-checks the real write gate with loom (see loom-tests/README.md).
#
#   scripts/loom.sh [TEST-BINARY ARGS...]     e.g. scripts/loom.sh new_term
#
# 1. the correct orderings: every model in loom-tests/tests must pass;
# 2. the deliberately weak orderings (--cfg leasehold_weak_gate): the models in
#    loom-tests/tests/weak_gate.rs must catch the torn read (#[should_panic]).
#
# Each cfg set builds in its own target dir, so neither thrashes the normal build
# cache nor the other. Each run is killed after LOOM_TIMEOUT seconds (default 600);
# the whole script takes ~40 s on a warm cache, ~2 min cold (2 cores).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

preemptions="${LOOM_MAX_PREEMPTIONS:-2}"
limit="${LOOM_TIMEOUT:-600}"

run() {
    local label="$1" flags="$2" target="$3"
    shift 3
    echo "==> loom: ${label} (RUSTFLAGS=\"${flags}\" LOOM_MAX_PREEMPTIONS=${preemptions})"
    local start=$SECONDS
    RUSTFLAGS="${flags}" LOOM_MAX_PREEMPTIONS="${preemptions}" CARGO_TARGET_DIR="${target}" \
        timeout "${limit}" cargo test --locked -p leasehold-loom-tests --release -- --nocapture "$@"
    echo "==> loom: ${label}: ok in $((SECONDS - start)) s"
}

run "correct orderings" "--cfg loom" target/loom "$@"
run "weak orderings (must be caught)" "--cfg loom --cfg leasehold_weak_gate" target/loom-weak "$@"
