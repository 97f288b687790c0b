//! The lease state machine.

use core::borrow::Borrow;
use core::fmt;

use crate::timers::{Timer, TIMERS};
use crate::{
    AcquireOutcome, Config, Duration, Fence, Indeterminate, Instant, LossReason, Owner, Refusal,
    ReleaseOutcome, RenewOutcome, RequestId, Response, Term, WriteGate,
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
/// * **inputs** `handle_*` feed in what happened: a [`Response`] to a request
///   ([`handle_response`](Self::handle_response)), an unsolicited revocation
///   ([`handle_revoked`](Self::handle_revoked)), or time passing
///   ([`handle_timeout`](Self::handle_timeout));
/// * **outputs** `poll_*` hand out what to do: [`poll_action`](Self::poll_action) a
///   request to send, [`poll_event`](Self::poll_event) a notification,
///   [`poll_timeout`](Self::poll_timeout) when to call `handle_timeout` next.
///
/// After **every** command or input, drain the outputs until none is left: `poll_action`
/// until `None` (send each request, tagging its answer with the request's
/// [`RequestId`]), `poll_event` until `None`, then re-arm a timer for `poll_timeout`.
/// Each call produces at most one action and one event, so a driver that drains after
/// every call loses nothing; one that does not sees only the newest (counted in
/// [`Stats::overwritten_events`]). The lease has nothing left to do once
/// `poll_timeout` is `None` and no request is awaited: a driver of one term stops
/// there, not at the `Lost` or `Released` event (a release may still be retried).
///
/// Every call takes `now` from one monotonic clock. Time only moves forward: a `now`
/// earlier than one already seen is treated as that one. `poll_timeout` is a soft
/// deadline: calling `handle_timeout` early, late or twice is harmless. An answer to a
/// request the lease no longer waits for (an old id, a previous term, a duplicate, an
/// id not handed out by `poll_action` yet, an answer of the wrong kind) is
/// [`Handled::Stale`] (or [`Handled::WrongKind`]) and changes nothing — with three exceptions that can only
/// make the lease *safer*: a late "not owner" to a renewal of the current term ends it
/// ([`LossReason::NotOwner`]), and so does a late renewal that confirms a shorter TTL
/// than asked ([`LossReason::Shortened`]) ([`Handled::EndedTerm`]); a late grant to an
/// acquire of the current term, after it ended, is released again
/// ([`Handled::ReleaseQueued`]), and the gate never opens for it. The
/// [rules](crate::rules) say why.
///
/// Request ids are unique within one `Lease`, not across leases: each lease numbers its
/// requests from term 1, sequence 1 ([`RequestId::term`], [`RequestId::sequence`]). A
/// driver of several leases on one connection keys an answer by (lease, id).
///
/// Use one `WriteGate` per `Lease`, and always the same one: the lease is its only writer.
///
/// # Where the config lives
///
/// `C` is where the lease reads its [`Config`]: by default its own copy (48 bytes of
/// its 128), or anything that lends one ([`Borrow<Config>`]), so that many leases with
/// one config keep it once: `&'static Config` on a microcontroller (a lease of 88
/// bytes on a 32-bit target), or a handle to a record that holds it. It must lend the
/// same config for the lease's life.
///
/// ```
/// use leasehold::*;
///
/// let gate = WriteGate::new();
/// let config = Config::builder(Duration::from_secs(3)).build().unwrap();
/// let mut lease = Lease::new(config, Owner(*b"sensor-17 backup"));
/// let t = Instant::from_millis;
///
/// lease.acquire(t(0), &gate).unwrap();
/// let Some(Action::Acquire { id, .. }) = lease.poll_action() else { unreachable!() };
/// // ...send it; the service grants fence 7 for 3 s; the answer arrives at 20 ms:
/// let granted = AcquireOutcome::Granted { fence: Fence(7), ttl: Duration::from_secs(3) };
/// assert_eq!(lease.handle_response(t(20), id, granted.into(), &gate), Handled::Applied);
/// assert!(matches!(lease.poll_event(), Some(Event::Acquired { fence: Fence(7), .. })));
/// assert_eq!(gate.check(t(21)), Ok(Fence(7)));
///
/// // The renewal is due at T/3 after the acquire was *sent*.
/// assert_eq!(lease.poll_timeout(), Some(t(1_000)));
/// lease.handle_timeout(t(1_000), &gate);
/// assert!(matches!(lease.poll_action(), Some(Action::Renew { .. })));
/// ```
#[derive(Clone, Debug)]
pub struct Lease<C = Config> {
    // Field order matters for code size: `new` stores the fields in this order, LLVM
    // merges consecutive zero stores into one memset, and a memset of more than 16
    // bytes is a call to compiler-builtins' `memclr` (174 B on thumbv7em) that the rest
    // of a firmware may not link. `next_send` (MAX) and `state` (Idle) are not zero:
    // they split the zeroed fields into short runs.
    config: C,
    /// Latest `now` seen; earlier ones are clamped to it.
    latest: Instant,
    /// While held, the safe deadline; while acquiring, when to give up; once a
    /// release was sent, when to stop retrying it.
    deadline: Instant,
    /// When to send the next acquire or renewal; `Instant::MAX` for never (read it
    /// through the timer table only).
    next_send: Instant,
    /// Send time of the newest request (its timeout is `sent_at + request_timeout`).
    sent_at: Instant,
    /// The TTL the service granted for this term; renewals ask for it.
    granted: Duration,
    /// Id of the newest request: the term in the high 32 bits, a sequence in the low
    /// 32, so every id names its term and ids only grow.
    last_id: u64,
    fence: Fence,
    stats: Stats,
    /// Xorshift state for the jitter of acquire retries, seeded from the owner;
    /// never zero.
    jitter: u32,
    /// Sequence (low half of the id) of this term's newest acquire: ids of the term
    /// up to it are acquires, and once the term is held (it earned the grant), only
    /// ids after it can be the term's renewals.
    acquire_seq: u32,
    state: State,
    flags: Flags,
    event: Option<EventKind>,
    in_flight: Option<RequestKind>,
}

/// Booleans of a [`Lease`], one byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Flags(u8);

impl Flags {
    /// `in_flight` has not been handed out by `poll_action` yet.
    const ACTION_PENDING: u8 = 1;
    /// Fail-closed: the gate is paused until a renewal is confirmed.
    const PAUSED: u8 = 2;
    /// An acquire of this term was sent and not refused since: the service may have
    /// granted it, so giving up or releasing must send a release.
    const MAYBE_GRANTED: u8 = 4;
    /// An acquire of this term went unanswered (timed out, or its outcome unknown):
    /// it may still be applied later, whatever later attempts are told, so the term
    /// stays [`MAYBE_GRANTED`](Self::MAYBE_GRANTED) to its end.
    const UNANSWERED_ACQUIRE: u8 = 8;
    /// A grant to an acquire of this term came after the term ended: release the
    /// term again as soon as no request is in flight.
    const RERELEASE: u8 = 16;

    const fn get(self, flag: u8) -> bool {
        self.0 & flag != 0
    }
    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }
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
    /// The term ended without a grant: refused, or the wait bound ran out.
    NotAcquired(AcquireFailure),
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
    #[non_exhaustive]
    Acquire {
        /// Tag the answer with this.
        id: RequestId,
        /// The term whose owner token to present.
        term: Term,
        /// The TTL to ask for (the configured one).
        ttl: Duration,
    },
    /// Extend the key by `ttl` if the owner token of `term` still holds it *with this
    /// fence*.
    ///
    /// Comparing the fence too tells two grants of the same owner token apart: if the
    /// key was deleted and a late duplicate of this term's acquire re-created it, the
    /// service holds a newer fence for the same token, and extending that one would
    /// keep alive a lease this client cannot write with.
    #[non_exhaustive]
    Renew {
        /// Tag the answer with this.
        id: RequestId,
        /// The term whose owner token to present.
        term: Term,
        /// The fence of the grant being extended.
        fence: Fence,
        /// The TTL to ask for: the one the service granted for this term.
        ttl: Duration,
    },
    /// Delete the key if the owner token of `term` still holds it. Best effort: writes
    /// stopped already, and nothing waits for the answer but `Released`. Sent again
    /// (under a new id) while its outcome is unknown, for up to twice the TTL.
    #[non_exhaustive]
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
    #[non_exhaustive]
    Acquired {
        /// The term that began.
        term: Term,
        /// Present it with every write.
        fence: Fence,
        /// Writes are allowed until then, unless renewed.
        deadline: Instant,
        /// The TTL the service granted (renewals follow it, every third by default).
        granted: Duration,
    },
    /// An acquire attempt failed.
    #[non_exhaustive]
    AcquireFailed {
        /// Why.
        reason: AcquireFailure,
        /// When the next attempt is sent; `None` when the acquire is over (a final
        /// refusal, or the wait bound ran out): the lease is then
        /// [`State::NotAcquired`].
        retry_at: Option<Instant>,
    },
    /// A renewal was confirmed.
    #[non_exhaustive]
    Renewed {
        /// The new safe deadline.
        deadline: Instant,
        /// When the confirmed renewal was sent: the instant it is handled minus this
        /// is its round trip.
        sent_at: Instant,
    },
    /// A renewal's outcome is unknown; the lease is still held until its deadline.
    #[non_exhaustive]
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
    #[non_exhaustive]
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
#[non_exhaustive]
pub enum AcquireFailure {
    /// Somebody else holds the key.
    HeldByAnother,
    /// The outcome is unknown (the key may have been granted).
    Indeterminate(Indeterminate),
    /// The service refused for good; the acquire ended at once.
    Refused(Refusal),
    /// The service granted a TTL too short to renew safely
    /// ([`Config::accepts_grant`]); the gate never opened and the grant was released.
    GrantTooShort,
}

impl fmt::Display for AcquireFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireFailure::HeldByAnother => f.write_str("the key is held by another owner"),
            AcquireFailure::Indeterminate(why) => write!(f, "outcome unknown: {why}"),
            AcquireFailure::Refused(why) => write!(f, "refused: {why}"),
            AcquireFailure::GrantTooShort => f.write_str(
                "the service granted a TTL too short for one renewal and its request timeout",
            ),
        }
    }
}

