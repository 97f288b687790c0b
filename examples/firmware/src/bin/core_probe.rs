//! Calls every method of the lease core — `Lease`, `WriteGate`, `FenceGate`, `Config`,
//! `Budget`, `OwnerToken::encode`, `check_key`, `Identity` — with inputs the optimiser cannot see, in any order,
//! forever. Nothing else: no executor, no time driver, no formatting.
//!
//! `scripts/firmware-size.sh` builds it twice: with the `lease` feature (the calls) and
//! without (only the opaque inputs); the difference in `.text` is the flash the core
//! costs a firmware that uses all of it. It does so with `probe-baseline-builtins`
//! (both variants link the compiler-builtins routines the firmware links without the
//! lease, which the core is then not charged for) and, for comparison, without. With
//! `panic-check` it links only if no panic path is left in the core. It also carries,
//! in `.bss`, one array per type whose symbol size is that type's `size_of` on this
//! target (read with `nm -S`).
#![no_std]
#![no_main]

#[path = "../panic.rs"]
mod panic;

use core::hint::black_box;
use core::mem::{size_of, MaybeUninit};

use leasehold::{Lease, WriteGate};

// Their symbol sizes are the measurement. In cortex-m-rt's `.uninit` (RAM, never
// initialised, no flash image) and in both variants, so the flash difference is the
// core's code alone. (`no_mangle` keeps the names readable for nm.)
#[used]
#[no_mangle]
#[link_section = ".uninit.leasehold_size_of_lease"]
static LEASEHOLD_SIZE_OF_LEASE: MaybeUninit<[u8; size_of::<Lease>()]> = MaybeUninit::uninit();
#[used]
#[no_mangle]
#[link_section = ".uninit.leasehold_size_of_write_gate"]
static LEASEHOLD_SIZE_OF_WRITE_GATE: MaybeUninit<[u8; size_of::<WriteGate>()]> =
    MaybeUninit::uninit();

/// A value the optimiser cannot predict.
///
/// Out of line: the core probe takes some 25 inputs, and `black_box` inlined at each
/// (a store and a load through the stack) would charge the core for the harness.
#[inline(never)]
fn input() -> u64 {
    black_box(0)
}

/// A small value the optimiser cannot predict (selects an input kind with a mask, not
/// a division, so that the harness adds as little code as possible).
#[cfg(feature = "lease")]
#[inline(never)]
fn choice() -> u32 {
    black_box(0)
}

/// Calls the compiler-builtins routines that the firmware links without the lease:
/// `memcpy` and its word-aligned forms `__aeabi_memcpy4`/`8`, the word-aligned zero
/// fill `__aeabi_memclr4` (the baseline moves and clears link frames that carry a
/// holder's identity), and on thumbv6m, which has no 32×32→64 multiply, the 64-bit multiply
/// `__aeabi_lmul`. Not 32-bit division (a library routine on thumbv6m): the firmware
/// without the lease divides nowhere, so the core is charged for the division it needs. With
/// `probe-baseline-builtins` both variants call it, so the difference leaves them out;
/// `scripts/firmware-size.sh` fails if the baseline firmware stops linking one of them.
#[cfg(feature = "probe-baseline-builtins")]
#[inline(never)]
fn link_baseline_builtins() {
    // Copies too large to inline (LLVM calls `memcpy`, `memcpy4`, `memcpy8` by the
    // alignment it knows), not `copy_from_slice`: that one's length check would be a
    // panic path of the probe's own, shared with the core's (inlined, checked-away)
    // `copy_from_slice` once it is out of line.
    let src: &[u8; 256] = black_box(&[0; 256]);
    let copy: [u8; 256] = *src;
    black_box(&copy);
    let src: &[u32; 64] = black_box(&[0; 64]);
    let copy: [u32; 64] = *src;
    black_box(&copy);
    let src: &[u64; 32] = black_box(&[0; 32]);
    let copy: [u64; 32] = *src;
    black_box(&copy);
    // A zero fill too large to inline, of a word-aligned buffer (`mut`, so that it is
    // not promoted to a constant): `memclr4`.
    let mut zeroed = [0u32; 64];
    black_box(&mut zeroed);
    black_box(black_box(1u64).wrapping_mul(black_box(1)));
}

