#!/usr/bin/env bash
# Exhaustive model check of the real core (crate leasehold-model, stateright):
#
#     bash scripts/model.sh        # CI: 2 clients, BFS over the whole bounded space,
#                                  # then the two mutations, each must be caught
#     bash scripts/model.sh deep   # 3 clients (not in CI: see the README for its cost)
#
# Prints states explored, the depth reached and the time; a counterexample prints its
# path and fails the script, and so does a `sometimes` property the bounds must reach
# (a stale write refused, a loss by NOT_OWNER and by a shortened renewal, a reduced
# grant held) that the run did not reach. Bounds can be overridden with
# LEASEHOLD_MODEL_* variables (see adapters/testing/model/src/params.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/expect-tests.sh
run="cargo run --release --locked -q -p leasehold-model --bin leasehold-model --"
if [[ ${1:-} == deep ]]; then
    $run deep
    exit
fi
$run ci
# Each mutation re-introduces a known defect; its one test asserts the checker finds a
# counterexample to the property the defect breaks, and prints the path. A run that
# ran no test (a feature or cfg gone wrong) fails here.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for mutation in mutant-late-shortened mutant-receive-time; do
    echo "  mutation ${mutation}: the check must fail"
    cargo test --release --locked -q -p leasehold-model --features "$mutation" --test mutants \
        -- --nocapture 2>&1 | tee "$log"
    expect_tests "$log" 1 "mutation ${mutation}"
done