/// The last term a [`Lease`] numbers before it starts again at 1: terms take 28 bits
/// so that a [`GateSnapshot`](crate::GateSnapshot) carries the whole term beside its
/// status in one word. A term's answers come back within seconds; a lease that took a
/// key a thousand times a second would reuse a term after three days.
pub const MAX_TERM: Term = Term((1 << 28) - 1);

/// Counters for things a driver may want to log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct Stats {
    /// Answers and notices that were not the ones awaited: [`Handled::Stale`],
    /// [`Handled::WrongKind`], and the late answers that still changed the lease.
    pub stale_responses: u32,
    /// Events replaced before `poll_event` took them (the driver did not drain).
    pub overwritten_events: u32,
}

/// What an answer or notice did to the lease ([`Lease::handle_response`],
/// [`Lease::handle_revoked`]).
///
/// Whatever it says, drain `poll_action` and `poll_event` after the call, as after any
/// input. Only [`Handled::Stale`] and [`Handled::WrongKind`] promise that nothing
/// changed ([`Handled::changed`] is `false`): a loop may skip the drain on them, never
/// on the other three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "a late answer may still have ended the term: see `Handled::changed`"]
#[non_exhaustive]
pub enum Handled {
    /// The answer to the request in flight (or a revocation of the grant held): the
    /// lease moved on, and an event or a request may be queued.
    Applied,
    /// Not the answer awaited, yet the term ended in this call: a late "not owner",
    /// refusal or shorter TTL for a renewal of the held term, or the safe deadline had
    /// passed at `now`. A `Lost` event is queued.
    EndedTerm,
    /// Not the answer awaited, yet a late grant to an acquire of the term, after the
    /// term ended, may hold the key: a release of the term is queued (or goes out once
    /// the request in flight is answered).
    ReleaseQueued,
    /// Ignored, nothing changed: not awaited (an old or unknown request id, a
    /// duplicate, a previous term, a revocation of a fence not held, a late answer
    /// that proves nothing). Counted in [`Stats::stale_responses`].
    Stale,
    /// Ignored, nothing changed: the id of the request in flight with another kind of
    /// answer (a renewal's outcome for an acquire, say), which a driver that mixed up
    /// its requests or a garbled connection sends. The request stays in flight.
    /// Counted in [`Stats::stale_responses`].
    WrongKind,
}

