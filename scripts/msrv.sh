#!/usr/bin/env bash
# Builds every published crate, and the `leasehold` command (leasehold-cli, not
# published but given an MSRV in the README), with the oldest Rust it declares
# (`rust-version` in its Cargo.toml, read with `cargo metadata`), so the README's MSRV
# list is checked, not just stated; and checks that the list names each of those crates
# with the version it declares:
#
#     bash scripts/msrv.sh
#
# Crates are grouped by version; each group is checked with `cargo +VERSION check
# --locked --lib --bins` into its own target dir (target/msrv-VERSION), so the old compiler
# never shares artefacts with the current one. The no_std crates declared for the
# oldest version are also built for thumbv6m-none-eabi with that toolchain.
# A toolchain that is missing is installed (`rustup toolchain install --profile
# minimal`); if it cannot be installed the script fails and says so — it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target_root=${CARGO_TARGET_DIR:-$root/target}

# "VERSION NAME" for every package that is published (publish is not `false`), and
# for leasehold-cli (the README gives its MSRV).
groups=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if (p.get("publish") != [] or p["name"] == "leasehold-cli") and p.get("rust_version"):
        print(p["rust_version"], p["name"])
' | sort -V)
if [[ -z $groups ]]; then
    echo "msrv: no published crate declares a rust-version" >&2
    exit 1
fi
grep -q " leasehold-cli$" <<<"$groups" || { echo "msrv: leasehold-cli declares no rust-version" >&2; exit 1; }

# The README's "Minimum supported Rust" section names each crate with its version:
# "`a`, `b` and `c`: 1.81. `d`: 1.85 (...)". Every crate checked here must be named
# there with the version it declares, and nothing else named.
python3 - "$groups" <<'PY' || exit 1
import re, sys
declared = dict(reversed(line.split()) for line in sys.argv[1].splitlines())
text = open("README.md", encoding="utf-8").read()
section = text.split("## Minimum supported Rust", 1)[1].split("\n## ", 1)[0]
stated = {}
for names, version in re.findall(r"((?:`[a-z-]+`(?:,\s+|\s+and\s+)?)+):\s+(\d+\.\d+)", section):
    for name in re.findall(r"`([a-z-]+)`", names):
        stated[name] = version
if stated != declared:
    for name in sorted(set(stated) | set(declared)):
        if stated.get(name) != declared.get(name):
            print(f"msrv: README says {name}: {stated.get(name)}, Cargo.toml says "
                  f"{declared.get(name)}", file=sys.stderr)
    sys.exit(1)
print(f"  the README's MSRV list matches the {len(declared)} crates' rust-version")
PY

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
        cargo "+$version" check --locked --lib --bins -q "${args[@]}"; then
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
echo "msrv: every published crate, and leasehold-cli, builds with its declared rust-version"
