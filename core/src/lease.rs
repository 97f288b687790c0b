//! The lease state machine.

use core::fmt;

use crate::{
    AcquireOutcome, Config, Duration, Fence, Indeterminate, Instant, LossReason, ReleaseOutcome,
    RenewOutcome, RequestId, Term, WriteGate,
};

/// A lease on one key: a pure state machine, driven by instants and events.
///
/// `Lease` never reads a clock, never does I/O and never allocates; it is a plain
/// value of at most 128 bytes. Its only side effect is publishing to the
/// [`WriteGate`] passed to each call, and it publishes *before* returning, so a loss is
/// visible to every worker before any output of that step can be acted on.
///
/// # Driving contract
///
/// The methods come in four kinds:
///
/// * **getters** ([`state`](Self::state), [`fence`](Self::fence),
///   [`deadline`](Self::deadline), [`term`](Self::term), [`stats`](Self::stats)…)
///   only read;
/// * **user commands** [`acquire`](Self::acquire) and [`release`](Self::release) start
///   and end a term;
/// * **inputs** `handle_*` feed in what happened: a response to a request, an
///   unsolicited revocation, or time passing ([`handle_timeout`](Self::handle_timeout));
/// * **outputs** `poll_*` hand out what to do: [`poll_action`](Self::poll_action) a
///   request to send, [`poll_event`](Self::poll_event) a notification,
///   [`poll_timeout`](Self::poll_timeout) when to call `handle_timeout` next.
///
/// After **every** command or input, drain the outputs until none is left: `poll_action`
/// until `None` (send each request, tagging its answer with the request's
/// [`RequestId`]), `poll_event` until `None`, then re-arm a timer for `poll_timeout`.
/// Each call produces at most one action and one event, so a driver that drains after
/// every call loses nothing; one that does not sees only the newest (counted in
/// [`Stats::overwritten_events`]).
///
/// Every call takes `now` from one monotonic clock. Time only moves forward: a `now`
/// earlier than one already seen is treated as that one. `poll_timeout` is a soft
/// deadline: calling `handle_timeout` early, late or twice is harmless. Answers to
/// requests the lease no longer waits for (old ids, previous terms, duplicates) are
/// refused with [`StaleResponse`] and change nothing.
///
/// Use one `WriteGate` per `Lease`, and always the same one: the lease is its only writer.
///
/// ```
/// use leasehold::*;
///
/// let gate = WriteGate::new();
/// let config = Config::builder(Duration::from_secs(3)).build().unwrap();
/// let mut lease = Lease::new(config);
/// let t = Instant::from_millis;
///
/// lease.acquire(t(0), &gate).unwrap();
/// let Some(Action::Acquire { id, .. }) = lease.poll_action() else { unreachable!() };
/// // ...send it; the service grants fence 7 for 3 s; the answer arrives at 20 ms:
/// let granted = AcquireOutcome::Granted { fence: Fence(7), ttl: Duration::from_secs(3) };
/// lease.handle_acquire_response(t(20), id, granted, &gate).unwrap();
/// assert!(matches!(lease.poll_event(), Some(Event::Acquired { fence: Fence(7), .. })));
/// assert_eq!(gate.check(t(21)), Ok(Fence(7)));
///
/// // The renewal is due at T/3 after the acquire was *sent*.
/// assert_eq!(lease.poll_timeout(), Some(t(1_000)));
/// lease.handle_timeout(t(1_000), &gate);
/// assert!(matches!(lease.poll_action(), Some(Action::Renew { .. })));
/// ```
#[derive(Clone, Debug)]
pub struct Lease {
    // Field order matters for code size: `new` stores the fields in this order, LLVM
    // merges consecutive zero stores into one memset, and a memset of more than 16
    // bytes is a call to compiler-builtins' `memclr` (174 B on thumbv7em) that the rest
    // of a firmware may not link. `next_send` (MAX) and `state` (Idle) are not zero:
    // they split the zeroed fields into short runs.
    config: Config,
    /// Latest `now` seen; earlier ones are clamped to it.
    latest: Instant,
    /// The safe deadline while the lease is held.
    deadline: Instant,
    /// When to send the next acquire or renewal; `Instant::MAX` for never.
    next_send: Instant,
    /// Send time of the request in flight (its timeout is `sent_at + request_timeout`).
    sent_at: Instant,
    /// Id of the newest request; the one in flight, if any.
    last_id: u64,
    term: Term,
    state: State,
    fence: Fence,
    stats: Stats,
    in_flight: Option<RequestKind>,
    /// `in_flight` has not been handed out by `poll_action` yet.
    action_pending: bool,
    /// Fail-closed: the gate is paused until a renewal is confirmed.
    paused: bool,
    event: Option<EventKind>,
}

