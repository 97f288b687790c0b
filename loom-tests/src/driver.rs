//! A scripted driver for the real [`Lease`], plus what its gate may legally show.

use leasehold::{
    AcquireOutcome, Action, Config, ConfigBuilder, Duration, Fence, GateError, GateSnapshot,
    GateStatus, Handled, Instant, Lease, LossReason, Owner, RenewOutcome, RequestId, State, Term,
    WriteGate,
};

/// Fence of the first term. Both 32-bit halves differ from [`FENCE_B`]'s.
pub const FENCE_A: Fence = Fence(0x1_0000_0001);
/// Fence of the second term.
pub const FENCE_B: Fence = Fence(0x2_0000_0002);
/// Safe deadline of the first term's grant. Both halves differ from every other deadline.
pub const DEADLINE_A: Instant = Instant::from_micros(0x1_0000_0001);
/// Safe deadline of the second term's grant.
pub const DEADLINE_B: Instant = Instant::from_micros(0x2_0000_0002);
/// Safe deadline of the second term after its renewal.
pub const DEADLINE_B2: Instant = Instant::from_micros(0x3_0000_0003);

/// `ms` milliseconds after the clock's origin.
pub const fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

/// A 30 s lease with no drift allowance and no margin, so a grant's safe deadline is
/// exactly `sent + granted ttl` and the scripts can pick every deadline bit for bit.
///
/// Renewals follow the *granted* TTL (every `granted × renew_interval / ttl`), and the
/// scripts' grants are long (about 4,295 s and 8,590 s, see [`DEADLINE_A`]): a renew
/// interval of 30 ms per 30 s puts their renewals due 4.3 s and 8.6 s after the grant
/// was sent, before the instants at which the scripts renew (10 s after the first
/// grant; for the second, when the renewed deadline is one granted TTL away, as a
/// renewal counts for at most the TTL granted).
pub fn config() -> Config {
    builder().build().expect("a valid config")
}

/// [`config`]'s builder, for variations (e.g. fail-closed).
pub const fn builder() -> ConfigBuilder {
    Config::builder(Duration::from_secs(30))
        .renew_interval(Duration::from_millis(30))
        .margin(Duration::ZERO)
        .drift_ppm(0)
}

/// How the [`Driver`] ends a held term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A renewal answered "not owner".
    NotOwner,
    /// The safe deadline passed (`handle_timeout` at the deadline).
    Expired,
    /// An unprompted revocation of the held fence.
    Revoked,
    /// A renewal confirmed a deadline earlier than the held one.
    Shortened,
    /// The user released the lease.
    Released,
}

impl Ending {
    /// Every way a term can end.
    pub const ALL: [Ending; 5] = [
        Ending::NotOwner,
        Ending::Expired,
        Ending::Revoked,
        Ending::Shortened,
        Ending::Released,
    ];

    /// The gate status the ending publishes.
    pub const fn status(self) -> GateStatus {
        match self {
            Ending::NotOwner => GateStatus::Lost(LossReason::NotOwner),
            Ending::Expired => GateStatus::Lost(LossReason::Expired),
            Ending::Revoked => GateStatus::Lost(LossReason::Revoked),
            Ending::Shortened => GateStatus::Lost(LossReason::Shortened),
            Ending::Released => GateStatus::Released,
        }
    }

    /// What `check` must answer once the ending is published.
    pub const fn error(self) -> GateError {
        match self {
            Ending::NotOwner => GateError::Lost(LossReason::NotOwner),
            Ending::Expired => GateError::Lost(LossReason::Expired),
            Ending::Revoked => GateError::Lost(LossReason::Revoked),
            Ending::Shortened => GateError::Lost(LossReason::Shortened),
            Ending::Released => GateError::Released,
        }
    }

    /// The lease state right after the ending.
    pub const fn state(self) -> State {
        match self {
            Ending::NotOwner => State::Lost(LossReason::NotOwner),
            Ending::Expired => State::Lost(LossReason::Expired),
            Ending::Revoked => State::Lost(LossReason::Revoked),
            Ending::Shortened => State::Lost(LossReason::Shortened),
            Ending::Released => State::Releasing,
        }
    }

    /// When a term granted at 0 with safe deadline `deadline` ends this way: at the
    /// deadline for `Expired`, at the renewal time (10 s) otherwise.
    pub const fn time(self, deadline: Instant) -> Instant {
        match self {
            Ending::Expired => deadline,
            _ => at(10_000),
        }
    }
}

/// Drives the real [`Lease`] through scripted steps; every gate publish happens inside
/// a `Lease` call, as in production. Asserts the lease's state after each step (plain
/// data: loom does not see those checks).
#[derive(Debug)]
pub struct Driver {
    /// The lease; tests may also call it directly (e.g. to feed stale responses).
    pub lease: Lease,
    /// Send time of the newest acquire or renewal.
    sent: Instant,
}

impl Driver {
    /// A driver for a fresh lease with [`config`].
    pub fn new() -> Driver {
        Driver::with_config(config())
    }

    /// A driver for a fresh lease with `config`.
    pub fn with_config(config: Config) -> Driver {
        Driver {
            lease: Lease::new(config, Owner([1; 16])),
            sent: Instant::ZERO,
        }
    }

    /// Starts a new term (the gate closes for it); returns the acquire's id.
    pub fn acquire(&mut self, now: Instant, gate: &WriteGate) -> RequestId {
        self.lease.acquire(now, gate).expect("acquire allowed");
        self.sent = now;
        match self.lease.poll_action() {
            Some(Action::Acquire { id, .. }) => id,
            other => panic!("expected an acquire request, got {other:?}"),
        }
    }

