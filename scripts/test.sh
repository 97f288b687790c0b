#!/usr/bin/env bash
# The one command that runs every check and test, on a fresh machine or this one:
#
#     bash scripts/test.sh
#
# It installs what is missing (rustup targets, redis-server, etcd, postgresql, protoc,
# ARM binutils), then runs: fmt, clippy, the tests (real servers are started by the tests
# themselves on free loopback ports; every lock service runs the conformance suite),
# a local Redis Cluster (3 primaries + 3 replicas: a failover and a slot migration
# under 2,000 leases), the benchmarks in smoke mode (errors only), the loom
# models, the no_std target builds, the firmware builds with their size table,
# the firmware holding a lease on a real Redis in QEMU (both ARM builds),
# mutual TLS to real Redis, etcd and PostgreSQL servers (certificates made by the
# tests), the exhaustive model check (2 clients) and its mutations, every crate with each
# feature, every published crate with the Rust it declares (rustup installs the
# toolchains), the docs with warnings denied, and `cargo publish --dry-run` of every
# library crate.
# Each stage is a script in scripts/; run one alone with e.g. `bash scripts/loom.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

# A run builds every crate several ways into one target directory. Without incremental
# caches and with line tables only in test binaries (a backtrace keeps file and line), a
# full run on an empty directory fits in the space `df` prints below; with cargo's
# defaults it needs more than twice that. Set either variable to keep your own.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}

target_dir=${CARGO_TARGET_DIR:-target}
free_space() {
    mkdir -p "$target_dir"
    df -h --output=avail "$target_dir" | tail -1 | tr -d ' '
}

stage() {
    local name=$1
    shift
    local start=$SECONDS
    echo "::: ${name}"
    "$@"
    echo "::: ${name} ok ($((SECONDS - start)) s, $(du -sh "$target_dir" | cut -f1) built, $(free_space) free)"
}

echo "::: disk: $(free_space) free for ${target_dir}"

stage setup bash scripts/setup.sh
stage fmt cargo fmt --all --check
stage clippy cargo clippy --workspace --all-targets --locked -- -D warnings
stage tests cargo test --workspace --locked
stage tokio-metrics bash -c "cargo clippy -q -p leasehold-tokio --all-targets --all-features --locked -- -D warnings && cargo test -q -p leasehold-tokio --all-features --locked"
stage storage bash -c "cargo clippy -q -p leasehold-storage --all-targets --all-features --locked -- -D warnings && cargo test -p leasehold-storage --all-features --locked"
stage bench-smoke bash scripts/bench-smoke.sh
# The TLS tests of Redis, etcd, PostgreSQL, the fenced-storage helper and the command
# run in the tests stage (the command's default `tls` feature turns on each crate's in
# the workspace build); this stage lints the crates with their TLS features named and
# adds Redis Cluster over TLS (feature `cluster` as well).
stage tls bash -c "cargo clippy -q -p leasehold-driver -p leasehold-redis -p leasehold-etcd -p leasehold-postgres -p leasehold-storage --all-targets --features leasehold-driver/rustls,leasehold-redis/tls,leasehold-redis/cluster,leasehold-etcd/tls,leasehold-postgres/tls,leasehold-storage/postgres-tls --locked -- -D warnings && cargo test -p leasehold-redis --features tls,cluster --test tls --locked"
stage redis-cluster bash -c "cargo clippy -q -p leasehold-redis --all-targets --features cluster --locked -- -D warnings && cargo test -p leasehold-redis --features cluster --locked --lib --test cluster"
stage loom bash scripts/loom.sh
stage no_std bash scripts/no-std.sh
stage embassy bash scripts/embassy.sh
stage firmware-redis bash scripts/firmware-redis.sh
stage model bash scripts/model.sh
stage features bash scripts/features.sh
stage msrv bash scripts/msrv.sh
stage docs env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
stage publish bash scripts/publish-check.sh
echo "::: all checks passed in ${SECONDS} s"
