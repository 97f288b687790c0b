#!/usr/bin/env bash
# The embassy stage: what `cargo test --workspace` cannot do.
#
#   1. the std-driver and defmt tests (adapters/runtime/embassy-std-tests): excluded from
#      the workspace because embassy-time's `std` driver and the mock driver that
#      leasehold-embassy's own tests use cannot share one feature-unified build;
#   2. the firmware example (examples/firmware, its own lock file) for thumbv7em and
#      thumbv6m, with and without the lease, checked with rustfmt and clippy;
#   3. scripts/firmware-size.sh: the flash / RAM / stack / panic-path table (it fails
#      if the core has a panic path or the lease or gate outgrow their budgets).
#
# Needs scripts/setup.sh first (rustup targets, arm-none-eabi binutils). The stack
# column needs qemu-system-arm and is "n/a" without it.
set -euo pipefail
cd "$(dirname "$0")/.."

std_tests=adapters/runtime/embassy-std-tests/Cargo.toml
echo "  embassy std-driver tests"
cargo fmt --manifest-path "$std_tests" --check
cargo clippy --locked -q --manifest-path "$std_tests" --target-dir target/embassy-std-tests \
    --all-targets -- -D warnings
cargo test --locked --manifest-path "$std_tests" --target-dir target/embassy-std-tests

firmware=examples/firmware/Cargo.toml
echo "  firmware: fmt, clippy"
cargo fmt --manifest-path "$firmware" --check
for target in thumbv7em-none-eabihf thumbv6m-none-eabi; do
    for features in "" "--no-default-features" "--features semihosting,paint-stack" \
        "--features probe-driver" "--features probe-baseline-builtins" \
        "--no-default-features --features probe-baseline-builtins" \
        "--features redis" "--features redis,semihosting" "--features probe-resp"; do
        echo "  firmware --target $target $features"
        # shellcheck disable=SC2086 # $features is a flag list
        cargo clippy --locked -q --manifest-path "$firmware" --release --target "$target" \
            $features -- -D warnings
    done
done

echo "  firmware sizes"
bash scripts/firmware-size.sh
