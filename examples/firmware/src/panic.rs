//! The panic handler.
//!
//! With the `panic-check` feature it calls a function that is defined nowhere, so the
//! program links only if the optimiser removed every path to a panic; otherwise the
//! linker names the functions that still reach one. `scripts/firmware-size.sh` uses it
//! to show that the lease core has no panic path left.

use core::panic::PanicInfo;

#[cfg(not(feature = "panic-check"))]
#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    // A permanent fault: the debugger (or QEMU) stops here.
    cortex_m::asm::udf()
}

#[cfg(feature = "panic-check")]
#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    extern "C" {
        /// Never defined: referencing it fails the link.
        fn leasehold_panic_path_survived() -> !;
    }
    // SAFETY: never runs; a surviving reference is a link error.
    unsafe { leasehold_panic_path_survived() }
}