    /// Answers acquire `id` with a grant of `fence` whose safe deadline is exactly
    /// `deadline` (the gate opens).
    pub fn grant(
        &mut self,
        now: Instant,
        id: RequestId,
        fence: Fence,
        deadline: Instant,
        gate: &WriteGate,
    ) {
        let granted = AcquireOutcome::Granted {
            fence,
            ttl: deadline - self.sent,
        };
        assert_eq!(
            self.lease.handle_response(now, id, granted.into(), gate),
            Handled::Applied,
            "grant accepted"
        );
        assert_eq!(self.lease.state(), State::Holding);
        assert_eq!(self.lease.deadline(), Some(deadline));
        self.drain_events();
    }

    /// [`acquire`](Self::acquire) then [`grant`](Self::grant), both at `now`.
    pub fn acquire_granted(
        &mut self,
        now: Instant,
        fence: Fence,
        deadline: Instant,
        gate: &WriteGate,
    ) {
        let id = self.acquire(now, gate);
        self.grant(now, id, fence, deadline, gate);
    }

    /// Fires the renewal timer at `now` (it must be due); returns the renewal's id.
    pub fn send_renewal(&mut self, now: Instant, gate: &WriteGate) -> RequestId {
        self.lease.handle_timeout(now, gate);
        self.sent = now;
        match self.lease.poll_action() {
            Some(Action::Renew { id, .. }) => id,
            other => panic!("expected a renewal request at {now}, got {other:?}"),
        }
    }

    /// Sends a renewal at `now` and confirms it with safe deadline `deadline`.
    pub fn renew(&mut self, now: Instant, deadline: Instant, gate: &WriteGate) {
        let id = self.send_renewal(now, gate);
        let renewed = RenewOutcome::Renewed {
            ttl: deadline - self.sent,
        };
        assert_eq!(
            self.lease.handle_response(now, id, renewed.into(), gate),
            Handled::Applied,
            "renewal accepted"
        );
        assert_eq!(self.lease.state(), State::Holding);
        assert_eq!(self.lease.deadline(), Some(deadline));
        self.drain_events();
    }

    /// Ends the held term `ending`'s way at `now` (for `Expired`, `now` must be at or
    /// past the safe deadline).
    pub fn end(&mut self, ending: Ending, now: Instant, gate: &WriteGate) {
        match ending {
            Ending::NotOwner => {
                let id = self.send_renewal(now, gate);
                assert_eq!(
                    self.lease
                        .handle_response(now, id, RenewOutcome::NotOwner.into(), gate),
                    Handled::Applied,
                    "renewal answer accepted"
                );
            }
            Ending::Expired => self.lease.handle_timeout(now, gate),
            Ending::Revoked => {
                let fence = self.lease.fence().expect("revoked while held");
                assert_eq!(
                    self.lease.handle_revoked(now, fence, gate),
                    Handled::Applied,
                    "revocation accepted"
                );
            }
            Ending::Shortened => {
                let id = self.send_renewal(now, gate);
                let shorter = RenewOutcome::Renewed {
                    ttl: Duration::from_millis(1),
                };
                assert_eq!(
                    self.lease.handle_response(now, id, shorter.into(), gate),
                    Handled::Applied,
                    "renewal answer accepted"
                );
            }
            Ending::Released => self.lease.release(now, gate).expect("release allowed"),
        }
        assert_eq!(self.lease.state(), ending.state(), "after {ending:?}");
        self.drain_events();
    }

    fn drain_events(&mut self) {
        while self.lease.poll_event().is_some() {}
    }
}

impl Default for Driver {
    fn default() -> Driver {
        Driver::new()
    }
}

/// A gate snapshot, spelled out.
pub const fn published(
    status: GateStatus,
    term: u32,
    fence: Fence,
    deadline: Instant,
) -> GateSnapshot {
    GateSnapshot {
        status,
        term: Term(term),
        fence,
        deadline,
    }
}

/// What a fresh gate shows.
pub const INITIAL: GateSnapshot = published(GateStatus::Closed, 0, Fence(0), Instant::ZERO);

/// Panics (with "torn or mixed gate snapshot") unless `seen` is one of the snapshots
/// the driver really published.
#[track_caller]
pub fn assert_published(seen: GateSnapshot, published: &[GateSnapshot]) {
    assert!(
        published.contains(&seen),
        "torn or mixed gate snapshot: {seen:?} was never published; published: {published:#?}"
    );
}

/// What `check(now)` answers for a consistent snapshot: the specification, restated.
pub fn check_of(snap: &GateSnapshot, now: Instant) -> Result<Fence, GateError> {
    match snap.status {
        GateStatus::Held if now < snap.deadline => Ok(snap.fence),
        GateStatus::Held => Err(GateError::DeadlinePassed {
            deadline: snap.deadline,
        }),
        GateStatus::Closed => Err(GateError::NotHeld),
        GateStatus::Paused => Err(GateError::Paused),
        GateStatus::Released => Err(GateError::Released),
        GateStatus::Lost(reason) => Err(GateError::Lost(reason)),
    }
}

/// Panics (with "torn or mixed gate check") unless `result` is what `check(now)`
/// answers for one of the published snapshots, or the safe refusal `Busy`.
#[track_caller]
pub fn assert_check_published(
    result: Result<Fence, GateError>,
    now: Instant,
    published: &[GateSnapshot],
) {
    let legal =
        result == Err(GateError::Busy) || published.iter().any(|s| check_of(s, now) == result);
    assert!(
        legal,
        "torn or mixed gate check at {now}: {result:?} matches no published snapshot; published: {published:#?}"
    );
}
