#!/usr/bin/env bash
# Model-checks the real write gate with loom (see loom-tests/README.md).
#
#   scripts/loom.sh [TEST-BINARY ARGS...]     e.g. scripts/loom.sh new_term
#
# 1. the correct orderings: every model in loom-tests/tests must pass;
# 2. the deliberately weak orderings (--cfg leasehold_weak_gate): the models in
#    loom-tests/tests/weak_gate.rs must catch the torn read (#[should_panic] on the
#    torn-read message, so a model that fails on anything else fails the run).
#
# Without a filter each run must run every model its files declare (a `#[test]` each),
# and nothing else: a cfg or feature gone wrong that compiles the models out fails
# the run instead of passing it.
#
# Each cfg set builds in its own target dir (loom, loom-weak, loom-weak-refused under
# CARGO_TARGET_DIR if set, else under target/), so neither thrashes the normal build
# cache nor the other. Each run is killed after LOOM_TIMEOUT seconds (default 600);
# the whole script takes ~40 s on a warm cache, ~2 min cold (2 cores).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/expect-tests.sh

preemptions="${LOOM_MAX_PREEMPTIONS:-2}"
limit="${LOOM_TIMEOUT:-600}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
targets=${CARGO_TARGET_DIR:-target}

run() {
    local label="$1" flags="$2" target="$3" expected="$4"
    shift 4
    echo "==> loom: ${label} (RUSTFLAGS=\"${flags}\" LOOM_MAX_PREEMPTIONS=${preemptions})"
    local start=$SECONDS
    RUSTFLAGS="${flags}" LOOM_MAX_PREEMPTIONS="${preemptions}" CARGO_TARGET_DIR="${target}" \
        timeout "${limit}" cargo test --locked -p leasehold-loom-tests --release -- --nocapture "$@" \
        2>&1 | tee "$log"
    # A filter runs some of the models: only a whole run is counted.
    if (($# == 0)); then
        expect_tests "$log" "$expected" "loom: ${label}"
    fi
    echo "==> loom: ${label}: ok in $((SECONDS - start)) s"
}

# The models each run must run: every #[test] of its files.
tests_in() { cat "$@" | grep -c '^#\[test\]'; }
correct=$(tests_in loom-tests/tests/{learn_of_loss,lost_never_held,no_torn_snapshot}.rs)
weak=$(tests_in loom-tests/tests/weak_gate.rs)
# Each weak model must expect its torn read: a #[should_panic] without the message
# would pass on any panic.
if (($(grep -c '^#\[should_panic(expected = "' loom-tests/tests/weak_gate.rs) != weak)); then
    echo "FAIL: every model in loom-tests/tests/weak_gate.rs must be #[should_panic(expected = ...)]" >&2
    exit 1
fi

# The weak orderings never reach a build that runs: without `--cfg loom` the core
# refuses the cfg (a compile_error!, core/src/sync.rs).
echo "==> loom: --cfg leasehold_weak_gate without --cfg loom must not compile"
if RUSTFLAGS="--cfg leasehold_weak_gate" CARGO_TARGET_DIR="$targets/loom-weak-refused" \
    cargo check --locked -q -p leasehold >"$log" 2>&1; then
    echo "FAIL: the core compiled with --cfg leasehold_weak_gate and without --cfg loom" >&2
    exit 1
fi
grep -q "only for the loom models" "$log" ||
    { cat "$log" >&2; echo "FAIL: the core did not compile for another reason" >&2; exit 1; }

run "correct orderings" "--cfg loom" "$targets/loom" "$correct" "$@"
run "weak orderings (must be caught)" "--cfg loom --cfg leasehold_weak_gate" "$targets/loom-weak" "$weak" "$@"
