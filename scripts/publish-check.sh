#!/usr/bin/env bash
# Proves the library crates can be published: packages each one as crates.io would
# receive it and builds every package from its .crate alone (`cargo publish --dry-run`,
# multi-package: the local crates resolve from each other's packages in dependency
# order, the rest from crates.io; needs cargo 1.90+ and the crates.io index).
#
#     bash scripts/publish-check.sh                 # a committed tree
#     bash scripts/publish-check.sh --allow-dirty   # extra arguments go to cargo publish
#
# Also checks what cargo does not: each published crate carries the workspace's licence
# texts (cargo packages only the crate's own directory, so each crate dir holds a copy
# of LICENSE-MIT and LICENSE-APACHE), exactly the library crates are published (every
# other member says `publish = false`), and packaging warns about nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The published crates: name and directory.
libraries=(
    "leasehold core"
    "leasehold-driver adapters/driver"
    "leasehold-memory adapters/service/memory"
    "leasehold-tokio adapters/runtime/tokio"
    "leasehold-embassy adapters/runtime/embassy"
    "leasehold-redis adapters/service/redis"
    "leasehold-etcd adapters/service/etcd"
    "leasehold-resp adapters/service/resp"
    "leasehold-storage adapters/storage"
    "leasehold-postgres adapters/service/postgres"
)

status=0
for entry in "${libraries[@]}"; do
    dir=${entry#* }
    for licence in LICENSE-MIT LICENSE-APACHE; do
        if ! cmp -s "$licence" "$dir/$licence"; then
            echo "error: $dir/$licence is missing or differs from ./$licence (copy it)" >&2
            status=1
        fi
    done
done
[ "$status" -eq 0 ] || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The dry run puts the new packages in a local registry overlay, which cargo unpacks
# under $CARGO_HOME/registry/src/-<hash of the overlay's path>/ and never unpacks again
# if that directory exists: a clone at the same path as an earlier run would build
# against the earlier run's sources. Those unpacked copies of our own crates go first.
# Likewise cargo never rebuilds a registry crate it has built (registry sources are
# immutable to it), so the fingerprints of our crates go too: they rebuild in seconds.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
target_dir=${CARGO_TARGET_DIR:-target}
for entry in "${libraries[@]}"; do
    name=${entry%% *}
    rm -rf "$cargo_home"/registry/src/-*/"$name"-[0-9]* \
        "$target_dir"/debug/.fingerprint/"$name"-[0-9a-f]*
done

# Every workspace member not marked `publish = false` is packaged; the non-library
# members (examples, loom-tests, embassy-mock-tests) are left out by that key, not by
# `--exclude`, so that forgetting it on a new test crate fails the check below.
cargo publish --workspace --dry-run --locked "$@" 2>&1 | tee "$log"

packaged=$(sed -n 's/^ *Packaging \([^ ]*\) v.*/\1/p' "$log" | sort)
expected=$(for entry in "${libraries[@]}"; do echo "${entry%% *}"; done | sort)
if [ "$packaged" != "$expected" ]; then
    echo "error: packaged crates differ from the library crates (mark the others publish = false)" >&2
    diff <(echo "$expected") <(echo "$packaged") >&2 || true
    exit 1
fi

# cargo only warns about missing metadata, an unpackaged readme, and the like.
if grep '^warning:' "$log" | grep -v 'aborting upload due to dry run'; then
    echo "error: packaging warned (above)" >&2
    exit 1
fi
echo "publish check: ${expected//$'\n'/, } package and build"
