#!/usr/bin/env bash
# The renewal benchmarks in smoke mode, against servers each bench starts itself:
#   - Redis: every peer (leasehold-redis, raw redis-rs EVALSHA, rslock) at 1, 100 and
#     1,000 leases for a fraction of a second each, then two failover trials;
#   - Redis with a replica: renewals with min_replicas(1) (each followed by WAIT) and
#     without, the same K;
#   - etcd: leasehold-etcd, raw keep-alive, raw keep-alive + txn, the same K; fair
#     acquires next to plain ones (10 of each);
#   - PostgreSQL: leasehold-postgres, a raw tokio-postgres loop of the same UPDATE
#     (prepared, and unnamed), the same K; then a lease-checked transaction next to a
#     plain one;
#   - many leases: 100 on the in-memory service in both driver shapes (a task per
#     lease, and a LeaseSet), and 1,000 in a LeaseSet on a real Redis for 5 s, failing
#     on any loss or any check that passes after one;
#   - a local Redis Cluster: leasehold-redis's cluster service and redis-rs's own
#     cluster connection, K = 100, briefly;
#   - Redis and etcd over mutual TLS next to plain text, the same K (`tls_renew`,
#     whose full run is `bash scripts/bench-tls.sh`).
# Each fails on any error or unexpected answer, never on a ratio (the figures come from
# the full runs: `cargo bench -p leasehold-redis --bench renew`,
# `cargo bench -p leasehold-etcd --bench renew_rate`,
# `cargo bench -p leasehold-postgres --bench renew`). Built in the test profile: about
# 10 s of running each.
set -euo pipefail
cd "$(dirname "$0")/.."
export LEASEHOLD_BENCH_SMOKE=1
# One build per crate, with the features every bench of it needs (and the tls stage's
# test uses): each set of features is a build of the crate and its dependencies.
cargo test -p leasehold-redis --features tls,cluster --locked \
    --bench renew --bench replicated --bench many_leases --bench cluster_renew --bench tls_renew
cargo test -p leasehold-etcd --features tls --locked --bench renew_rate --bench tls_renew
LEASEHOLD_BENCH_N=10 cargo test -p leasehold-etcd --features tls --locked --bench fair_acquire
cargo test -p leasehold-postgres --bench renew --locked
cargo test -p leasehold-tokio --bench many_leases --locked
