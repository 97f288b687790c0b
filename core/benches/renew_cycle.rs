//! What a held lease costs its driver and its workers.
//!
//! * `renew_cycle`: one full renewal as a driver runs it — `poll_timeout` gives the
//!   renew instant, `handle_timeout` there, `poll_action` gives `Renew`,
//!   `handle_response(Renewed)`, `poll_event` gives `Renewed` (target ≤ 50 ns);
//! * `gate_check`: one `WriteGate::check` on a held gate, what every write pays;
//! * the sizes of `Lease` and `WriteGate` (targets ≤ 128 and ≤ 28 bytes), printed first.
//!
//! Run: `cargo bench -p leasehold --bench renew_cycle`.

use std::hint::black_box;
use std::mem::size_of;

use criterion::{criterion_group, Criterion};
use leasehold::{
    AcquireOutcome, Action, Config, Duration, Event, Fence, Handled, Instant, Lease, Owner,
    RenewOutcome, WriteGate,
};

/// A lease of T = 600 ms (renew every 200 ms), held with fence 7.
fn held(gate: &WriteGate) -> Lease {
    let config = Config::builder(Duration::from_millis(600)).build().unwrap();
    let mut lease = Lease::new(config, Owner([7; 16]));
    lease.acquire(Instant::ZERO, gate).unwrap();
    let id = lease.poll_action().unwrap().id();
    let granted = AcquireOutcome::Granted {
        fence: Fence(7),
        ttl: config.ttl(),
    };
    assert_eq!(
        lease.handle_response(Instant::from_millis(5), id, granted.into(), gate),
        Handled::Applied
    );
    assert!(matches!(lease.poll_event(), Some(Event::Acquired { .. })));
    lease
}

fn renew_cycle(c: &mut Criterion) {
    let gate = WriteGate::new();
    let mut lease = held(&gate);
    let renewed = RenewOutcome::Renewed {
        ttl: Duration::from_millis(600),
    };
    c.bench_function("renew_cycle", |b| {
        b.iter(|| {
            let at = lease.poll_timeout().unwrap();
            lease.handle_timeout(black_box(at), &gate);
            let Some(Action::Renew { id, .. }) = lease.poll_action() else {
                unreachable!("a renewal is due at {at}")
            };
            let answer = black_box(renewed);
            let handled = lease.handle_response(at, black_box(id), answer.into(), &gate);
            assert_eq!(handled, Handled::Applied);
            let Some(Event::Renewed { deadline, .. }) = lease.poll_event() else {
                unreachable!("the renewal was confirmed")
            };
            deadline
        })
    });
    assert_eq!(gate.check(lease.latest_instant()), Ok(Fence(7)));
}

fn gate_check(c: &mut Criterion) {
    let gate = WriteGate::new();
    let lease = held(&gate);
    let now = lease.latest_instant();
    c.bench_function("gate_check", |b| b.iter(|| gate.check(black_box(now))));
}

criterion_group!(benches, renew_cycle, gate_check);

fn main() {
    println!(
        "size_of::<Lease>()     = {:>3} bytes (target <= 128)",
        size_of::<Lease>()
    );
    println!(
        "size_of::<WriteGate>() = {:>3} bytes (target <= 28)",
        size_of::<WriteGate>()
    );
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
