#!/usr/bin/env bash
# Installs what the tests need when it is missing. Safe to run again.
set -euo pipefail

components=$(rustup component list --installed)
for c in rustfmt clippy; do
    grep -q "^${c}" <<<"$components" || rustup component add "$c"
done

targets=(thumbv6m-none-eabi thumbv7em-none-eabihf riscv32imc-unknown-none-elf)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t"
done

# Debian packages: command -> package.
declare -A packages=(
    [redis-server]=redis-server
    [redis-cli]=redis-tools
    [etcd]=etcd-server
    [pgbouncer]=pgbouncer
    [etcdctl]=etcd-client
    [protoc]=protobuf-compiler
    [arm-none-eabi-size]=binutils-arm-none-eabi
    [qemu-system-arm]=qemu-system-arm
    [openssl]=openssl
)
missing=()
for cmd in "${!packages[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${packages[$cmd]}")
done
# PostgreSQL's server binaries live in /usr/lib/postgresql/<version>/bin, off PATH
# (leasehold-test-support looks there); the package is missing when no version is.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 ||
    missing+=(postgresql)
if ((${#missing[@]})); then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
