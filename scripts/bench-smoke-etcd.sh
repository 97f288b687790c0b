#!/usr/bin/env bash
# The etcd renewal benchmark in smoke mode (about 10 s, debug build shared with the
# tests): it fails only when a renewal fails, never on the numbers.
#
#     bash scripts/bench-smoke-etcd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-etcd --bench renew_rate --locked