#[cortex_m_rt::entry]
fn main() -> ! {
    #[cfg(feature = "probe-baseline-builtins")]
    link_baseline_builtins();
    #[cfg(all(feature = "lease", feature = "probe-driver"))]
    driver_probe::run();
    #[cfg(all(feature = "lease", not(feature = "probe-driver")))]
    probe::run();
    #[cfg(not(feature = "lease"))]
    loop {
        black_box(input());
    }
}

#[cfg(all(feature = "lease", not(feature = "probe-driver")))]
mod probe {
    use core::hint::black_box;

    use leasehold::{
        check_key, AcquireOutcome, Budget, Config, Duration, Fence, FenceGate, Holder, Identity,
        Indeterminate, Instant, Lease, Owner, Refusal, ReleaseOutcome, RenewOutcome, RequestId,
        Response, Term, WriteGate,
    };

    use super::{choice, input};

    static GATE: WriteGate = WriteGate::new();

    const FALLBACK: Config = match Config::builder(Duration::from_secs(3)).build() {
        Ok(config) => config,
        Err(_) => panic!("invalid fallback config"),
    };

    fn duration() -> Duration {
        Duration::from_micros(input())
    }

    fn config() -> Config {
        let built = Config::builder(duration())
            .renew_interval(duration())
            .request_timeout(duration())
            .retry_interval(duration())
            .margin(duration())
            .drift_ppm(input() as u32)
            .fail_closed(input() & 1 == 1)
            .build();
        match built {
            Ok(config) => config,
            Err(error) => {
                black_box(error);
                FALLBACK
            }
        }
    }

    fn why() -> Indeterminate {
        match choice() & 3 {
            0 => Indeterminate::Timeout,
            1 => Indeterminate::Transport,
            2 => Indeterminate::Protocol,
            _ => Indeterminate::Service,
        }
    }

    fn refusal() -> Refusal {
        match choice() & 3 {
            0 => Refusal::InvalidKey,
            1 => Refusal::WrongType,
            2 => Refusal::Unauthorized,
            _ => Refusal::Unsupported,
        }
    }

    /// Text the optimiser cannot see: a key or an identity to check.
    fn text() -> &'static str {
        black_box("pump-7")
    }

    pub fn run() -> ! {
        let mut lease = Lease::new(config(), Owner(black_box([0x5a; 16])));
        let mut storage = FenceGate::starting_at(Fence(input()));
        loop {
            let now = Instant::from_micros(input());
            let id = RequestId(input());
            let fence = Fence(input());
            let ttl = duration();
            match choice() & 7 {
                0 => {
                    let give_up_at = Instant::from_micros(input());
                    let _ = black_box(lease.acquire_until(now, give_up_at, &GATE));
                }
                1 => {
                    let _ = black_box(lease.release(now, &GATE));
                }
                2 => lease.handle_timeout(now, &GATE),
                3 => {
                    let response = Response::Acquire(match choice() & 3 {
                        0 => AcquireOutcome::Granted { fence, ttl },
                        1 => AcquireOutcome::HeldByAnother(Holder {
                            identity: Identity::EMPTY,
                            fence,
                            remaining: ttl,
                        }),
                        2 => AcquireOutcome::Refused(refusal()),
                        _ => AcquireOutcome::Indeterminate(why()),
                    });
                    let _ = black_box(lease.handle_response(now, id, response, &GATE));
                }
                4 => {
                    let response = Response::Renew(match choice() & 3 {
                        0 => RenewOutcome::Renewed { ttl },
                        1 => RenewOutcome::NotOwner,
                        2 => RenewOutcome::Refused(refusal()),
                        _ => RenewOutcome::Indeterminate(why()),
                    });
                    let _ = black_box(lease.handle_response(now, id, response, &GATE));
                }
                5 => {
                    let response = Response::Release(match choice() & 3 {
                        0 => ReleaseOutcome::Released,
                        1 => ReleaseOutcome::NotOwner,
                        2 => ReleaseOutcome::Refused(refusal()),
                        _ => ReleaseOutcome::Indeterminate(why()),
                    });
                    let _ = black_box(lease.handle_response(now, id, response, &GATE));
                }
                6 => {
                    let _ = black_box(lease.handle_revoked(now, fence, &GATE));
                }
                _ => {
                    black_box((lease.state(), lease.term(), lease.fence(), lease.deadline()));
                    black_box((lease.writes_paused(), lease.latest_instant(), lease.stats()));
                    black_box((lease.is_awaiting(id), lease.config().ttl(), lease.turn()));
                    black_box((lease.granted_ttl(), lease.config().accepts_grant(ttl)));
                    let _ = black_box(check_key(text()));
                    let _ = black_box(Identity::new(text()));
                    black_box(Identity::lossy(text()).as_str());
                    black_box(Identity::lossy_utf8(text().as_bytes()).as_bytes());
                    let budget = Budget {
                        work_p99: duration(),
                        renew_rtt_p99: duration(),
                        pause_budget: duration(),
                        margin: duration(),
                    };
                    let _ = black_box(budget.check(ttl));
                    let owner = Owner(black_box([0x5a; 16]));
                    black_box(owner.token(Term(choice())).encode().as_bytes());
                }
            }
            while let Some(action) = lease.poll_action() {
                let _ = black_box(action);
            }
            while let Some(event) = lease.poll_event() {
                let _ = black_box(event);
            }
            black_box(lease.poll_timeout());
            let _ = black_box(GATE.check(now));
            black_box(GATE.snapshot());
            let _ = black_box(storage.admit(fence));
        }
    }
}

