#!/usr/bin/env bash
# The Redis renewal benchmark in smoke mode: every peer (leasehold-redis, raw redis-rs
# EVALSHA, rslock) at 1, 100 and 1,000 leases for a fraction of a second each, then two
# failover trials, against a redis-server the bench starts itself. Fails on any error or
# unexpected answer, never on a ratio (the figures come from the full run:
# `cargo bench -p leasehold-redis --bench renew`). Built in the test profile, so it
# reuses the build of the tests stage: about 10 s of running.
set -euo pipefail
cd "$(dirname "$0")/.."
LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --bench renew --locked
