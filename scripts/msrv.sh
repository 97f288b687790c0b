#!/usr/bin/env bash
# Builds every published crate with the oldest Rust it declares (`rust-version` in its
# Cargo.toml, read with `cargo metadata`), so the README's MSRV table is checked, not
# just stated:
#
#     bash scripts/msrv.sh
#
# Crates are grouped by version; each group is checked with `cargo +VERSION check
# --locked --lib` into its own target dir (target/msrv-VERSION), so the old compiler
# never shares artefacts with the current one. The no_std crates declared for the
# oldest version are also built for thumbv6m-none-eabi with that toolchain.
# A toolchain that is missing is installed (`rustup toolchain install --profile
# minimal`); if it cannot be installed the script fails and says so — it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target_root=${CARGO_TARGET_DIR:-$root/target}

# "VERSION NAME" for every package that is published (publish is not `false`).
groups=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") != [] and p.get("rust_version"):
        print(p["rust_version"], p["name"])
' | sort -V)
if [[ -z $groups ]]; then
    echo "msrv: no published crate declares a rust-version" >&2
    exit 1
fi

ensure_toolchain() {
    local version=$1
    if ! rustup run "$version" rustc --version >/dev/null 2>&1; then
        echo "  installing Rust ${version} (minimal profile)"
        if ! rustup toolchain install "$version" --profile minimal --no-self-update >/dev/null; then
            echo "msrv: cannot install Rust ${version}: the MSRV is not checked" >&2
            exit 1
        fi
    fi
}

oldest=""
failed=()
for version in $(awk '{print $1}' <<<"$groups" | uniq); do
    crates=$(awk -v v="$version" '$1 == v {print $2}' <<<"$groups")
    [[ -z $oldest ]] && oldest=$version
    ensure_toolchain "$version"
    args=()
    for crate in $crates; do args+=(-p "$crate"); done
    echo "  Rust ${version}: ${crates//$'\n'/ }"
    if ! CARGO_TARGET_DIR="$target_root/msrv-$version" \
        cargo "+$version" check --locked --lib -q "${args[@]}"; then
        failed+=("Rust ${version}: ${crates//$'\n'/ }")
    fi
done

# The no_std crates of the oldest MSRV, on the smallest target (no CAS, no 64-bit
# atomics), with that toolchain.
nostd_target=thumbv6m-none-eabi
if ! rustup target list --installed --toolchain "$oldest" | grep -qx "$nostd_target"; then
    echo "  adding ${nostd_target} to Rust ${oldest}"
    rustup target add "$nostd_target" --toolchain "$oldest" >/dev/null
fi
crates=$(awk -v v="$oldest" '$1 == v {print $2}' <<<"$groups")
args=()
for crate in $crates; do args+=(-p "$crate"); done
echo "  Rust ${oldest} --target ${nostd_target}: ${crates//$'\n'/ }"
if ! CARGO_TARGET_DIR="$target_root/msrv-$oldest" \
    cargo "+$oldest" build --locked --lib -q --target "$nostd_target" "${args[@]}"; then
    failed+=("Rust ${oldest} --target ${nostd_target}")
fi
if ((${#failed[@]})); then
    echo "msrv: FAILED — these crates do not build with the Rust they declare:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "msrv: every published crate builds with its declared rust-version"