/// The shared driver loop (`leasehold_driver::run_term`) polled by hand with a clock,
/// a service and a release trigger whose futures are ready at once with opaque values:
/// the driver's own code and nothing else (no executor, no embassy-time).
#[cfg(all(feature = "lease", feature = "probe-driver"))]
mod driver_probe {
    use core::future::{poll_fn, Future};
    use core::hint::black_box;
    use core::pin::pin;
    use core::task::{Context, Poll, Waker};

    // The outcome types are the ready-made service's; the RESP probe does without it.
    #[cfg_attr(feature = "probe-resp", allow(unused_imports))]
    use leasehold::{
        AcquireOutcome, Config, Duration, Fence, Holder, HolderOutcome, Identity, Indeterminate,
        Instant, Lease, Owner, OwnerToken, ReleaseOutcome, RenewOutcome, WriteGate,
    };
    #[cfg_attr(feature = "probe-resp", allow(unused_imports))]
    use leasehold_embassy::leasehold_driver::{run_term, Clock, LocalLockService, Target};

    use super::{choice, input};

    static GATE: WriteGate = WriteGate::new();

    const CONFIG: Config = match Config::builder(Duration::from_secs(3)).build() {
        Ok(config) => config,
        Err(_) => panic!("invalid config"),
    };

    /// Ready at once with `value`, however often it is polled (`core::future::Ready`
    /// would add a "polled after completion" panic of its own to the measurement).
    fn ready<T: Copy>(value: T) -> impl Future<Output = T> {
        poll_fn(move |_| Poll::Ready(value))
    }

    struct OpaqueClock;

    impl Clock for OpaqueClock {
        fn now(&self) -> Instant {
            Instant::from_micros(input())
        }
        fn sleep_until(&self, _deadline: Instant) -> impl Future<Output = ()> {
            ready(())
        }
    }

    #[cfg(not(feature = "probe-resp"))]
    struct OpaqueService;

    #[cfg(not(feature = "probe-resp"))]
    fn why() -> Indeterminate {
        if choice() & 1 == 0 {
            Indeterminate::Timeout
        } else {
            Indeterminate::Transport
        }
    }

