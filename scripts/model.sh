#!/usr/bin/env bash
# Exhaustive model check of the real core (crate leasehold-model, stateright):
#
#     bash scripts/model.sh        # CI: 2 clients, BFS over the whole bounded space,
#                                  # then the two mutations, each must be caught
#     bash scripts/model.sh deep   # 3 clients (not in CI: see the README for its cost)
#
# Prints states explored, the depth reached and the time; a counterexample prints its
# path and fails the script. Bounds can be overridden with LEASEHOLD_MODEL_* variables
# (see adapters/testing/model/src/params.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
run="cargo run --release --locked -q -p leasehold-model --bin leasehold-model --"
if [[ ${1:-} == deep ]]; then
    $run deep
    exit
fi
$run ci
# Each mutation re-introduces a known defect; its test asserts the checker finds a
# counterexample and prints the path.
for mutation in mutant-late-shortened mutant-receive-time; do
    echo "  mutation ${mutation}: the check must fail"
    cargo test --release --locked -q -p leasehold-model --features "$mutation" --test mutants \
        -- --nocapture
done
