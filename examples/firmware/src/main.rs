//! A pump controller that may drive the pump only while it holds the lease "pump-7".
//!
//! Tasks, on one embassy thread-mode executor:
//!
//! * `lease_task` — acquires, renews (every T/3) and releases the lease over the link,
//!   re-acquiring after a loss; the shared `leasehold-driver` loop via
//!   `leasehold_embassy::run_term`;
//! * `link::gateway` — the lock service at the other end of the link (the lock table
//!   of `gateway`, hard TTL, at most 3 s); it goes silent from 7 s to 11 s, so the
//!   lease is lost (Expired) and re-acquired;
//! * `writer` — every 100 ms, checks the gate and writes with the fence to a fenced
//!   store (`FenceGate`), or does not write;
//! * `watcher` — waits for the lost signal;
//! * `app` — after 20 s asks for the release.
//!
//! The SysTick handler (an interrupt) reads the gate too, at every tick.
//!
//! Without the `lease` feature the same firmware talks to the gateway by hand and writes
//! unguarded: the baseline for `scripts/firmware-size.sh`.
//!
//! With the `redis` feature the lock service is a real Redis over the board's UART0
//! (`redis`, `uart`: Arm MPS2 boards, QEMU's `mps2-an385` / `mps2-an386`) and there is
//! no gateway and no `app`: the firmware holds the lease for one term, writes every
//! 5 ms, reports the moment it finds its gate closed, and stops when the lease is lost
//! (`scripts/firmware-redis.sh` runs it against `redis-server`).
#![no_std]
#![no_main]

// The baseline (no `lease` feature) neither asks who holds the key nor reads answers
// other than the acquire's.
#[cfg(not(feature = "redis"))]
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
#[cfg(not(feature = "redis"))]
mod link;
#[cfg(feature = "redis")]
mod mps2;
mod panic;
#[cfg(feature = "redis")]
mod redis;
mod report;
mod time_driver;
#[cfg(feature = "redis")]
mod uart;

use core::cell::Cell;

use critical_section::Mutex;
use embassy_executor::{SpawnError, SpawnToken, Spawner};
use embassy_time::Timer;
use leasehold::{Duration, Fence, FenceGate, Identity, Owner};

#[cfg(not(feature = "redis"))]
use crate::link::Link;
use crate::report::{bump, COUNTERS};

/// The link to the gateway (the lock service).
#[cfg(not(feature = "redis"))]
static LINK: Link = Link::new();

/// The storage the pump writes go to, guarded by fences (storage side).
static STORAGE: Mutex<Cell<FenceGate>> = Mutex::new(Cell::new(FenceGate::new()));

/// The device's owner identity: caller-supplied on bare metal (e.g. the chip's serial
/// number), 16 bytes.
const OWNER: Owner = Owner(*b"pump-controller7");

const TTL: Duration = Duration::from_secs(3);

/// The lease's key at the lock service.
const KEY: &str = "pump-7";

/// How often the writer tries to write: in the `redis` run, often enough to tell
/// within 5 ms when the gate closed.
const WRITE_EVERY_MS: u64 = if cfg!(feature = "redis") { 5 } else { 100 };

/// Who we are, in words: stored by the gateway with the grant, shown to contenders.
fn identity() -> Identity {
    Identity::new("pump-controller7").unwrap_or_default()
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    if let Some(peripherals) = cortex_m::Peripherals::take() {
        time_driver::start(peripherals.SYST);
    }
    #[cfg(not(feature = "redis"))]
    {
        spawn(spawner, link::gateway());
        spawn(spawner, app());
    }
    spawn(spawner, writer());
    lease::spawn_tasks(spawner);
}

/// Spawns a task; a task pool that is already full is a bug in this file: halt.
fn spawn<S>(spawner: Spawner, token: Result<SpawnToken<S>, SpawnError>) {
    match token {
        Ok(token) => spawner.spawn(token),
        Err(_) => halt(),
    }
}

fn halt() -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

/// Writes `value` to storage if `fence` is no older than the newest it has seen.
fn store(fence: Fence, value: u32) {
    let admitted = critical_section::with(|cs| {
        let cell = STORAGE.borrow(cs);
        let mut gate = cell.get();
        let admitted = gate.admit(fence).is_ok();
        cell.set(gate);
        admitted
    });
    let _ = value; // the pump set-point would go out here
    bump(if admitted {
        &COUNTERS.writes_admitted
    } else {
        &COUNTERS.writes_stale
    });
}

#[embassy_executor::task]
async fn writer() {
    let mut setpoint = 0u32;
    #[cfg(feature = "redis")]
    let mut was_open = false;
    loop {
        Timer::after_millis(WRITE_EVERY_MS).await;
        setpoint = setpoint.wrapping_add(1);
        let fence = lease::check();
        match fence {
            Some(fence) => store(fence, setpoint),
            None => bump(&COUNTERS.writes_refused),
        }
        // The `redis` run reports the moment the gate is found closed.
        #[cfg(feature = "redis")]
        {
            if was_open && fence.is_none() {
                report::gate_closed();
            }
            was_open = fence.is_some();
        }
    }
}

