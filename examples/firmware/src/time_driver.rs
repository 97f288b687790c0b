//! A minimal embassy-time driver: a 1 kHz tick from SysTick, and embassy's timer queue.
//!
//! A real board would use its HAL's driver (an RTC or a 32-bit timer, which also lets
//! the core sleep between ticks); this one needs nothing but the Cortex-M core, so the
//! example builds for any Cortex-M. Everything lives behind a critical section (no CAS,
//! no 64-bit atomics: fine on thumbv6m). The tick rate is embassy-time's `tick-hz-1_000`
//! feature; the lease adapter converts whatever the rate is.
//!
//! In the `redis` mode (MPS2 boards) the tick count is not the number of SysTick
//! interrupts but the board's millisecond counter (`mps2`), read at every interrupt
//! and at every `now()`: an interrupt handled late (or two merged into one, as QEMU
//! does when the host is busy) then delays a wake-up by a tick, but never makes the
//! clock lose time, which would make the lease's gate close late.

use core::cell::{Cell, RefCell};
use core::task::Waker;

use critical_section::{CriticalSection, Mutex};
use embassy_time_driver::Driver;
use embassy_time_queue_utils::Queue;

/// The core clock SysTick counts. 12 MHz is the reset clock of many parts (and
/// QEMU's `lm3s6965evb`); set it to your core clock.
const CORE_HZ: u32 = if cfg!(feature = "redis") {
    // The MPS2 boards' (and QEMU's models') 25 MHz.
    25_000_000
} else {
    12_000_000
};
const TICK_HZ: u32 = 1_000;

struct SysTickDriver {
    ticks: Mutex<Cell<u64>>,
    /// Tick at which the queue's earliest timer is due (`u64::MAX`: none).
    alarm: Mutex<Cell<u64>>,
    queue: Mutex<RefCell<Queue>>,
}

// `time_driver_impl!` exports the driver as the `_embassy_time_*` symbols that
// embassy-time links against (a `#[no_mangle]` item, hence `unsafe` in the macro).
embassy_time_driver::time_driver_impl!(static DRIVER: SysTickDriver = SysTickDriver {
    ticks: Mutex::new(Cell::new(0)),
    alarm: Mutex::new(Cell::new(u64::MAX)),
    queue: Mutex::new(RefCell::new(Queue::new())),
});

impl SysTickDriver {
    /// The tick count now: the interrupts counted, or (`redis`) the board's
    /// millisecond counter, widened to 64 bits (it wraps after 49 days; read at least
    /// every millisecond by the SysTick handler, it never wraps unseen).
    fn read(&self, cs: CriticalSection<'_>) -> u64 {
        let ticks = self.ticks.borrow(cs);
        #[cfg(feature = "redis")]
        {
            let last = ticks.get();
            let counter = crate::mps2::read(crate::mps2::Reg::Counter);
            ticks.set(last.wrapping_add(u64::from(counter.wrapping_sub(last as u32))));
        }
        ticks.get()
    }

    /// Wakes what is due at `now` and re-arms the alarm for the next expiration.
    fn fire(&self, cs: CriticalSection<'_>, now: u64) {
        // Within one critical section nothing else can hold the queue: no re-entrant
        // borrow is possible (waking a task only pends the executor).
        if let Ok(mut queue) = self.queue.borrow(cs).try_borrow_mut() {
            self.alarm.borrow(cs).set(queue.next_expiration(now));
        }
    }
}

impl Driver for SysTickDriver {
    fn now(&self) -> u64 {
        critical_section::with(|cs| self.read(cs))
    }

    fn schedule_wake(&self, at: u64, waker: &Waker) {
        critical_section::with(|cs| {
            let changed = match self.queue.borrow(cs).try_borrow_mut() {
                Ok(mut queue) => queue.schedule_wake(at, waker),
                Err(_) => false,
            };
            if changed {
                self.fire(cs, self.read(cs));
            }
        });
    }
}

/// Starts the 1 kHz tick. Call once, before the executor runs.
pub fn start(mut syst: cortex_m::peripheral::SYST) {
    #[cfg(feature = "redis")]
    crate::mps2::start_millisecond_counter();
    use cortex_m::peripheral::syst::SystClkSource;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(CORE_HZ / TICK_HZ - 1);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

#[cortex_m_rt::exception]
fn SysTick() {
    critical_section::with(|cs| {
        let now = if cfg!(feature = "redis") {
            DRIVER.read(cs)
        } else {
            let ticks = DRIVER.ticks.borrow(cs);
            ticks.set(ticks.get().wrapping_add(1));
            ticks.get()
        };
        if now >= DRIVER.alarm.borrow(cs).get() {
            DRIVER.fire(cs, now);
        }
    });
    crate::on_tick();
}