impl Handled {
    /// Whether the call changed the lease: anything but [`Handled::Stale`] and
    /// [`Handled::WrongKind`].
    pub const fn changed(self) -> bool {
        !matches!(self, Handled::Stale | Handled::WrongKind)
    }
}

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
    /// `true` when the acquire is over (no retry).
    AcquireFailed(AcquireFailure, bool),
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

/// The term an id belongs to (its high 32 bits).
const fn term_of(id: u64) -> Term {
    RequestId(id).term()
}

impl<C: Borrow<Config>> Lease<C> {
    /// A lease that has not been acquired yet, for the client that presents `owner`
    /// to the lock service.
    ///
    /// The owner seeds the jitter of acquire retries ([`acquire_until`](Self::acquire_until)):
    /// contenders for one key must present different owners, so they also wait
    /// different times between attempts instead of retrying in lock step, and a lease
    /// with the same owner and config retries at the same instants (the lease keeps
    /// only the 32-bit seed, not the owner). The driver must present the same `owner`
    /// with every request ([`Owner::token`] with the [`Action`]'s term).
    pub const fn new(config: C, owner: Owner) -> Lease<C> {
        Lease {
            config,
            latest: Instant::ZERO,
            deadline: Instant::ZERO,
            next_send: Instant::MAX,
            sent_at: Instant::ZERO,
            granted: Duration::ZERO,
            last_id: 0,
            fence: Fence(0),
            stats: Stats {
                stale_responses: 0,
                overwritten_events: 0,
            },
            jitter: jitter_seed(owner),
            acquire_seq: 0,
            state: State::Idle,
            flags: Flags(0),
            event: None,
            in_flight: None,
        }
    }

    // ----- getters -----

