#!/usr/bin/env bash
# Proves the no_std crates build for bare-metal targets, with and without defmt:
# thumbv6m (Cortex-M0: no CAS, no 64-bit atomics), thumbv7em, riscv32imc.
set -euo pipefail
cd "$(dirname "$0")/.."
for target in thumbv6m-none-eabi thumbv7em-none-eabihf riscv32imc-unknown-none-elf; do
    for features in "" "defmt"; do
        for crate in leasehold leasehold-driver leasehold-embassy leasehold-resp; do
            echo "  ${crate} --target ${target} ${features:+--features $features}"
            cargo build --locked -q -p "$crate" --target "$target" ${features:+--features "$features"}
        done
    done
done