/// Where a [`Lease`] is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum State {
    /// Never acquired.
    Idle,
    /// An acquire is in flight or will be retried.
    Acquiring,
    /// Held, no renewal outstanding.
    Holding,
    /// Held, a renewal is in flight or failed indeterminately and will be retried.
    RenewPending,
    /// The term ended in loss; writes stopped.
    Lost(LossReason),
    /// The user released; the release request is in flight (writes already stopped).
    Releasing,
    /// The term ended by release.
    Released,
}

/// A request for the driver to send to the lock service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "an action must be sent to the lock service"]
pub enum Action {
    /// Acquire the key for `ttl` with the owner token of `term`.
    Acquire {
        /// Tag the answer with this.
        id: RequestId,
        /// The term whose owner token to present.
        term: Term,
        /// The TTL to ask for.
        ttl: Duration,
    },
    /// Extend the key by `ttl` if the owner token of `term` still holds it *with this
    /// fence*.
    ///
    /// Comparing the fence too tells two grants of the same owner token apart: if the
    /// key was deleted and a late duplicate of this term's acquire re-created it, the
    /// service holds a newer fence for the same token, and extending that one would
    /// keep alive a lease this client cannot write with.
    Renew {
        /// Tag the answer with this.
        id: RequestId,
        /// The term whose owner token to present.
        term: Term,
        /// The fence of the grant being extended.
        fence: Fence,
        /// The TTL to ask for.
        ttl: Duration,
    },
    /// Delete the key if the owner token of `term` still holds it. Best effort: writes
    /// stopped already, and nothing waits for the answer but `Released`.
    Release {
        /// Tag the answer with this.
        id: RequestId,
        /// The term whose owner token to present.
        term: Term,
    },
}

/// A notification for the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "events report lease changes the application may need to act on"]
#[non_exhaustive]
pub enum Event {
    /// The lease was granted; writes may start.
    Acquired {
        /// The term that began.
        term: Term,
        /// Present it with every write.
        fence: Fence,
        /// Writes are allowed until then, unless renewed.
        deadline: Instant,
    },
    /// An acquire attempt failed; another is scheduled.
    AcquireFailed {
        /// Why.
        reason: AcquireFailure,
        /// When the next attempt is sent.
        retry_at: Instant,
    },
    /// A renewal was confirmed.
    Renewed {
        /// The new safe deadline.
        deadline: Instant,
    },
    /// A renewal's outcome is unknown; the lease is still held until its deadline.
    RenewFailed {
        /// Why.
        reason: Indeterminate,
        /// When the next attempt is sent, if one fits before the deadline.
        retry_at: Option<Instant>,
        /// The unchanged safe deadline.
        deadline: Instant,
        /// Whether writes are paused (fail-closed mode).
        writes_paused: bool,
    },
    /// The term ended in loss. The gate was closed before this was emitted.
    Lost {
        /// Why.
        reason: LossReason,
    },
    /// The term ended by release.
    Released,
}

/// Why an acquire attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AcquireFailure {
    /// Somebody else holds the key.
    HeldByAnother,
    /// The outcome is unknown.
    Indeterminate(Indeterminate),
}

/// Counters for things a driver may want to log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stats {
    /// Responses and notices refused as stale (see [`StaleResponse`]).
    pub stale_responses: u32,
    /// Events replaced before `poll_event` took them (the driver did not drain).
    pub overwritten_events: u32,
}

/// A response or notice this lease is not waiting for: an unknown or old request id,
/// a duplicate, the wrong kind of answer, or a previous term. It was ignored and
/// counted; it changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StaleResponse;

/// [`Lease::acquire`] was called while a term is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AlreadyActive {
    /// The state the lease was in.
    pub state: State,
}

