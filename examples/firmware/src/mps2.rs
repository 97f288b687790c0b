//! The registers of the Arm MPS2 boards (FPGA images AN385 and AN386; QEMU's
//! `mps2-an385` and `mps2-an386`) that the `redis` mode uses, and the firmware's only
//! `unsafe`: volatile access to them.
//!
//! * UART0, a CMSDK APB UART (`uart`);
//! * the FPGA I/O block's prescaled counter, the `redis` mode's clock (`time_driver`):
//!   a counter read from the hardware never loses time, where counting SysTick
//!   interrupts does whenever one is handled late (QEMU coalesces them when the host
//!   is busy: the firmware's clock then runs slow, and its gate closes late).

/// A 32-bit device register.
#[derive(Clone, Copy)]
pub enum Reg {
    /// UART0 DATA. Read: the received byte (clears RX full). Write: the byte to send.
    UartData = 0x4000_4000,
    /// UART0 STATE. Bit 0: TX buffer full; bit 1: RX buffer full.
    UartState = 0x4000_4004,
    /// UART0 CTRL. Bit 0: TX enable; bit 1: RX enable.
    UartCtrl = 0x4000_4008,
    /// UART0 BAUDDIV: APB clock / baud rate (16 or more).
    UartBaudDiv = 0x4000_4010,
    /// FPGAIO COUNTER: counts up each time the prescaler wraps.
    Counter = 0x4002_8018,
    /// FPGAIO PRESCALE: the prescaler counts the 25 MHz clock down from this to 0.
    Prescale = 0x4002_801c,
}

pub fn read(reg: Reg) -> u32 {
    // SAFETY: every `Reg` is the address of a 32-bit device register of these boards,
    // always mapped; a volatile read has no effect but the register's own (reading
    // UART DATA takes the received byte).
    unsafe { (reg as usize as *const u32).read_volatile() }
}

pub fn write(reg: Reg, value: u32) {
    // SAFETY: as for `read`: a device register, not memory any Rust value lives in,
    // so the write aliases nothing.
    unsafe { (reg as usize as *mut u32).write_volatile(value) }
}

/// Makes `Counter` count milliseconds: the prescaler wraps every 25 000 cycles.
pub fn start_millisecond_counter() {
    write(Reg::Prescale, 25_000 - 1);
    write(Reg::Counter, 0);
}