    /// Where the lease is in its life.
    pub const fn state(&self) -> State {
        self.state
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        self.config.borrow()
    }
    /// Where the config is read from (see [Where the config lives](Lease#where-the-config-lives)).
    pub const fn config_source(&self) -> &C {
        &self.config
    }
    /// The current term (0 before the first acquire).
    pub const fn term(&self) -> Term {
        term_of(self.last_id)
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
    /// The TTL the service granted for this term, while the lease is held.
    pub const fn granted_ttl(&self) -> Option<Duration> {
        match self.state {
            State::Holding | State::RenewPending => Some(self.granted),
            _ => None,
        }
    }
    /// Whether writes are paused (fail-closed mode, renewal outcome unknown).
    pub const fn writes_paused(&self) -> bool {
        self.flags.get(Flags::PAUSED)
    }
    /// The latest instant passed to this lease: the `now` it works with. It is not a
    /// clock reading; earlier `now`s are clamped to it.
    pub const fn latest_instant(&self) -> Instant {
        self.latest
    }

    /// When this lease may contend for its key again, if its last term held the key
    /// and ended by release: [`Config::release_backoff`] after the release was last
    /// sent (a release whose outcome was unknown is sent again, and the copy sent
    /// last may be the one that frees the key). `None` after any other end, and while
    /// a term runs.
    ///
    /// A driver lets this instant pass (or its own wait bound, if sooner) before the
    /// next [`acquire_until`](Self::acquire_until), so a contender waiting for the key
    /// takes its turn instead of finding it taken again at once (`leasehold::rules`,
    /// "Acquiring"). It may be in the past: compare it with now.
    pub fn turn(&self) -> Option<Instant> {
        // Once a term has ended only releases are sent, so `sent_at` is the last one's.
        if !matches!(self.state, State::Released) || self.granted == Duration::ZERO {
            return None;
        }
        Some(self.sent_at.saturating_add(self.config().release_backoff()))
    }

    /// Counters.
    pub const fn stats(&self) -> Stats {
        self.stats
    }
    /// Whether the lease still waits for the answer to request `id`. A driver may drop
    /// the I/O of a request the lease gave up on (timed out, superseded, term over);
    /// a loop that can keep an acquire's until it resolves and deliver its answer
    /// lets a late grant be released again ([`handle_response`](Self::handle_response)).
    pub const fn is_awaiting(&self, id: RequestId) -> bool {
        self.in_flight.is_some() && id.0 == self.last_id
    }

    // ----- user commands -----

    /// Starts a new term and waits for the key as long as it takes: closes the gate
    /// for the term and asks for an acquire. Same as
    /// [`acquire_until`](Self::acquire_until) with `Instant::MAX`.
    ///
    /// Allowed when idle, lost, not acquired, released or releasing (an old release
    /// still in flight presents the old term's owner token, so it cannot delete the
    /// new grant).
    pub fn acquire(&mut self, now: Instant, gate: &WriteGate) -> Result<(), AlreadyActive> {
        self.acquire_until(now, Instant::MAX, gate)
    }

    /// Starts a new term that gives up waiting for the key at `give_up_at`.
    ///
    /// A failed attempt (held by another, or an unknown outcome) is retried after a
    /// jittered [`retry_interval`](Config::retry_interval) (between half and one and
    /// a half of it) unless that retry would be sent at or after `give_up_at`; then
    /// the acquire ends as [`State::NotAcquired`] with the last failure. `give_up_at
    /// == now` tries once (`flock -n`). A final refusal ends it at once, whatever the
    /// bound. An attempt already in flight at `give_up_at` is still awaited (for at
    /// most the request timeout), and if the service may have granted any attempt, a
    /// release is sent when the acquire gives up.
    pub fn acquire_until(
        &mut self,
        now: Instant,
        give_up_at: Instant,
        gate: &WriteGate,
    ) -> Result<(), AlreadyActive> {
        let now = self.advance(now);
        match self.state {
            State::Idle
            | State::Lost(_)
            | State::NotAcquired(_)
            | State::Released
            | State::Releasing => {}
            state @ (State::Acquiring | State::Holding | State::RenewPending) => {
                return Err(AlreadyActive { state })
            }
        }
        // Never term 0 (no term yet), and never past what the gate can publish.
        let term = if self.term().0 >= MAX_TERM.0 {
            1
        } else {
            self.term().0.wrapping_add(1)
        };
        self.last_id = u64::from(term) << 32;
        self.fence = Fence(0);
        self.granted = Duration::ZERO;
        self.deadline = give_up_at;
        self.flags = Flags(0);
        gate.publish_closed(Term(term));
        self.state = State::Acquiring;
        self.send(RequestKind::Acquire, now);
        Ok(())
    }

    /// Ends the term politely: the gate closes first, then a release is requested.
    ///
    /// The term ends in `Released` whatever the release's outcome, at the latest one
    /// request timeout later. A release whose outcome is unknown (timed out, or
    /// answered [`ReleaseOutcome::Indeterminate`]) is sent again after a jittered
    /// [`retry_interval`](Config::retry_interval) until the service answers anything
    /// else, or twice the TTL after its first send, so an orphaned key does not block
    /// the next holder for its TTL; the same holds for the release after a loss or
    /// after giving up. The term has ended meanwhile: a driver keeps calling
    /// [`handle_timeout`](Self::handle_timeout) while
    /// [`poll_timeout`](Self::poll_timeout) is `Some`, and a new term stops the
    /// retries. While acquiring, a release is sent if any acquire of the
    /// term may have been granted (one in flight, or one whose answer never came);
    /// otherwise the term is released at once. Past the safe deadline (not yet fired
    /// by [`handle_timeout`](Self::handle_timeout)) the term has already ended: it
    /// ends as `Lost(Expired)`, with the same best-effort release.
    pub fn release(&mut self, now: Instant, gate: &WriteGate) -> Result<(), NotActive> {
        let now = self.advance(now);
        // A term past its safe deadline ended there, whether or not the driver has
        // said so yet: it is reported lost (with its release), not released.
        if self.expire_if_due(now, gate) {
            return Ok(());
        }
        match self.state {
            State::Acquiring | State::Holding | State::RenewPending => {}
            State::Releasing => return Ok(()),
            state @ (State::Idle | State::Lost(_) | State::NotAcquired(_) | State::Released) => {
                return Err(NotActive { state })
            }
        }
        gate.publish_released(self.term(), self.fence);
        self.flags.set(Flags::PAUSED, false);
        // `matches!`, not `==`: the derived `PartialEq` of `State` also compares the
        // payloads of `Lost` and `NotAcquired`, an out-of-line function of its own.
        if matches!(self.state, State::Acquiring) && !self.flags.get(Flags::MAYBE_GRANTED) {
            // Every attempt was answered "no": nothing to delete.
            self.finish_release();
        } else {
            self.state = State::Releasing;
            self.send_release(now);
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
        if self.timer_due(Timer::Request, now) {
            if let Some(kind) = self.in_flight {
                // A request that timed out was answered "unknown": the same path.
                let why = Indeterminate::Timeout;
                let response = match kind {
                    RequestKind::Acquire => Response::Acquire(AcquireOutcome::Indeterminate(why)),
                    RequestKind::Renew => Response::Renew(RenewOutcome::Indeterminate(why)),
                    RequestKind::Release => Response::Release(ReleaseOutcome::Indeterminate(why)),
                };
                self.answered(now, &response, gate);
            }
        }
        if self.in_flight.is_none() && self.timer_due(Timer::Send, now) {
            match self.state {
                State::Acquiring => self.send(RequestKind::Acquire, now),
                State::Holding | State::RenewPending => {
                    self.state = State::RenewPending;
                    self.send(RequestKind::Renew, now);
                }
                // Once the term has ended, only a release is ever scheduled.
                _ => self.send(RequestKind::Release, now),
            }
        }
    }

    /// The lock service answered request `id`.
    ///
    /// [`Handled::Applied`] if it answers the request in flight, handed out by
    /// [`poll_action`](Self::poll_action) (a request this very call queued, such as the
    /// release after an expiry it detected, cannot have been answered yet). Any other
    /// answer is ignored and counted in [`Stats`] ([`Handled::WrongKind`] for the id in
    /// flight with another kind of answer, [`Handled::Stale`] for the rest) — except
    /// that two kinds of late answer are read for what they prove:
    ///
    /// * a late answer to a renewal of the current, still held term: "not owner" ends
    ///   the term ([`LossReason::NotOwner`]: under the owner-and-fence compare it
    ///   means the grant was deleted or replaced, and renewals never re-create one),
    ///   and so does a confirmed TTL shorter than asked ([`LossReason::Shortened`]:
    ///   the service may have expired the key before the deadline the gate holds);
    /// * a late `Granted` to an acquire of the current term that this lease handed out,
    ///   once the term has ended (released, not acquired, lost — also while its
    ///   release is in flight, which the service may have handled first): the key may
    ///   be held by the term's token, so a release of the term is sent again as soon
    ///   as no request is in flight. While the term is acquiring or held nothing is
    ///   done (the key is the term's, and its next attempt is granted the same
    ///   fence); a late grant of an older term is only counted. The gate never opens
    ///   for a late grant.
    ///
    /// Those return [`Handled::EndedTerm`] and [`Handled::ReleaseQueued`] and are counted
    /// as stale, as the request was not the one in flight. So is any answer in a call
    /// whose `now` is past the safe deadline: the deadline ends the term first
    /// ([`Handled::EndedTerm`]).
    #[inline(never)]
    pub fn handle_response(
        &mut self,
        now: Instant,
        id: RequestId,
        response: Response,
        gate: &WriteGate,
    ) -> Handled {
        let now = self.advance(now);
        let expired = self.expire_if_due(now, gate);
        let kind = match response {
            Response::Acquire(_) => RequestKind::Acquire,
            Response::Renew(_) => RequestKind::Renew,
            Response::Release(_) => RequestKind::Release,
        };
        // Only a request that was handed out can be answered: the expiry above may
        // just have queued the loss's release under the next id, which no answer can
        // carry yet (taking one for it would keep that release from going out).
        let handed_out = id.0 == self.last_id && !self.flags.get(Flags::ACTION_PENDING);
        if handed_out && self.in_flight == Some(kind) {
            self.answered(now, &response, gate);
            return Handled::Applied;
        }
        let late = self.not_awaited(now, id, &response, handed_out, gate);
        if expired {
            Handled::EndedTerm
        } else {
            late
        }
    }

    /// An answer that is not the one awaited: counted, and read for what it proves.
    ///
    fn not_awaited(
        &mut self,
        now: Instant,
        id: RequestId,
        response: &Response,
        handed_out: bool,
        gate: &WriteGate,
    ) -> Handled {
        self.stats.stale_responses = self.stats.stale_responses.saturating_add(1);
        if handed_out && self.in_flight.is_some() {
            return Handled::WrongKind;
        }
        match *response {
            Response::Renew(outcome) => self.late_renewal(now, id, outcome, gate),
            Response::Acquire(AcquireOutcome::Granted { .. }) => self.late_grant(now, id),
            Response::Acquire(_) | Response::Release(_) => Handled::Stale,
        }
    }

    /// The request in flight was answered with `response` (of its kind), or timed out
    /// (an indeterminate answer): it is no longer in flight, and the answer moves the
    /// term on.
    ///
    /// Out of line, by reference: answers and timeouts share it, and the holder inside
    /// an answer is not copied.
    #[inline(never)]
    fn answered(&mut self, now: Instant, response: &Response, gate: &WriteGate) {
        self.in_flight = None;
        self.flags.set(Flags::ACTION_PENDING, false);
        match response {
            Response::Acquire(outcome) => self.acquire_answered(now, outcome, gate),
            Response::Renew(outcome) => self.renew_answered(now, *outcome, gate),
            Response::Release(outcome) => self.release_answered(now, outcome),
        }
        self.rerelease_if_free(now);
    }

    /// The lock service reported, unprompted, that the grant with `fence` is gone (an
    /// etcd watch saw the key deleted, a gateway pushed "revoked").
    ///
    /// Applies only while that very grant is held; a notice about another fence, or
    /// one that arrives after the term ended (also by its deadline passing in this
    /// very call), is stale and changes nothing.
    pub fn handle_revoked(&mut self, now: Instant, fence: Fence, gate: &WriteGate) -> Handled {
        let now = self.advance(now);
        if self.expire_if_due(now, gate) {
            self.stats.stale_responses = self.stats.stale_responses.saturating_add(1);
            return Handled::EndedTerm;
        }
        if self.is_held() && fence == self.fence {
            self.lose(LossReason::Revoked, now, gate);
            Handled::Applied
        } else {
            self.stats.stale_responses = self.stats.stale_responses.saturating_add(1);
            Handled::Stale
        }
    }

    // ----- outputs -----

    /// The next request to send, if any.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if !self.flags.get(Flags::ACTION_PENDING) {
            return None;
        }
        self.flags.set(Flags::ACTION_PENDING, false);
        let id = RequestId(self.last_id);
        let term = self.term();
        Some(match self.in_flight? {
            RequestKind::Acquire => Action::Acquire {
                id,
                term,
                ttl: self.config().ttl(),
            },
            RequestKind::Renew => Action::Renew {
                id,
                term,
                fence: self.fence,
                ttl: self.granted,
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
                term: self.term(),
                fence: self.fence,
                deadline: self.deadline,
                granted: self.granted,
            },
            EventKind::AcquireFailed(reason, over) => Event::AcquireFailed {
                reason,
                retry_at: if over { None } else { self.timer(Timer::Send) },
            },
            EventKind::Renewed => Event::Renewed {
                deadline: self.deadline,
                sent_at: self.sent_at,
            },
            EventKind::RenewFailed(reason) => Event::RenewFailed {
                reason,
                retry_at: self.timer(Timer::Send),
                deadline: self.deadline,
                writes_paused: self.flags.get(Flags::PAUSED),
            },
            EventKind::Lost(reason) => Event::Lost { reason },
            EventKind::Released => Event::Released,
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called, if ever:
    /// the earliest timer in the table.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        // `MAX` is an unarmed timer, and no armed timer is at `MAX`: the minimum is `MAX`
        // only when none is armed.
        let at = TIMERS.iter().fold(Instant::MAX, |earliest, &timer| {
            earliest.min(self.timer_at(timer))
        });
        (at != Instant::MAX).then_some(at)
    }

    // ----- internals -----

    /// The timer table: when each timer fires, `Instant::MAX` when it is not armed.
    /// The only place that knows what arms a timer.
    ///
    /// `Instant::MAX` is "never", even at `now == MAX`: a timer that saturated there
    /// must not fire on every call. Plain instants, not `Option`s: less code to compare.
    fn timer_at(&self, timer: Timer) -> Instant {
        match timer {
            Timer::Deadline if self.is_held() => self.deadline,
            Timer::Request if self.in_flight.is_some() => {
                self.sent_at.saturating_add(self.config().request_timeout())
            }
            Timer::Send => self.next_send,
            Timer::Deadline | Timer::Request => Instant::MAX,
        }
    }

    /// When `timer` fires, `None` when it is not armed.
    fn timer(&self, timer: Timer) -> Option<Instant> {
        let at = self.timer_at(timer);
        (at != Instant::MAX).then_some(at)
    }

    fn timer_due(&self, timer: Timer, now: Instant) -> bool {
        let at = self.timer_at(timer);
        at != Instant::MAX && now >= at
    }

    const fn is_held(&self) -> bool {
        matches!(self.state, State::Holding | State::RenewPending)
    }

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
        if self.timer_due(Timer::Deadline, now) {
            self.lose(LossReason::Expired, now, gate);
            true
        } else {
            false
        }
    }

    /// Puts a new request of `kind` in flight (superseding any other) for
    /// `poll_action` to hand out.
    ///
    /// Out of line: acquire, release, renewals and retries all send, and one copy is
    /// smaller than the 64-bit id increment and stores inlined in each.
    #[inline(never)]
    fn send(&mut self, kind: RequestKind, now: Instant) {
        // The sequence wraps inside the low half: the term in the high half stays.
        let seq = (self.last_id as u32).wrapping_add(1);
        self.last_id = (self.last_id & !u64::from(u32::MAX)) | u64::from(seq);
        self.in_flight = Some(kind);
        self.flags.set(Flags::ACTION_PENDING, true);
        if kind == RequestKind::Acquire {
            self.acquire_seq = seq;
            self.flags.set(Flags::MAYBE_GRANTED, true);
        }
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

    fn acquire_answered(&mut self, now: Instant, outcome: &AcquireOutcome, gate: &WriteGate) {
        match *outcome {
            AcquireOutcome::Granted { fence, ttl } => {
                self.fence = fence;
                self.granted = ttl;
                if !self.config().accepts_grant(ttl) {
                    // The gate never opens; the grant is ours, so free it for others.
                    self.give_up(now, AcquireFailure::GrantTooShort);
                    return;
                }
                match self.config().safe_deadline(self.sent_at, ttl) {
                    Some(deadline) if now < deadline => {
                        self.hold(deadline, now, EventKind::Acquired, gate);
                    }
                    // Granted, but already past what the grant itself allows: the gate
                    // never opens; free the key for others, best effort.
                    _ => self.lose(LossReason::Expired, now, gate),
                }
            }
            AcquireOutcome::HeldByAnother(_) => {
                self.answered_no();
                self.acquire_failed(now, AcquireFailure::HeldByAnother);
            }
            AcquireOutcome::Refused(why) => {
                self.answered_no();
                self.give_up(now, AcquireFailure::Refused(why));
            }
            AcquireOutcome::Indeterminate(why) => {
                self.flags.set(Flags::UNANSWERED_ACQUIRE, true);
                self.acquire_failed(now, AcquireFailure::Indeterminate(why));
            }
        }
    }

    /// The acquire in flight was answered "no": it granted nothing, but an earlier
    /// attempt whose answer never came still may have.
    fn answered_no(&mut self) {
        let earlier = self.flags.get(Flags::UNANSWERED_ACQUIRE);
        self.flags.set(Flags::MAYBE_GRANTED, earlier);
    }

    fn renew_answered(&mut self, now: Instant, outcome: RenewOutcome, gate: &WriteGate) {
        match outcome {
            RenewOutcome::Renewed { ttl } => {
                // A renewal sets the service's expiry to (handling time + ttl), and
                // never applies less than asked (the granted TTL). It is counted as
                // the TTL asked even if the service applied more: another renewal of
                // this term, delayed in the network and handled later, may still set
                // the expiry to its own handling time + the TTL asked.
                match self
                    .config()
                    .safe_deadline(self.sent_at, ttl.min(self.granted))
                {
                    Some(deadline) if ttl >= self.granted && deadline >= self.deadline => {
                        self.hold(deadline, now, EventKind::Renewed, gate);
                    }
                    _ => self.lose(LossReason::Shortened, now, gate),
                }
            }
            RenewOutcome::NotOwner => self.lose(LossReason::NotOwner, now, gate),
            RenewOutcome::Refused(_) => self.lose(LossReason::Refused, now, gate),
            RenewOutcome::Indeterminate(why) => self.renew_indeterminate(now, why, gate),
        }
    }

    /// An answer to a renewal of this term that is no longer in flight (it timed out,
    /// or a newer one superseded it). It extends nothing, but it can prove the lease
    /// is gone or shortened.
    fn late_renewal(
        &mut self,
        now: Instant,
        id: RequestId,
        outcome: RenewOutcome,
        gate: &WriteGate,
    ) -> Handled {
        // A renewal of this term: sent after the acquire that earned the grant, and
        // not after the newest request (an id never issued proves nothing).
        let this_term =
            term_of(id.0) == self.term() && id.0 <= self.last_id && id.0 as u32 > self.acquire_seq;
        if !(this_term && self.is_held()) {
            return Handled::Stale;
        }
        let reason = match outcome {
            RenewOutcome::NotOwner => LossReason::NotOwner,
            // Its send time is unknown here, so any TTL below the one asked for may
            // have expired the key before the gate's deadline.
            RenewOutcome::Renewed { ttl } if ttl < self.granted => LossReason::Shortened,
            RenewOutcome::Refused(_) => LossReason::Refused,
            RenewOutcome::Renewed { .. } | RenewOutcome::Indeterminate(_) => return Handled::Stale,
        };
        self.lose(reason, now, gate);
        Handled::EndedTerm
    }

    /// A `Granted` answer to an acquire of this term that is no longer awaited (its
    /// answer came after the term ended: released — also while the release is in
    /// flight, which the service may have handled first —, given up, or lost). The
    /// gate never opens for it, but the grant may be live at the service under this
    /// term's token, blocking every contender until its TTL runs out: a release of
    /// the term goes out as soon as no request is in flight.
    ///
    /// Only an acquire that was handed out counts (an id of this term up to its newest
    /// acquire's). Nothing is done while the term is acquiring or held (the key is the
    /// term's; its next attempt is granted the same fence), nor for an older term
    /// (this lease no longer tracks its acquires; its grant expires by its TTL).
    fn late_grant(&mut self, now: Instant, id: RequestId) -> Handled {
        let seq = id.0 as u32;
        // (An id not handed out yet is no acquire's once the term has ended: the one
        // pending is a release, after every acquire of the term.)
        let issued = term_of(id.0) == self.term() && seq != 0 && seq <= self.acquire_seq;
        let ended = matches!(
            self.state,
            State::Released | State::NotAcquired(_) | State::Lost(_) | State::Releasing
        );
        if !(issued && ended) {
            return Handled::Stale;
        }
        self.flags.set(Flags::RERELEASE, true);
        self.rerelease_if_free(now);
        Handled::ReleaseQueued
    }

    /// Sends the release a late grant asked for, once no request is in flight.
    fn rerelease_if_free(&mut self, now: Instant) {
        if self.flags.get(Flags::RERELEASE) && self.in_flight.is_none() {
            self.flags.set(Flags::RERELEASE, false);
            self.send_release(now);
        }
    }

    /// A grant or a renewal until `deadline` was confirmed: the gate opens (or stays
    /// open, unpaused) until then, and the next renewal is scheduled.
    fn hold(&mut self, deadline: Instant, now: Instant, event: EventKind, gate: &WriteGate) {
        self.deadline = deadline;
        self.flags.set(Flags::PAUSED, false);
        self.state = State::Holding;
        gate.publish_held(self.term(), self.fence, deadline);
        self.schedule_renewal(now);
        self.emit(event);
    }

    /// Next renewal: the granted TTL's renew interval after the confirmed request was
    /// *sent*, so the cadence stays locked to the deadlines; at once if a slow answer
    /// already overran.
    fn schedule_renewal(&mut self, now: Instant) {
        self.next_send = self
            .sent_at
            .saturating_add(self.config().renew_interval_for(self.granted))
            .max(now);
    }

    /// An attempt failed: retry after a jittered interval, unless that is past the
    /// wait bound (kept in `deadline` while acquiring).
    fn acquire_failed(&mut self, now: Instant, reason: AcquireFailure) {
        let retry = now.saturating_add(self.jittered(self.config().retry_interval()));
        if retry >= self.deadline {
            self.give_up(now, reason);
        } else {
            self.next_send = retry;
            self.emit(EventKind::AcquireFailed(reason, false));
        }
    }

    /// The acquire is over without a usable grant. If the service may have granted
    /// any attempt, a best-effort release goes out (the gate never opened).
    fn give_up(&mut self, now: Instant, reason: AcquireFailure) {
        let maybe_granted = self.flags.get(Flags::MAYBE_GRANTED);
        self.end(
            State::NotAcquired(reason),
            maybe_granted,
            EventKind::AcquireFailed(reason, true),
            now,
        );
    }

    /// Ends the term in `state`: nothing in flight, nothing to send (but a best-effort
    /// release when `release` says the key may be ours at the service), writes not
    /// paused, and `event` queued.
    ///
    /// Out of line: loss, giving up and release all end here, one copy of the stores.
    #[inline(never)]
    fn end(&mut self, state: State, release: bool, event: EventKind, now: Instant) {
        self.state = state;
        self.flags.set(Flags::PAUSED, false);
        self.in_flight = None;
        self.flags.set(Flags::ACTION_PENDING, false);
        self.next_send = Instant::MAX;
        if release {
            self.send_release(now);
        }
        self.emit(event);
    }

    /// Sends a release of the term, retried until `now` plus twice the TTL while its
    /// answers are unknown (see `release_answered`).
    ///
    /// Twice: a key nobody renews is gone one TTL after the service last extended it,
    /// but a service may restart the TTL of every key on a failover (etcd's new leader
    /// does), so the key can outlive the release's first send by the failover's length
    /// plus one TTL. The longer of the granted and the configured TTL, as the
    /// service may have granted more than asked.
    fn send_release(&mut self, now: Instant) {
        let ttl = self.granted.max(self.config().ttl());
        self.deadline = now.saturating_add(ttl.saturating_mul(2));
        self.send(RequestKind::Release, now);
    }

    /// `interval` times a factor in [0.5, 1.5], from the xorshift state; in whole µs,
    /// half rounded up, so that even a 1 µs interval waits (a retry never falls in the
    /// call that scheduled it) and an odd one never waits less than half.
    fn jittered(&mut self, interval: Duration) -> Duration {
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.jitter = x;
        // Mix (murmur3's finaliser), so that seeds close together spread out at once,
        // then scale the top 20 bits to parts per million (a multiply and a shift).
        let y = fmix32(x);
        let ppm = ((u64::from(y >> 12) * 1_000_000) >> 20) as u32;
        let micros = interval.as_micros();
        let half_up = (micros >> 1).saturating_add(micros & 1);
        Duration::from_micros(half_up)
            .saturating_add(interval.ppm_ceil(ppm))
            .min(Duration::from_micros(micros.saturating_add(micros >> 1)))
    }

    /// A blip is not loss: retry inside the remaining budget, never past it.
    fn renew_indeterminate(&mut self, now: Instant, why: Indeterminate, gate: &WriteGate) {
        self.state = State::RenewPending;
        if self.config().fail_closed() && !self.flags.get(Flags::PAUSED) {
            self.flags.set(Flags::PAUSED, true);
            gate.publish_paused(self.term(), self.fence, self.deadline);
        }
        let retry = now.saturating_add(self.config().retry_interval());
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
        gate.publish_lost(self.term(), self.fence, reason);
        let release = matches!(reason, LossReason::Expired | LossReason::Shortened);
        self.end(State::Lost(reason), release, EventKind::Lost(reason), now);
    }

    /// A release was answered, or timed out. The term ends (if it was releasing)
    /// whatever the answer; a release whose outcome is unknown (a timeout, a broken
    /// connection) is sent again after a jittered retry interval, until the bound set
    /// when it was first sent: an orphaned key would block every contender for its
    /// TTL. Any other answer is final: the key was deleted, was not ours, or never
    /// will be deleted by us.
    fn release_answered(&mut self, now: Instant, outcome: &ReleaseOutcome) {
        if matches!(self.state, State::Releasing) {
            self.finish_release();
        }
        if let ReleaseOutcome::Indeterminate(_) = outcome {
            let retry = now.saturating_add(self.jittered(self.config().retry_interval()));
            if retry < self.deadline {
                self.next_send = retry;
            }
        }
    }

    fn finish_release(&mut self) {
        self.end(State::Released, false, EventKind::Released, self.latest);
    }
}

/// The jitter seed of an owner whose words mix to zero (xorshift needs a non-zero
/// state).
const FALLBACK_JITTER_SEED: u32 = 0x9e37_79b9;

/// The retry jitter's seed for `owner`: its four little-endian words xor-ed together,
/// so owners that differ in a single word (a serial number's last digits) always get
/// different seeds (each draw mixes the xorshift state with murmur3's finaliser, so
/// seeds close together spread out at once). Never zero.
const fn jitter_seed(owner: Owner) -> u32 {
    let [a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3] = owner.0;
    let h = u32::from_le_bytes([a0, a1, a2, a3])
        ^ u32::from_le_bytes([b0, b1, b2, b3])
        ^ u32::from_le_bytes([c0, c1, c2, c3])
        ^ u32::from_le_bytes([d0, d1, d2, d3]);
    if h == 0 {
        FALLBACK_JITTER_SEED
    } else {
        h
    }
}

/// murmur3's 32-bit finaliser: a bijection that spreads every input bit over the
/// output.
const fn fmix32(mut y: u32) -> u32 {
    y ^= y >> 16;
    y = y.wrapping_mul(0x85eb_ca6b);
    y ^= y >> 13;
    y = y.wrapping_mul(0xc2b2_ae35);
    y ^= y >> 16;
    y
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// No public way brings a lease to its last term quickly (2^28 acquires), so this
    /// one sets the term by hand.
    #[test]
    fn terms_wrap_after_max_term_to_one() {
        let config = Config::builder(Duration::from_secs(3)).build().unwrap();
        let gate = WriteGate::new();
        let mut lease = Lease::new(config, Owner([7; 16]));
        lease.last_id = RequestId::new(Term(MAX_TERM.0 - 1), 9).0;
        lease.state = State::Released;
        for (expected, sent_at) in [(MAX_TERM, 1), (Term(1), 2), (Term(2), 3)] {
            lease.acquire(Instant::from_millis(sent_at), &gate).unwrap();
            assert_eq!(lease.term(), expected);
            assert_eq!(gate.snapshot().unwrap().term, expected);
            let id = lease.poll_action().unwrap().id();
            assert_eq!((id.term(), id.sequence()), (expected, 1));
            lease.release(Instant::from_millis(sent_at), &gate).unwrap();
            let release = lease.poll_action().unwrap().id();
            let answer = ReleaseOutcome::Released.into();
            let handled =
                lease.handle_response(Instant::from_millis(sent_at), release, answer, &gate);
            assert_eq!(handled, Handled::Applied);
        }
    }
}