    #[cfg(not(feature = "probe-resp"))]
    impl LocalLockService for OpaqueService {
        fn acquire(
            &self,
            _: &str,
            _: OwnerToken,
            _: &Identity,
            ttl: Duration,
        ) -> impl Future<Output = AcquireOutcome> {
            ready(match choice() & 3 {
                0 => AcquireOutcome::Granted {
                    fence: Fence(input()),
                    ttl,
                },
                1 => AcquireOutcome::HeldByAnother(Holder {
                    identity: Identity::EMPTY,
                    fence: Fence(input()),
                    remaining: ttl,
                }),
                _ => AcquireOutcome::Indeterminate(why()),
            })
        }
        fn renew(
            &self,
            _: &str,
            _: OwnerToken,
            _: Fence,
            ttl: Duration,
        ) -> impl Future<Output = RenewOutcome> {
            ready(match choice() & 3 {
                0 => RenewOutcome::Renewed { ttl },
                1 => RenewOutcome::NotOwner,
                _ => RenewOutcome::Indeterminate(why()),
            })
        }
        fn release(&self, _: &str, _: OwnerToken) -> impl Future<Output = ReleaseOutcome> {
            ready(ReleaseOutcome::Released)
        }
        fn holder(&self, _: &str) -> impl Future<Output = HolderOutcome> {
            ready(HolderOutcome::Free)
        }
    }

    /// A stream whose reads and writes move as many bytes as an opaque input says
    /// (reads fill the buffer with opaque bytes), and fail when it says so.
    #[cfg(feature = "probe-resp")]
    #[derive(Clone, Copy)]
    pub struct OpaqueStream;

    #[cfg(feature = "probe-resp")]
    mod stream {
        use core::hint::black_box;

        use embedded_io_async::{ErrorKind, ErrorType, Read, Write};

        use super::{choice, input, OpaqueStream};

        impl ErrorType for OpaqueStream {
            type Error = ErrorKind;
        }

        fn count(len: usize) -> Result<usize, ErrorKind> {
            match choice() {
                0 => Err(ErrorKind::Other),
                _ => Ok((input() as usize).min(len)),
            }
        }

        impl Read for OpaqueStream {
            async fn read(&mut self, buf: &mut [u8]) -> Result<usize, ErrorKind> {
                for byte in buf.iter_mut() {
                    *byte = input() as u8;
                }
                count(buf.len())
            }
        }

        impl Write for OpaqueStream {
            async fn write(&mut self, buf: &[u8]) -> Result<usize, ErrorKind> {
                black_box(buf);
                count(buf.len())
            }
            async fn flush(&mut self) -> Result<(), ErrorKind> {
                count(0).map(|_| ())
            }
        }
    }

    /// A connection factory that connects at once (or fails, opaquely).
    #[cfg(feature = "probe-resp")]
    pub struct OpaqueConnect;

    #[cfg(feature = "probe-resp")]
    impl leasehold_resp::Connect for OpaqueConnect {
        type Connection = OpaqueStream;
        type Error = ();
        fn connect(&mut self) -> impl Future<Output = Result<OpaqueStream, ()>> {
            ready(match choice() {
                0 => Err(()),
                _ => Ok(OpaqueStream),
            })
        }
    }

    /// The RESP service with its default buffers, over a zero-sized stream.
    #[cfg(feature = "probe-resp")]
    type Resp = leasehold_resp::RespLockService<'static, OpaqueConnect, OpaqueClock>;

    // Its symbol size is `size_of::<Resp>()`, as for the core's types above.
    #[cfg(feature = "probe-resp")]
    #[used]
    #[no_mangle]
    #[link_section = ".uninit.leasehold_size_of_resp"]
    static LEASEHOLD_SIZE_OF_RESP: core::mem::MaybeUninit<[u8; core::mem::size_of::<Resp>()]> =
        core::mem::MaybeUninit::uninit();

    pub fn run() -> ! {
        let owner = Owner([1; 16]);
        let mut lease = Lease::new(CONFIG, owner);
        #[cfg(not(feature = "probe-resp"))]
        let service = &OpaqueService;
        #[cfg(feature = "probe-resp")]
        let service = &Resp::new(OpaqueConnect, OpaqueClock);
        let target = Target {
            service,
            key: "k",
            owner,
            identity: &Identity::EMPTY,
        };
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let release = core::future::poll_fn(|_| {
                if choice() == 0 {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            let give_up_at = Instant::from_micros(input());
            let term = run_term(
                &mut lease,
                &GATE,
                target,
                &OpaqueClock,
                give_up_at,
                release,
                |report| {
                    let _ = black_box(report);
                },
            );
            let mut term = pin!(term);
            while term.as_mut().poll(&mut cx).is_pending() {}
        }
    }
}
