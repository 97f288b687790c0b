#!/usr/bin/env python3
"""Where an ARM ELF can still panic, and whose code each panic path is.

    python3 scripts/panic-sites.py [--only-async-resume] ELF

Disassembles ELF (arm-none-eabi-objdump), finds every call to a panic routine
(core::panicking::*, Option::expect_failed, Result::unwrap_failed, the RefCell
panics), and resolves each path to it through the debug info, inlined frames
included (arm-none-eabi-addr2line -i): a call shared by several paths (the optimiser
merges identical tails) is resolved at each branch that jumps to it. A path's origin
is its innermost frame outside `core`: the code whose check it is (a `Map` of
futures-util, an `expect` of embassy, one of our own functions).

Prints one line per routine and origin: the routine called (or "async resume check"
for the compiler's "`async fn` resumed after completion" check) and the origin, with
the number of paths. The origin is read from debug info at opt-level "z": where the
optimiser merged the tails of several paths it can name an enclosing function instead
of the inlined code the check came from, so it is a guide, not a proof.

With --only-async-resume, exits 1 unless every call is to an async resume check: that
test reads only the routines called, which is exact.
"""
import re
import subprocess
import sys

PANIC = re.compile(
    r"<(core::panicking::[^>]*|core::option::expect_failed|core::result::unwrap_failed"
    r"|core::cell::panic_already[^>]*)>"
)
FUNC = re.compile(r"^([0-9a-f]+) <(.*)>:$")
TARGET = re.compile(r"\b([0-9a-f]+) <")


def disassemble(elf):
    out = subprocess.run(
        ["arm-none-eabi-objdump", "-d", "-C", "--no-show-raw-insn", elf],
        check=True, capture_output=True, text=True,
    ).stdout
    insns, fn = [], None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(2)
            continue
        m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and fn is not None:
            insns.append((int(m.group(1), 16), fn, m.group(2), m.group(3)))
    return insns


def origin(frames):
    """The innermost frame outside `core` (frames are innermost first)."""
    for f in frames:
        name = f.lstrip("<")
        if not name.startswith("core::"):
            return f
    return frames[-1] if frames else "?"


def main():
    args = sys.argv[1:]
    strict = "--only-async-resume" in args
    elf = [a for a in args if a != "--only-async-resume"][0]
    insns = disassemble(elf)
    calls = []  # (index of the call, its address, calling function, callee)
    for i, (addr, fn, op, args_) in enumerate(insns):
        m = PANIC.search(args_)
        if op.startswith("bl") and m and not PANIC.search("<" + fn + ">"):
            calls.append((i, addr, fn, m.group(1)))
    # Every branch into a call site (or the fall-through into it) is a path to it.
    by_target = {}
    for addr, fn, op, args_ in insns:
        if op.startswith("b") and not op.startswith(("bl", "bic", "bfc", "bfi")):
            m = TARGET.search(args_)
            if m:
                by_target.setdefault(int(m.group(1), 16), []).append(addr)
    paths = []  # (callee, address whose inline chain tells the origin)
    for i, addr, fn, callee in calls:
        sources = list(by_target.get(addr, []))
        prev = insns[i - 1] if i > 0 else None
        falls_through = prev is not None and prev[1] == fn and not (
            prev[2] in ("b", "b.n", "b.w", "bx") or (prev[2].startswith("pop") and "pc" in prev[3])
        )
        if falls_through or not sources:
            sources.append(addr)
        for src in sorted(set(sources)):
            paths.append((callee, src))
    if not paths:
        print("    (no panic path)")
        return 0
    # One addr2line for every path: -a prints each address before its frames.
    lines = subprocess.run(
        ["arm-none-eabi-addr2line", "-a", "-i", "-f", "-C", "-e", elf]
        + [hex(a) for _, a in paths],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    chains = []
    for line in lines:
        if line.startswith("0x"):
            chains.append([])
        elif chains:
            chains[-1].append(line)
    seen = {}
    for (callee, _), chain in zip(paths, chains):
        key = (callee, origin(chain[0::2]))
        seen[key] = seen.get(key, 0) + 1
    others = 0
    for (callee, where), n in sorted(seen.items()):
        resume = "panic_const_async_fn_resumed" in callee
        others += 0 if resume else 1
        kind = "async resume check" if resume else callee
        print(f"    {kind} <- {where} ({n})")
    return 1 if strict and others else 0


if __name__ == "__main__":
    sys.exit(main())
