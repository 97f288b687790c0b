#!/usr/bin/env bash
# Every crate compiles with none of its features, with each feature alone, and with its
# defaults — so an optional feature cannot rot unnoticed (leasehold-tokio with `tracing`
# off, leasehold-redis with `tls`, the no_std crates with `defmt`):
#
#     bash scripts/features.sh
#
# The list is explicit (one line per crate: its features) rather than generated, so
# that it needs no extra tool; `scripts/features.sh` fails if a crate gains a feature
# this list does not name. All targets are checked (lib, tests, examples, benches), so
# feature-gated test code compiles too. The no_std targets are checked by no-std.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# crate: its features (besides `default`).
declare -A features=(
    [leasehold]="defmt"
    [leasehold-driver]="defmt rustls getrandom"
    [leasehold-embassy]="defmt"
    [leasehold-resp]="defmt"
    [leasehold-tokio]="tracing metrics"
    [leasehold-redis]="tls cluster"
    [leasehold-storage]="postgres postgres-tls sqlite sqlite-tokio"
    [leasehold-etcd]="tls"
    [leasehold-postgres]="tls"
    [leasehold-cli]="tls"
    [leasehold-test-support]="scenarios"
)

# Every feature a crate declares must be in the list.
declared=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    names = sorted(f for f in p["features"] if f != "default")
    print(p["name"], " ".join(names))
')
status=0
while read -r name rest; do
    [[ -v "features[$name]" ]] || continue
    for feature in $rest; do
        if [[ " ${features[$name]} " != *" $feature "* ]]; then
            echo "features: ${name} declares \`${feature}\`, which scripts/features.sh does not check" >&2
            status=1
        fi
    done
done <<<"$declared"

check() {
    echo "  cargo check -p $*"
    cargo check -q --locked --all-targets -p "$@" || status=1
}

for crate in "${!features[@]}"; do
    check "$crate" --no-default-features
    for feature in ${features[$crate]}; do
        check "$crate" --no-default-features --features "$feature"
    done
    check "$crate"
done
if ((status)); then
    echo "features: FAILED" >&2
    exit 1
fi
echo "features: every crate compiles with no feature, each feature alone, and its defaults"