#[cfg(not(feature = "redis"))]
#[embassy_executor::task]
async fn app() {
    Timer::after_secs(20).await;
    lease::request_release();
    Timer::after_secs(1).await;
    report::finish();
}

/// Called by the SysTick handler at every tick: an interrupt handler reading the gate.
fn on_tick() {
    if lease::check().is_some() {
        bump(&COUNTERS.isr_ticks_held);
    }
}

#[cfg(feature = "lease")]
mod lease {
    use embassy_executor::Spawner;
    use embassy_time::Timer;
    use leasehold::{Config, Event, Fence, Instant, Lease};
    use leasehold_embassy::{LeaseShared, Report, Target, TermEnd};

    use crate::report::{self, bump, COUNTERS};
    use crate::{identity, spawn, KEY, OWNER, TTL};

    const CONFIG: Config = match Config::builder(TTL).drift_ppm(20_000).build() {
        Ok(config) => config,
        // Evaluated at compile time: an invalid config does not build.
        Err(_) => panic!("invalid lease config"),
    };

    /// The gate and the signals, shared with the writer, the watcher and the ISR.
    static LEASE: LeaseShared = LeaseShared::new();

    pub(crate) fn spawn_tasks(spawner: Spawner) {
        spawn(spawner, lease_task());
        spawn(spawner, watcher());
    }

    pub(crate) fn check() -> Option<Fence> {
        LEASE.check().ok()
    }

    #[cfg(not(feature = "redis"))]
    pub(crate) fn request_release() {
        LEASE.request_release();
    }

    #[embassy_executor::task]
    async fn lease_task() {
        let mut lease = Lease::new(CONFIG, OWNER);
        let identity = identity();
        #[cfg(not(feature = "redis"))]
        let service = &crate::LINK;
        #[cfg(feature = "redis")]
        let service = &crate::redis::service();
        let target = Target {
            service,
            key: KEY,
            owner: OWNER,
            identity: &identity,
        };
        loop {
            // Wait for the key as long as it takes (`Instant::MAX`): the pump has
            // nothing else to do.
            let end =
                leasehold_embassy::run_term(&mut lease, &LEASE, target, Instant::MAX, |report| {
                    report::event(&report);
                    bump(match report {
                        Report::Event(Event::Acquired { .. }) => &COUNTERS.acquired,
                        Report::Event(Event::Renewed { .. }) => &COUNTERS.renewed,
                        Report::Event(Event::Lost { .. }) => &COUNTERS.lost,
                        Report::Event(Event::Released) => &COUNTERS.released,
                        _ => &COUNTERS.other_events,
                    })
                })
                .await;
            if cfg!(feature = "redis") {
                // One term against Redis: report how it went and stop, once the writer
                // (every 5 ms) has had the time to report its gate closed.
                Timer::after_millis(20).await;
                report::finish();
                return;
            }
            match end {
                // Released, or refused for good (retrying cannot help): stop.
                Ok(TermEnd::Released | TermEnd::NotAcquired(_)) => return,
                // Lost: the gate closed when it was detected. Try again in a while.
                Ok(TermEnd::Lost(_)) | Err(_) => Timer::after_millis(500).await,
            }
        }
    }

    /// Stops "the pump" the moment the lease is lost (here: counts it).
    #[embassy_executor::task]
    async fn watcher() {
        loop {
            let _reason = LEASE.wait_lost().await;
            bump(&COUNTERS.lost_signals);
        }
    }
}

/// Baseline: the same link traffic by hand, no lease, unguarded writes.
#[cfg(not(feature = "lease"))]
mod lease {
    use core::sync::atomic::{AtomicU32, Ordering};

    use embassy_executor::Spawner;
    use embassy_time::Timer;
    use leasehold::{AcquireOutcome, Fence, Term};

    use crate::report::{bump, COUNTERS};
    use crate::{identity, spawn, KEY, LINK, OWNER, TTL};
    use leasehold_gateway::Op;

    static FENCE: AtomicU32 = AtomicU32::new(0);
    static RELEASE: AtomicU32 = AtomicU32::new(0);

    pub(crate) fn spawn_tasks(spawner: Spawner) {
        spawn(spawner, plain_task());
    }

    pub(crate) fn check() -> Option<Fence> {
        match FENCE.load(Ordering::Relaxed) {
            0 => None,
            fence => Some(Fence(u64::from(fence))),
        }
    }

    pub(crate) fn request_release() {
        RELEASE.store(1, Ordering::Relaxed);
    }

    #[embassy_executor::task]
    async fn plain_task() {
        let token = OWNER.token(Term(1));
        let mut held = Fence(0);
        if let AcquireOutcome::Granted { fence, .. } = LINK
            .call(KEY, token, Op::Acquire(TTL, identity()))
            .await
            .acquire()
        {
            FENCE.store(fence.0 as u32, Ordering::Relaxed);
            held = fence;
            bump(&COUNTERS.acquired);
        }
        while RELEASE.load(Ordering::Relaxed) == 0 {
            Timer::after_secs(1).await;
            LINK.call(KEY, token, Op::Renew(held, TTL)).await;
            bump(&COUNTERS.renewed);
        }
        FENCE.store(0, Ordering::Relaxed);
        LINK.call(KEY, token, Op::Release).await;
        bump(&COUNTERS.released);
    }
}