/// [`Lease::release`] was called with no term to release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NotActive {
    /// The state the lease was in.
    pub state: State,
}

impl fmt::Display for StaleResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stale response: not the request this lease is waiting for")
    }
}
impl core::error::Error for StaleResponse {}

impl fmt::Display for AlreadyActive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot acquire: the lease is {:?}", self.state)
    }
}
impl core::error::Error for AlreadyActive {}

impl fmt::Display for NotActive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nothing to release: the lease is {:?}", self.state)
    }
}
impl core::error::Error for NotActive {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RequestKind {
    Acquire,
    Renew,
    Release,
}

/// An event waiting for `poll_event`; its data that the lease still knows is filled
/// in when polled, which keeps the lease small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventKind {
    Acquired,
    AcquireFailed(AcquireFailure),
    Renewed,
    RenewFailed(Indeterminate),
    Lost(LossReason),
    Released,
}

impl Action {
    /// The id the answer must carry.
    pub const fn id(&self) -> RequestId {
        match *self {
            Action::Acquire { id, .. } | Action::Renew { id, .. } | Action::Release { id, .. } => {
                id
            }
        }
    }
    /// The term whose owner token the request presents.
    pub const fn term(&self) -> Term {
        match *self {
            Action::Acquire { term, .. }
            | Action::Renew { term, .. }
            | Action::Release { term, .. } => term,
        }
    }
}

impl Lease {
    /// A lease that has not been acquired yet.
    pub const fn new(config: Config) -> Lease {
        Lease {
            config,
            latest: Instant::ZERO,
            deadline: Instant::ZERO,
            next_send: Instant::MAX,
            sent_at: Instant::ZERO,
            last_id: 0,
            term: Term(0),
            state: State::Idle,
            fence: Fence(0),
            stats: Stats {
                stale_responses: 0,
                overwritten_events: 0,
            },
            in_flight: None,
            action_pending: false,
            paused: false,
            event: None,
        }
    }

    // ----- getters -----

