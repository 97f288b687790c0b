#!/usr/bin/env bash
# A device holds a lease on a real Redis: the bare-metal firmware (examples/firmware,
# features `redis,semihosting`) runs in QEMU, Cortex-M4F build on `mps2-an386`,
# Cortex-M0 build on `mps2-an385` (a Cortex-M3: ARMv6-M code runs on it unchanged);
# its UART0 is QEMU's TCP connection to a redis-server the test starts. Redis is
# stopped past the key's TTL: the firmware's gate must close before Redis's own
# expiry (the margin is printed), and a host client must then take the key with a
# newer fence. See adapters/service/resp/tests/firmware_on_redis.rs.
#
# Fails, never skips, when qemu-system-arm or a firmware build is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts the firmware's builds: CARGO_TARGET_DIR if set, else the firmware's
# own `target` (as scripts/firmware-size.sh).
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-examples/firmware/target}")

runs=()
for target in thumbv7em-none-eabihf thumbv6m-none-eabi; do
    machine=mps2-an386
    [[ $target == thumbv6m-none-eabi ]] && machine=mps2-an385
    echo "  firmware --target $target --features redis,semihosting"
    # From the firmware's directory: its .cargo/config.toml has the linker script.
    (cd examples/firmware && CARGO_TARGET_DIR="$target_dir" cargo build --locked -q \
        --release --target "$target" --bin firmware --no-default-features \
        --features redis,semihosting)
    elf="$target_dir/$target/release/firmware-redis"
    cp "$target_dir/$target/release/firmware" "$elf"
    runs+=("$machine=$elf")
done
# The test is not among `--all-targets` (it has `test = false`): lint it here.
cargo clippy --locked -q -p leasehold-resp --test firmware_on_redis -- -D warnings
cargo test --locked -p leasehold-resp --test firmware_on_redis -- "${runs[@]}"
