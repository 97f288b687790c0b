//! Counters the tasks bump, and (feature `semihosting`, under QEMU) the report at the
//! end: the counters and, with `paint-stack`, the stack high-water mark. In the `redis`
//! run it also prints each lease event and the moment the writer found its gate
//! closed, as they happen: the host reads them from QEMU's stdout as they come.

use core::sync::atomic::{AtomicU32, Ordering};

/// Event and write counters (the baseline, without the lease, bumps only some). Each has a single writer (one task or the ISR), so a
/// load-then-store is enough: no read-modify-write atomics (none on thumbv6m).
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub struct Counters {
    pub acquired: AtomicU32,
    pub renewed: AtomicU32,
    pub lost: AtomicU32,
    pub released: AtomicU32,
    pub other_events: AtomicU32,
    pub lost_signals: AtomicU32,
    pub writes_admitted: AtomicU32,
    pub writes_stale: AtomicU32,
    pub writes_refused: AtomicU32,
    pub isr_ticks_held: AtomicU32,
}

pub static COUNTERS: Counters = Counters {
    acquired: AtomicU32::new(0),
    renewed: AtomicU32::new(0),
    lost: AtomicU32::new(0),
    released: AtomicU32::new(0),
    other_events: AtomicU32::new(0),
    lost_signals: AtomicU32::new(0),
    writes_admitted: AtomicU32::new(0),
    writes_stale: AtomicU32::new(0),
    writes_refused: AtomicU32::new(0),
    isr_ticks_held: AtomicU32::new(0),
};

pub fn bump(counter: &AtomicU32) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// A lease event (`redis` run with `semihosting`: printed at once; otherwise nothing).
#[cfg(feature = "lease")]
pub fn event(report: &leasehold_embassy::Report) {
    #[cfg(all(feature = "redis", feature = "semihosting"))]
    semihosting::event(report);
    let _ = report;
}

/// The writer found the gate closed after it was open (`redis` run with
/// `semihosting`: printed at once; otherwise nothing).
#[cfg(feature = "redis")]
pub fn gate_closed() {
    #[cfg(all(feature = "redis", feature = "semihosting"))]
    semihosting::gate_closed();
}

/// Ends the run: prints the report and exits QEMU (feature `semihosting`), or does
/// nothing on hardware.
pub fn finish() {
    #[cfg(feature = "semihosting")]
    semihosting::finish();
}

#[cfg(feature = "semihosting")]
mod semihosting {
    use core::sync::atomic::Ordering::Relaxed;

    use cortex_m_semihosting::{debug, hprintln};

    use super::COUNTERS as C;

    /// Milliseconds since boot on the firmware's clock.
    #[cfg(feature = "redis")]
    fn now_ms() -> u64 {
        embassy_time::Instant::now().as_millis()
    }

    #[cfg(feature = "redis")]
    pub fn event(report: &leasehold_embassy::Report) {
        use leasehold::Event;
        use leasehold_embassy::Report;
        let Report::Event(event) = report else {
            return;
        };
        let t = now_ms();
        match event {
            Event::Acquired {
                fence, deadline, ..
            } => hprintln!(
                "event=acquired fence={} deadline_ms={} t_ms={}",
                fence.0,
                deadline.as_micros() / 1_000,
                t
            ),
            Event::Renewed { deadline, .. } => hprintln!(
                "event=renewed deadline_ms={} t_ms={}",
                deadline.as_micros() / 1_000,
                t
            ),
            Event::Lost { reason, .. } => hprintln!("event=lost reason={:?} t_ms={}", reason, t),
            other => hprintln!("event=other {:?} t_ms={}", other, t),
        }
    }

    #[cfg(feature = "redis")]
    pub fn gate_closed() {
        hprintln!("gate_closed t_ms={}", now_ms());
    }

    pub fn finish() {
        hprintln!(
            "acquired={} renewed={} lost={} released={} other_events={} lost_signals={}",
            C.acquired.load(Relaxed),
            C.renewed.load(Relaxed),
            C.lost.load(Relaxed),
            C.released.load(Relaxed),
            C.other_events.load(Relaxed),
            C.lost_signals.load(Relaxed)
        );
        hprintln!(
            "writes_admitted={} writes_stale={} writes_refused={} isr_ticks_held={}",
            C.writes_admitted.load(Relaxed),
            C.writes_stale.load(Relaxed),
            C.writes_refused.load(Relaxed),
            C.isr_ticks_held.load(Relaxed)
        );
        #[cfg(feature = "paint-stack")]
        hprintln!("stack_high_water_bytes={}", stack::high_water());
        debug::exit(debug::EXIT_SUCCESS);
    }

    #[cfg(feature = "paint-stack")]
    mod stack {
        extern "C" {
            // cortex-m-rt's linker script: the stack grows down from `_stack_start` to
            // `_stack_end`, painted with 0xCCCC_CCCC at reset (`paint-stack`).
            static _stack_start: u32;
            static _stack_end: u32;
        }

        /// Bytes of stack ever used: from the top down to the deepest unpainted word.
        pub fn high_water() -> usize {
            // SAFETY: only the addresses of the two linker symbols are taken, and the
            // words between them (the stack region, always mapped RAM) are read with
            // volatile loads; nothing is written.
            unsafe {
                let top = core::ptr::addr_of!(_stack_start) as usize;
                let mut word = core::ptr::addr_of!(_stack_end);
                while (word as usize) < top && word.read_volatile() == 0xcccc_cccc {
                    word = word.add(1);
                }
                top - word as usize
            }
        }
    }
}
