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
#![no_std]
#![no_main]

// The baseline (no `lease` feature) neither asks who holds the key nor reads answers
// other than the acquire's.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
mod gateway;
mod link;
mod panic;
mod report;
mod time_driver;

use core::cell::Cell;

use critical_section::Mutex;
use embassy_executor::{SpawnError, SpawnToken, Spawner};
use embassy_time::Timer;
use leasehold::{Duration, Fence, FenceGate, Identity, Owner};

use crate::link::Link;
use crate::report::{bump, COUNTERS};

/// The link to the gateway (the lock service).
static LINK: Link = Link::new();

/// The storage the pump writes go to, guarded by fences (storage side).
static STORAGE: Mutex<Cell<FenceGate>> = Mutex::new(Cell::new(FenceGate::new()));

/// The device's owner identity: caller-supplied on bare metal (e.g. the chip's serial
/// number), 16 bytes.
const OWNER: Owner = Owner(*b"pump-controller7");

const TTL: Duration = Duration::from_secs(3);

/// The lease's key at the gateway.
const KEY: &str = "pump-7";

/// Who we are, in words: stored by the gateway with the grant, shown to contenders.
fn identity() -> Identity {
    Identity::new("pump-controller7").unwrap_or_default()
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    if let Some(peripherals) = cortex_m::Peripherals::take() {
        time_driver::start(peripherals.SYST);
    }
    spawn(spawner, link::gateway());
    spawn(spawner, writer());
    spawn(spawner, app());
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
    loop {
        Timer::after_millis(100).await;
        setpoint = setpoint.wrapping_add(1);
        match lease::check() {
            Some(fence) => store(fence, setpoint),
            None => bump(&COUNTERS.writes_refused),
        }
    }
}

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

    use crate::report::{bump, COUNTERS};
    use crate::{identity, spawn, KEY, LINK, OWNER, TTL};

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

    pub(crate) fn request_release() {
        LEASE.request_release();
    }

    #[embassy_executor::task]
    async fn lease_task() {
        let mut lease = Lease::new(CONFIG);
        let identity = identity();
        let target = Target {
            service: &LINK,
            key: KEY,
            owner: OWNER,
            identity: &identity,
        };
        loop {
            // Wait for the key as long as it takes (`Instant::MAX`): the pump has
            // nothing else to do.
            let end =
                leasehold_embassy::run_term(&mut lease, &LEASE, target, Instant::MAX, |report| {
                    bump(match report {
                        Report::Event(Event::Acquired { .. }) => &COUNTERS.acquired,
                        Report::Event(Event::Renewed { .. }) => &COUNTERS.renewed,
                        Report::Event(Event::Lost { .. }) => &COUNTERS.lost,
                        Report::Event(Event::Released) => &COUNTERS.released,
                        _ => &COUNTERS.other_events,
                    })
                })
                .await;
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

    use crate::gateway::Op;
    use crate::report::{bump, COUNTERS};
    use crate::{identity, spawn, KEY, LINK, OWNER, TTL};

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
