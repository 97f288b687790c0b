#!/usr/bin/env bash
# Renewals/s over mutual TLS next to plain text, at 1, 100 and 1,000 leases, on Redis
# and on etcd, in one run: each bench starts its own server listening on both (with a
# CA and certificates made by `openssl` for the run) and alternates the two sides
# round after round. The figures of the README's table come from this script:
#
#     bash scripts/bench-tls.sh
#
# LEASEHOLD_BENCH_SECS and LEASEHOLD_BENCH_ROUNDS change the window and the rounds;
# LEASEHOLD_BENCH_SMOKE=1 runs each briefly and fails only on errors (as
# scripts/bench-smoke.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p leasehold-redis --features tls --bench tls_renew --locked
cargo bench -p leasehold-etcd --features tls --bench tls_renew --locked