    /// Where the lease is in its life.
    pub const fn state(&self) -> State {
        self.state
    }
    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }
    /// The current term (0 before the first acquire).
    pub const fn term(&self) -> Term {
        self.term
    }
    /// The fence while the lease is held.
    pub const fn fence(&self) -> Option<Fence> {
        match self.state {
            State::Holding | State::RenewPending => Some(self.fence),
            _ => None,
        }
    }
    /// The safe deadline while the lease is held.
    pub const fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Holding | State::RenewPending => Some(self.deadline),
            _ => None,
        }
    }
    /// Whether writes are paused (fail-closed mode, renewal outcome unknown).
    pub const fn writes_paused(&self) -> bool {
        self.paused
    }
    /// The latest `now` this lease has seen.
    pub const fn now(&self) -> Instant {
        self.latest
    }
    /// Counters.
    pub const fn stats(&self) -> Stats {
        self.stats
    }
    /// Whether the lease still waits for the answer to request `id`. A driver drops the
    /// I/O of a request the lease gave up on (timed out, superseded, term over).
    pub const fn is_awaiting(&self, id: RequestId) -> bool {
        self.in_flight.is_some() && id.0 == self.last_id
    }

    // ----- user commands -----

    /// Starts a new term: closes the gate for it and asks for an acquire.
    ///
    /// Allowed when idle, lost, released or releasing (an old release still in flight
    /// presents the old term's owner token, so it cannot delete the new grant).
    pub fn acquire(&mut self, now: Instant, gate: &WriteGate) -> Result<(), AlreadyActive> {
        let now = self.advance(now);
        match self.state {
            State::Idle | State::Lost(_) | State::Released | State::Releasing => {}
            state @ (State::Acquiring | State::Holding | State::RenewPending) => {
                return Err(AlreadyActive { state })
            }
        }
        self.term = Term(self.term.0.wrapping_add(1));
        self.fence = Fence(0);
        self.paused = false;
        gate.publish_closed(self.term);
        self.state = State::Acquiring;
        self.send(RequestKind::Acquire, now);
        Ok(())
    }

    /// Ends the term politely: the gate closes first, then a release is requested.
    ///
    /// The term ends in `Released` whatever the release's outcome, at the latest one
    /// request timeout later. While an acquire is in flight (it may have been granted)
    /// a release is sent too; otherwise an acquiring lease is released at once.
    pub fn release(&mut self, now: Instant, gate: &WriteGate) -> Result<(), NotActive> {
        let now = self.advance(now);
        match self.state {
            State::Acquiring | State::Holding | State::RenewPending => {}
            State::Releasing => return Ok(()),
            state @ (State::Idle | State::Lost(_) | State::Released) => {
                return Err(NotActive { state })
            }
        }
        gate.publish_released(self.term, self.fence);
        self.paused = false;
        if self.state == State::Acquiring && self.in_flight != Some(RequestKind::Acquire) {
            // No acquire in flight: nothing can have been granted, nothing to delete.
            self.finish_release();
        } else {
            self.state = State::Releasing;
            self.send(RequestKind::Release, now);
        }
        Ok(())
    }

    // ----- inputs -----

    /// Time passed: fires whatever is due — the safe deadline, a request timeout, a
    /// renewal or retry. Harmless when nothing is due.
    pub fn handle_timeout(&mut self, now: Instant, gate: &WriteGate) {
        let now = self.advance(now);
        if self.expire_if_due(now, gate) {
            return;
        }
        // `Instant::MAX` means "never" here as in `poll_timeout`, even at `now == MAX`:
        // a timer that saturated there must not fire on every call.
        let due = |at: Instant| at != Instant::MAX && now >= at;
        if let Some(kind) = self.in_flight {
            if due(self.sent_at.saturating_add(self.config.request_timeout())) {
                self.in_flight = None;
                self.action_pending = false;
                match kind {
                    RequestKind::Acquire => self
                        .acquire_failed(now, AcquireFailure::Indeterminate(Indeterminate::Timeout)),
                    RequestKind::Renew => {
                        self.renew_indeterminate(now, Indeterminate::Timeout, gate)
                    }
                    RequestKind::Release => self.release_answered(),
                }
            }
        }
        if self.in_flight.is_none() && due(self.next_send) {
            match self.state {
                State::Acquiring => self.send(RequestKind::Acquire, now),
                State::Holding | State::RenewPending => {
                    self.state = State::RenewPending;
                    self.send(RequestKind::Renew, now);
                }
                _ => self.next_send = Instant::MAX,
            }
        }
    }

    /// The lock service answered an acquire.
    pub fn handle_acquire_response(
        &mut self,
        now: Instant,
        id: RequestId,
        outcome: AcquireOutcome,
        gate: &WriteGate,
    ) -> Result<(), StaleResponse> {
        self.accept_response(now, id, RequestKind::Acquire, gate)?;
        let now = self.now();
        match outcome {
            AcquireOutcome::Granted { fence, ttl } => {
                match self.config.safe_deadline(self.sent_at, ttl) {
                    Some(deadline) if now < deadline => {
                        self.fence = fence;
                        self.hold(deadline, now, EventKind::Acquired, gate);
                    }
                    // Granted, but already past what the grant itself allows: the gate
                    // never opens; free the key for others, best effort.
                    _ => self.lose(LossReason::Expired, now, gate),
                }
            }
            AcquireOutcome::HeldByAnother => {
                self.acquire_failed(now, AcquireFailure::HeldByAnother);
            }
            AcquireOutcome::Indeterminate(why) => {
                self.acquire_failed(now, AcquireFailure::Indeterminate(why));
            }
        }
        Ok(())
    }

    /// The lock service answered a renewal.
    pub fn handle_renew_response(
        &mut self,
        now: Instant,
        id: RequestId,
        outcome: RenewOutcome,
        gate: &WriteGate,
    ) -> Result<(), StaleResponse> {
        self.accept_response(now, id, RequestKind::Renew, gate)?;
        let now = self.now();
        match outcome {
            RenewOutcome::Renewed { ttl } => match self.config.safe_deadline(self.sent_at, ttl) {
                Some(deadline) if now < deadline && deadline >= self.deadline => {
                    self.hold(deadline, now, EventKind::Renewed, gate);
                }
                Some(deadline) if now < deadline => self.lose(LossReason::Shortened, now, gate),
                _ => self.renew_indeterminate(now, Indeterminate::LateSuccess, gate),
            },
            RenewOutcome::NotOwner => self.lose(LossReason::NotOwner, now, gate),
            RenewOutcome::Indeterminate(why) => self.renew_indeterminate(now, why, gate),
        }
        Ok(())
    }

    /// The lock service answered a release. Whatever it says, the term is over.
    pub fn handle_release_response(
        &mut self,
        now: Instant,
        id: RequestId,
        outcome: ReleaseOutcome,
        gate: &WriteGate,
    ) -> Result<(), StaleResponse> {
        self.accept_response(now, id, RequestKind::Release, gate)?;
        let _ = outcome;
        self.release_answered();
        Ok(())
    }

    /// The lock service reported, unprompted, that the grant with `fence` is gone (an
    /// etcd watch saw the key deleted, a gateway pushed "revoked").
    ///
    /// Applies only while that very grant is held; a notice about another fence is
    /// stale and changes nothing.
    pub fn handle_revoked(
        &mut self,
        now: Instant,
        fence: Fence,
        gate: &WriteGate,
    ) -> Result<(), StaleResponse> {
        let now = self.advance(now);
        if self.expire_if_due(now, gate) {
            return Ok(());
        }
        match self.state {
            State::Holding | State::RenewPending if fence == self.fence => {
                self.lose(LossReason::Revoked, now, gate);
                Ok(())
            }
            _ => {
                self.stats.stale_responses = self.stats.stale_responses.saturating_add(1);
                Err(StaleResponse)
            }
        }
    }

    // ----- outputs -----

    /// The next request to send, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if !core::mem::take(&mut self.action_pending) {
            return None;
        }
        let id = RequestId(self.last_id);
        let term = self.term;
        let ttl = self.config.ttl();
        Some(match self.in_flight? {
            RequestKind::Acquire => Action::Acquire { id, term, ttl },
            RequestKind::Renew => Action::Renew {
                id,
                term,
                fence: self.fence,
                ttl,
            },
            RequestKind::Release => Action::Release { id, term },
        })
    }

    /// The next notification, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        let kind = self.event.take()?;
        Some(self.event_of(kind))
    }

    /// The public event for a queued `kind`, with the data the lease holds now.
    ///
    /// Out of line, it writes each variant straight into the returned `Event`; inlined
    /// into `poll_event`, the optimiser merged the variants' stores into one
    /// byte-shuffling sequence about 100 bytes longer.
    #[inline(never)]
    fn event_of(&self, kind: EventKind) -> Event {
        match kind {
            EventKind::Acquired => Event::Acquired {
                term: self.term,
                fence: self.fence,
                deadline: self.deadline,
            },
            EventKind::AcquireFailed(reason) => Event::AcquireFailed {
                reason,
                retry_at: self.next_send,
            },
            EventKind::Renewed => Event::Renewed {
                deadline: self.deadline,
            },
            EventKind::RenewFailed(reason) => Event::RenewFailed {
                reason,
                retry_at: (self.next_send != Instant::MAX).then_some(self.next_send),
                deadline: self.deadline,
                writes_paused: self.paused,
            },
            EventKind::Lost(reason) => Event::Lost { reason },
            EventKind::Released => Event::Released,
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next = self.next_send;
        if matches!(self.state, State::Holding | State::RenewPending) {
            next = next.min(self.deadline);
        }
        if self.in_flight.is_some() {
            next = next.min(self.sent_at.saturating_add(self.config.request_timeout()));
        }
        (next != Instant::MAX).then_some(next)
    }

    // ----- internals -----

    /// Clamps `now` so time never goes backwards inside the lease.
    ///
    /// Every command and input starts here; out of line, it is one copy instead of a
    /// 64-bit compare-and-store in each of them (a firmware links all of them).
    #[inline(never)]
    fn advance(&mut self, now: Instant) -> Instant {
        self.latest = self.latest.max(now);
        self.latest
    }

    /// The deadline passed without a confirmed renewal: the term is lost.
    fn expire_if_due(&mut self, now: Instant, gate: &WriteGate) -> bool {
        let held = matches!(self.state, State::Holding | State::RenewPending);
        if held && now >= self.deadline {
            self.lose(LossReason::Expired, now, gate);
            true
        } else {
            false
        }
    }

    /// The start of every `handle_*_response`: time moves on (read it back with
    /// [`now`](Self::now)), a deadline that passed ends the term, then the answer is
    /// taken only if it is for the request in flight.
    fn accept_response(
        &mut self,
        now: Instant,
        id: RequestId,
        kind: RequestKind,
        gate: &WriteGate,
    ) -> Result<(), StaleResponse> {
        let now = self.advance(now);
        self.expire_if_due(now, gate);
        self.take_response(id, kind)
    }

    /// Accepts the answer only if it is for the request in flight.
    fn take_response(&mut self, id: RequestId, kind: RequestKind) -> Result<(), StaleResponse> {
        if self.in_flight == Some(kind) && id.0 == self.last_id {
            self.in_flight = None;
            self.action_pending = false;
            Ok(())
        } else {
            self.stats.stale_responses = self.stats.stale_responses.saturating_add(1);
            Err(StaleResponse)
        }
    }

    /// Puts a new request of `kind` in flight (superseding any other) for
    /// `poll_action` to hand out.
    ///
    /// Out of line: acquire, release, renewals and retries all send, and one copy is
    /// smaller than the 64-bit id increment and stores inlined in each.
    #[inline(never)]
    fn send(&mut self, kind: RequestKind, now: Instant) {
        self.last_id = self.last_id.wrapping_add(1);
        self.in_flight = Some(kind);
        self.action_pending = true;
        self.sent_at = now;
        self.next_send = Instant::MAX;
    }

    /// Queues `event` for `poll_event`, counting the one it replaces if the driver
    /// did not drain.
    ///
    /// Every transition ends here; out of line, it is one copy instead of one per
    /// transition.
    #[inline(never)]
    fn emit(&mut self, event: EventKind) {
        if self.event.replace(event).is_some() {
            self.stats.overwritten_events = self.stats.overwritten_events.saturating_add(1);
        }
    }

    /// A grant or a renewal until `deadline` was confirmed: the gate opens (or stays
    /// open, unpaused) until then, and the next renewal is scheduled.
    fn hold(&mut self, deadline: Instant, now: Instant, event: EventKind, gate: &WriteGate) {
        self.deadline = deadline;
        self.paused = false;
        self.state = State::Holding;
        gate.publish_held(self.term, self.fence, deadline);
        self.schedule_renewal(now);
        self.emit(event);
    }

    /// Next renewal: `renew_interval` after the confirmed request was *sent*, so the
    /// cadence stays locked to the deadlines; at once if a slow answer already overran.
    fn schedule_renewal(&mut self, now: Instant) {
        self.next_send = self
            .sent_at
            .saturating_add(self.config.renew_interval())
            .max(now);
    }

    fn acquire_failed(&mut self, now: Instant, reason: AcquireFailure) {
        self.next_send = now.saturating_add(self.config.retry_interval());
        self.emit(EventKind::AcquireFailed(reason));
    }

    /// A blip is not loss: retry inside the remaining budget, never past it.
    fn renew_indeterminate(&mut self, now: Instant, why: Indeterminate, gate: &WriteGate) {
        self.state = State::RenewPending;
        if self.config.fail_closed() && !self.paused {
            self.paused = true;
            gate.publish_paused(self.term, self.fence, self.deadline);
        }
        let retry = now.saturating_add(self.config.retry_interval());
        self.next_send = if retry < self.deadline {
            retry
        } else {
            Instant::MAX
        };
        self.emit(EventKind::RenewFailed(why));
    }

    /// Ends the term in loss. The gate flips first; the best-effort release (only when
    /// the key may still be ours at the service) is queued after.
    fn lose(&mut self, reason: LossReason, now: Instant, gate: &WriteGate) {
        gate.publish_lost(self.term, self.fence, reason);
        self.state = State::Lost(reason);
        self.paused = false;
        self.in_flight = None;
        self.action_pending = false;
        self.next_send = Instant::MAX;
        if matches!(reason, LossReason::Expired | LossReason::Shortened) {
            self.send(RequestKind::Release, now);
        }
        self.emit(EventKind::Lost(reason));
    }

    fn release_answered(&mut self) {
        if self.state == State::Releasing {
            self.finish_release();
        }
    }

    fn finish_release(&mut self) {
        self.state = State::Released;
        self.in_flight = None;
        self.action_pending = false;
        self.next_send = Instant::MAX;
        self.emit(EventKind::Released);
    }
}
