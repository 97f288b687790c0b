//! Property tests: arbitrary sequences of inputs — current, old and made-up request ids,
//! any outcome (zero and huge TTLs and fences), revocations of any fence, `now` jumping
//! forwards and backwards — never break the lease's promises:
//!
//! * no panic;
//! * within a term, the lease's deadline and the gate's deadline only move forward;
//! * `Lost` is absorbing for the term: no `Holding` (nor `Acquired`/`Renewed`) again
//!   until a new `acquire`; `Released` likewise;
//! * the gate never passes `check` after the lease reported `Lost`/`Released` in that
//!   term, and whenever it passes, the lease is held with that fence and deadline;
//! * a response that is stale for sure (its id or kind is not the newest request's; a
//!   revocation of a fence not held) is not `Handled::Applied`, and such a response
//!   changes nothing but `stale_responses` (`Handled::WrongKind` for the id in flight
//!   answered with another kind, `Handled::Stale` for the rest) — except what time alone does (a deadline reached expires the lease:
//!   `Handled::EndedTerm`), and a late renewal answer of the held term that proves the
//!   grant gone or shortened (`NotOwner`, `Refused`, a TTL below the granted one), which
//!   must end the term with that reason (`Handled::EndedTerm`), and a late grant to an
//!   acquire of the current term after it ended, which changes nothing but sends a
//!   release of the term once no request is in flight (`Handled::ReleaseQueued`); any
//!   other such response is `Handled::Stale` or `Handled::WrongKind`;
//! * an acquire ends as `NotAcquired` only with `AcquireFailed { retry_at: None }`, and
//!   a grant the config cannot hold (`GrantTooShort`) never opens the gate;
//! * each call yields at most one action and one event; `handle_timeout` twice at the
//!   same instant is the same as once;
//! * a lease that borrows its config (`Lease<&Config>`) runs the same timeline as one
//!   that owns it.
//!
//! `PROPTEST_CASES` raises the number of cases.

use std::borrow::Borrow;

use leasehold::{
    AcquireFailure, AcquireOutcome, Action, Config, Duration, Event, Fence, GateSnapshot,
    GateStatus, Handled, Holder, Identity, Indeterminate, Instant, Lease, LossReason, Owner,
    Refusal, ReleaseOutcome, RenewOutcome, RequestId, Response, State, Term, WriteGate,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Which request id a response carries.
#[derive(Clone, Copy, Debug)]
enum Id {
    /// The newest request's id (the one in flight, if any).
    Current,
    /// The id of the request sent `n` requests before the newest.
    Old(usize),
    Any(u64),
}

/// The `now` an input carries, relative to the previous one.
#[derive(Clone, Copy, Debug)]
enum When {
    Same,
    Forward(u64),
    Back(u64),
    /// Exactly the lease's `poll_timeout`, or one microsecond either side of it.
    NextTimeout(i8),
    At(u64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    /// `acquire_until` this long after `now` (zero: try once).
    AcquireUntil(u64),
    Release,
    Timeout,
    AcquireResponse(Id, AcquireOutcome),
    RenewResponse(Id, RenewOutcome),
    ReleaseResponse(Id, ReleaseOutcome),
    /// A revocation notice for this fence; `None`: the fence currently held.
    Revoked(Option<Fence>),
    /// The answer to the newest request, of its kind, with its id.
    Answer(Answer),
}

/// One outcome of each kind; [`Op::Answer`] uses the one the newest request expects.
#[derive(Clone, Copy, Debug)]
struct Answer {
    acquire: AcquireOutcome,
    renew: RenewOutcome,
    release: ReleaseOutcome,
}

fn indeterminate() -> impl Strategy<Value = Indeterminate> {
    prop_oneof![
        Just(Indeterminate::Timeout),
        Just(Indeterminate::Transport),
        Just(Indeterminate::Protocol),
        Just(Indeterminate::Service),
    ]
}

fn refusal() -> impl Strategy<Value = Refusal> {
    prop_oneof![
        Just(Refusal::InvalidKey),
        Just(Refusal::WrongType),
        Just(Refusal::Unauthorized),
        Just(Refusal::Unsupported),
    ]
}

fn holder() -> impl Strategy<Value = Holder> {
    (fence(), ttl(), prop_oneof![Just(""), Just("host-7:4711")]).prop_map(
        |(fence, remaining, name)| Holder {
            identity: Identity::new(name).unwrap(),
            fence,
            remaining,
        },
    )
}

fn ttl() -> impl Strategy<Value = Duration> + Clone {
    prop_oneof![Just(0), Just(u64::MAX), 0u64..20_000_000, any::<u64>(),]
        .prop_map(Duration::from_micros)
}

fn fence() -> impl Strategy<Value = Fence> {
    prop_oneof![Just(0), Just(u64::MAX), 0u64..8, any::<u64>()].prop_map(Fence)
}

fn id() -> impl Strategy<Value = Id> {
    prop_oneof![
        4 => Just(Id::Current),
        2 => (0usize..4).prop_map(Id::Old),
        1 => any::<u64>().prop_map(Id::Any),
    ]
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        2 => Just(When::Same),
        6 => (0u64..2_000_000).prop_map(When::Forward),
        2 => (0u64..2_000_000).prop_map(When::Back),
        6 => (-1i8..=1).prop_map(When::NextTimeout),
        1 => prop_oneof![Just(0), Just(u64::MAX), any::<u64>()].prop_map(When::At),
    ]
}

fn acquired(ttl: impl Strategy<Value = Duration>) -> impl Strategy<Value = AcquireOutcome> {
    prop_oneof![
        3 => (fence(), ttl).prop_map(|(fence, ttl)| AcquireOutcome::Granted { fence, ttl }),
        1 => holder().prop_map(AcquireOutcome::HeldByAnother),
        1 => refusal().prop_map(AcquireOutcome::Refused),
        1 => indeterminate().prop_map(AcquireOutcome::Indeterminate),
    ]
}

fn renewed(ttl: impl Strategy<Value = Duration>) -> impl Strategy<Value = RenewOutcome> {
    prop_oneof![
        6 => ttl.prop_map(|ttl| RenewOutcome::Renewed { ttl }),
        1 => Just(RenewOutcome::NotOwner),
        1 => refusal().prop_map(RenewOutcome::Refused),
        2 => indeterminate().prop_map(RenewOutcome::Indeterminate),
    ]
}

fn released() -> impl Strategy<Value = ReleaseOutcome> {
    prop_oneof![
        Just(ReleaseOutcome::Released),
        Just(ReleaseOutcome::NotOwner),
        refusal().prop_map(ReleaseOutcome::Refused),
        indeterminate().prop_map(ReleaseOutcome::Indeterminate),
    ]
}

fn answer(ttl: impl Strategy<Value = Duration> + Clone) -> impl Strategy<Value = Op> {
    (acquired(ttl.clone()), renewed(ttl), released()).prop_map(|(acquire, renew, release)| {
        Op::Answer(Answer {
            acquire,
            renew,
            release,
        })
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Acquire),
        1 => prop_oneof![Just(0u64), 0u64..3_000_000].prop_map(Op::AcquireUntil),
        1 => Just(Op::Release),
        4 => Just(Op::Timeout),
        2 => (id(), acquired(ttl())).prop_map(|(id, o)| Op::AcquireResponse(id, o)),
        2 => (id(), renewed(ttl())).prop_map(|(id, o)| Op::RenewResponse(id, o)),
        1 => (id(), released()).prop_map(|(id, o)| Op::ReleaseResponse(id, o)),
        1 => prop::option::of(fence()).prop_map(Op::Revoked),
        6 => answer(ttl()),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    let lesson = Config::builder(Duration::from_millis(600));
    let random = (
        1_000u64..10_000_000,
        (10u64..45, 1u64..30, 1u64..30, 0u64..20),
        prop_oneof![Just(0u32), Just(1_000), Just(20_000), 0u32..200_000],
        any::<bool>(),
    )
        .prop_filter_map("a valid config", |(t, (r, q, y, m), drift, closed)| {
            let part = |pct: u64| Duration::from_micros(t * pct / 100);
            Config::builder(Duration::from_micros(t))
                .renew_interval(part(r))
                .request_timeout(part(q))
                .retry_interval(part(y))
                .margin(part(m))
                .drift_ppm(drift)
                .fail_closed(closed)
                .build()
                .ok()
        });
    prop_oneof![
        Just(lesson.build().unwrap()),
        Just(lesson.fail_closed(true).build().unwrap()),
        random,
    ]
}

/// Everything observable about a lease and its gate, but the stale counter.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    state: State,
    term: Term,
    fence: Option<Fence>,
    deadline: Option<Instant>,
    timeout: Option<Instant>,
    paused: bool,
    granted: Option<Duration>,
    gate: GateSnapshot,
}

struct Harness<C> {
    lease: Lease<C>,
    gate: WriteGate,
    /// The `now` of the latest input (it may go backwards).
    now: Instant,
    /// The latest `now` ever passed.
    latest: Instant,
    /// Ids of every request the lease asked to send, in order.
    ids: Vec<RequestId>,
    /// The newest acquire's id: while a term is held, the one that earned its grant.
    last_acquire: RequestId,
    last_action: Option<Action>,
    term: Term,
    last_deadline: Option<Instant>,
    last_gate_deadline: Option<Instant>,
    /// The state that ended the current term, once it ended.
    closed: Option<State>,
}

impl<C: Borrow<Config>> Harness<C> {
    fn observe(&self) -> Observed {
        Observed {
            state: self.lease.state(),
            term: self.lease.term(),
            fence: self.lease.fence(),
            deadline: self.lease.deadline(),
            timeout: self.lease.poll_timeout(),
            paused: self.lease.writes_paused(),
            granted: self.lease.granted_ttl(),
            gate: self.gate.snapshot().unwrap(),
        }
    }

    fn advance(&mut self, when: When) {
        let micros = self.now.as_micros();
        self.now = Instant::from_micros(match when {
            When::Same => micros,
            When::Forward(d) => micros.saturating_add(d),
            When::Back(d) => micros.saturating_sub(d),
            When::NextTimeout(nudge) => match self.lease.poll_timeout() {
                Some(t) => t.as_micros().saturating_add_signed(i64::from(nudge)),
                None => micros,
            },
            When::At(t) => t,
        });
        self.latest = self.latest.max(self.now);
    }

    fn id(&self, id: Id) -> RequestId {
        match id {
            Id::Current => self.ids.last().copied().unwrap_or(RequestId(0)),
            Id::Old(back) => (self.ids.iter().rev().nth(back + 1).copied()).unwrap_or(RequestId(0)),
            Id::Any(n) => RequestId(n),
        }
    }

    /// Whether an answer to request `id` of this kind is stale for sure, whatever
    /// happened inside the lease: it is not the newest request, or not of its kind.
    fn surely_stale(&self, id: RequestId, kind: fn(&Action) -> bool) -> bool {
        self.last_action
            .map_or(true, |last| last.id() != id || !kind(&last))
    }

    /// Applies `op`: how the lease handled it (`None` for what is no answer or notice),
    /// and whether it had to refuse it (anything but `Handled::Applied`).
    fn apply(&mut self, op: Op) -> (Option<Handled>, bool) {
        let (now, gate) = (self.now, &self.gate);
        let is_acquire = |a: &Action| matches!(a, Action::Acquire { .. });
        let is_renew = |a: &Action| matches!(a, Action::Renew { .. });
        let is_release = |a: &Action| matches!(a, Action::Release { .. });
        match op {
            Op::Acquire => {
                let _ = self.lease.acquire(now, gate);
                (None, false)
            }
            Op::AcquireUntil(wait) => {
                let give_up_at = now.saturating_add(Duration::from_micros(wait));
                let _ = self.lease.acquire_until(now, give_up_at, gate);
                (None, false)
            }
            Op::Release => {
                let _ = self.lease.release(now, gate);
                (None, false)
            }
            Op::Timeout => {
                self.lease.handle_timeout(now, gate);
                (None, false)
            }
            Op::AcquireResponse(id, o) => {
                let id = self.id(id);
                let must = self.surely_stale(id, is_acquire);
                let refused = self.lease.handle_response(now, id, o.into(), gate);
                (Some(refused), must)
            }
            Op::RenewResponse(id, o) => {
                let id = self.id(id);
                let must = self.surely_stale(id, is_renew);
                let refused = self.lease.handle_response(now, id, o.into(), gate);
                (Some(refused), must)
            }
            Op::ReleaseResponse(id, o) => {
                let id = self.id(id);
                let must = self.surely_stale(id, is_release);
                let refused = self.lease.handle_response(now, id, o.into(), gate);
                (Some(refused), must)
            }
            Op::Revoked(fence) => {
                let held = self.lease.fence();
                let fence = fence.or(held).unwrap_or(Fence(0));
                // Unless time alone expires the lease first, a notice about a fence
                // other than the one held is stale.
                let due = (self.lease.deadline()).is_some_and(|d| {
                    d != Instant::MAX && self.lease.latest_instant().max(now) >= d
                });
                let must = !due && held != Some(fence);
                let refused = self.lease.handle_revoked(now, fence, gate);
                (Some(refused), must)
            }
            Op::Answer(a) => {
                let (id, response) = self.answer(a);
                let refused = self.lease.handle_response(now, id, response, gate);
                (Some(refused), self.last_action.is_none())
            }
        }
    }

    /// The answer `a` gives to the newest request (to request 0 if there was none).
    fn answer(&self, a: Answer) -> (RequestId, Response) {
        match self.last_action {
            Some(Action::Acquire { id, .. }) => (id, a.acquire.into()),
            Some(Action::Renew { id, .. }) => (id, a.renew.into()),
            Some(Action::Release { id, .. }) => (id, a.release.into()),
            // An answer to nothing at all.
            None => (RequestId(0), a.acquire.into()),
        }
    }

    /// The request id and response `op` feeds in, if it is an answer.
    fn response_of(&self, op: Op) -> Option<(RequestId, Response)> {
        match op {
            Op::AcquireResponse(id, o) => Some((self.id(id), o.into())),
            Op::RenewResponse(id, o) => Some((self.id(id), o.into())),
            Op::ReleaseResponse(id, o) => Some((self.id(id), o.into())),
            Op::Answer(a) => Some(self.answer(a)),
            _ => None,
        }
    }

    /// The driving contract: drain every output.
    fn drain(&mut self) -> (Vec<Action>, Vec<Event>) {
        let mut actions = Vec::new();
        while let Some(action) = self.lease.poll_action() {
            self.ids.push(action.id());
            if matches!(action, Action::Acquire { .. }) {
                self.last_acquire = action.id();
            }
            self.last_action = Some(action);
            actions.push(action);
        }
        let mut events = Vec::new();
        while let Some(event) = self.lease.poll_event() {
            events.push(event);
        }
        (actions, events)
    }

    /// What must hold after every input.
    fn check(&mut self, events: &[Event]) -> Result<(), TestCaseError> {
        let seen = self.observe();
        let lease = &self.lease;
        prop_assert_eq!(
            lease.latest_instant(),
            self.latest,
            "time never goes backwards inside"
        );
        prop_assert_eq!(lease.stats().overwritten_events, 0);
        prop_assert_eq!(seen.gate.term, seen.term);
        let held = matches!(seen.state, State::Holding | State::RenewPending);
        prop_assert_eq!(seen.fence.is_some(), held);
        prop_assert_eq!(seen.deadline.is_some(), held);

        if seen.term != self.term {
            self.term = seen.term;
            self.last_deadline = None;
            self.last_gate_deadline = None;
            self.closed = None;
        }
        // Deadlines only move forward within a term.
        if let Some(deadline) = seen.deadline {
            if let Some(previous) = self.last_deadline {
                prop_assert!(deadline >= previous, "deadline moved back");
            }
            self.last_deadline = Some(deadline);
        }
        if matches!(seen.gate.status, GateStatus::Held | GateStatus::Paused) {
            if let Some(previous) = self.last_gate_deadline {
                prop_assert!(seen.gate.deadline >= previous, "gate deadline moved back");
            }
            self.last_gate_deadline = Some(seen.gate.deadline);
            prop_assert_eq!(Some(seen.gate.deadline), seen.deadline);
            prop_assert_eq!(Some(seen.gate.fence), seen.fence);
        }

        // Whenever the gate passes, the lease is held, unpaused, with that fence, and
        // the instant is before its deadline.
        let deadline = seen.deadline.unwrap_or(Instant::ZERO);
        let probes = [
            Instant::ZERO,
            self.now,
            self.latest,
            deadline.saturating_sub(Duration::from_micros(1)),
            deadline,
            Instant::MAX,
        ];
        for t in probes {
            if let Ok(fence) = self.gate.check(t) {
                prop_assert!(held && !seen.paused, "gate passes while {:?}", seen.state);
                prop_assert_eq!(Some(fence), seen.fence);
                prop_assert!(t < deadline, "gate passes at {} ≥ deadline {}", t, deadline);
            }
        }

        // A closed term stays closed, and its gate refuses at any instant.
        if let Some(closed) = self.closed {
            let fine = match closed {
                State::Lost(_) | State::Released | State::NotAcquired(_) => seen.state == closed,
                _ => matches!(seen.state, State::Releasing | State::Released),
            };
            prop_assert!(fine, "term closed as {:?}, now {:?}", closed, seen.state);
            for event in events {
                let reopened = matches!(event, Event::Acquired { .. } | Event::Renewed { .. });
                prop_assert!(!reopened, "{:?} in a closed term", event);
            }
        }
        if matches!(
            seen.state,
            State::Lost(_) | State::Releasing | State::Released | State::NotAcquired(_)
        ) {
            self.closed = Some(seen.state);
            for t in probes {
                prop_assert!(
                    self.gate.check(t).is_err(),
                    "closed term, gate passes at {}",
                    t
                );
            }
        }
        for event in events {
            match *event {
                Event::Lost { reason, .. } => {
                    prop_assert_eq!(seen.state, State::Lost(reason));
                    prop_assert_eq!(seen.gate.status, GateStatus::Lost(reason));
                }
                Event::Released => prop_assert_eq!(seen.gate.status, GateStatus::Released),
                Event::Acquired {
                    term,
                    fence,
                    granted,
                    ..
                } => {
                    prop_assert_eq!(term, seen.term);
                    prop_assert_eq!(Some(fence), seen.fence);
                    prop_assert_eq!(Some(granted), seen.granted);
                    prop_assert!(self.lease.config().accepts_grant(granted));
                }
                Event::AcquireFailed {
                    reason, retry_at, ..
                } => {
                    let over = matches!(seen.state, State::NotAcquired(r) if r == reason);
                    prop_assert_eq!(retry_at.is_none(), over, "{:?}", seen.state);
                    if reason == AcquireFailure::GrantTooShort {
                        prop_assert_eq!(seen.gate.status, GateStatus::Closed);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// What each step of a run showed: the lease after it, and its outputs.
type Trace = Vec<(Observed, Vec<Action>, Vec<Event>)>;

fn run<C: Borrow<Config>>(config: C, steps: &[(When, Op)]) -> Result<Trace, TestCaseError> {
    let mut trace = Trace::new();
    let mut h = Harness {
        lease: Lease::new(config, Owner([7; 16])),
        gate: WriteGate::new(),
        now: Instant::ZERO,
        latest: Instant::ZERO,
        ids: Vec::new(),
        last_acquire: RequestId(0),
        last_action: None,
        term: Term(0),
        last_deadline: None,
        last_gate_deadline: None,
        closed: None,
    };
    for &(when, op) in steps {
        h.advance(when);
        let before = h.observe();
        let latest_before = h.lease.latest_instant();
        let stale_before = h.lease.stats().stale_responses;
        let response = h.response_of(op);
        let newest = h.ids.last().copied().unwrap_or(RequestId(0));
        // A grant to an acquire of the current term (ids up to its newest) after the
        // term ended.
        let late_grant = match response {
            Some((id, Response::Acquire(AcquireOutcome::Granted { .. }))) => {
                let (term, seq, current) = ((id.0 >> 32) as u32, id.0 as u32, before.term.0);
                let ended = matches!(
                    before.state,
                    State::Released | State::NotAcquired(_) | State::Lost(_) | State::Releasing
                );
                (term == current && seq != 0 && id <= h.last_acquire && ended).then_some(term)
            }
            _ => None,
        };
        let busy = h.lease.is_awaiting(newest);
        // The id of the request in flight, answered with another kind of answer.
        let wrong_kind = match (response, h.last_action) {
            (Some((id, response)), Some(last)) if busy && id == newest => !matches!(
                (response, last),
                (Response::Acquire(_), Action::Acquire { .. })
                    | (Response::Renew(_), Action::Renew { .. })
                    | (Response::Release(_), Action::Release { .. })
            ),
            _ => false,
        };
        let (handled, must) = h.apply(op);
        let stale = handled.is_some_and(|handled| handled != Handled::Applied);
        prop_assert!(stale || !must, "a stale answer was taken: {:?}", op);
        let (actions, events) = h.drain();
        prop_assert!(
            actions.len() <= 1 && events.len() <= 1,
            "one output of each kind"
        );
        h.check(&events)?;

        let after = h.observe();
        trace.push((after.clone(), actions.clone(), events.clone()));
        let stale_after = h.lease.stats().stale_responses;
        if stale {
            // Time alone may expire a held lease: the only change a stale answer may see.
            let now = latest_before.max(h.now);
            // (`Instant::MAX` is the lease's "never": a deadline saturated there never
            // passes.)
            let expired = before
                .deadline
                .is_some_and(|d| d != Instant::MAX && now >= d);
            // A late renewal answer of the held term (sent after the acquire that
            // earned the grant) that proves the grant gone or shortened ends it (the
            // one other change a stale answer may make).
            let granted_by = h.last_acquire;
            let this_term = |id: RequestId| {
                id.0 >> 32 == u64::from(before.term.0) && id <= newest && id > granted_by
            };
            let proves = match response {
                Some((id, Response::Renew(outcome))) if this_term(id) => match outcome {
                    RenewOutcome::NotOwner => Some(LossReason::NotOwner),
                    RenewOutcome::Refused(_) => Some(LossReason::Refused),
                    RenewOutcome::Renewed { ttl } if Some(ttl) < before.granted => {
                        Some(LossReason::Shortened)
                    }
                    _ => None,
                },
                _ => None,
            };
            // Counted once, whatever it did.
            prop_assert_eq!(stale_after, stale_before.saturating_add(1));
            if expired {
                prop_assert_eq!(handled, Some(Handled::EndedTerm));
                prop_assert_eq!(after.state, State::Lost(LossReason::Expired));
                prop_assert!(
                    matches!(
                        events.as_slice(),
                        [Event::Lost {
                            reason: LossReason::Expired,
                            ..
                        }]
                    ),
                    "{:?}",
                    events
                );
            } else if let (Some(reason), Some(_)) = (proves, before.fence) {
                prop_assert_eq!(handled, Some(Handled::EndedTerm), "late {:?}", response);
                prop_assert_eq!(after.state, State::Lost(reason), "late {:?}", response);
                prop_assert!(
                    matches!(events.as_slice(), [Event::Lost { reason: r, .. }] if *r == reason),
                    "{:?}",
                    events
                );
            } else if let Some(term) = late_grant {
                prop_assert_eq!(handled, Some(Handled::ReleaseQueued));
                // Released again, nothing else changes (the gate stays as it was);
                // with a request in flight, the release waits for it.
                let unchanged = Observed {
                    timeout: before.timeout,
                    ..after.clone()
                };
                prop_assert_eq!(&unchanged, &before, "a late grant changed the lease");
                prop_assert!(events.is_empty());
                match actions.as_slice() {
                    [] => prop_assert!(busy, "the slot was free"),
                    [Action::Release { term: released, .. }] => {
                        prop_assert_eq!(*released, Term(term))
                    }
                    other => prop_assert!(false, "{:?} for a late grant", other),
                }
            } else {
                let why = if wrong_kind {
                    Handled::WrongKind
                } else {
                    Handled::Stale
                };
                prop_assert_eq!(handled, Some(why), "{:?}", op);
                prop_assert_eq!(&after, &before, "a stale answer changed the lease");
                prop_assert!(actions.is_empty() && events.is_empty());
            }
        } else {
            prop_assert_eq!(stale_after, stale_before);
        }

        if let Op::Timeout = op {
            // Idempotent: a second call at the same instant changes nothing.
            h.lease.handle_timeout(h.now, &h.gate);
            let (actions, events) = h.drain();
            prop_assert!(
                actions.is_empty() && events.is_empty(),
                "{:?}",
                (actions, events)
            );
            prop_assert_eq!(&h.observe(), &after);
        }
    }
    Ok(trace)
}

/// `PROPTEST_CASES` cases, or `default` (sized to keep a debug run well under 20 s).
/// A failing case is saved to `properties.proptest-regressions` beside this file and
/// replayed first from then on.
fn config_with_cases(default: u32) -> ProptestConfig {
    let cases = (std::env::var("PROPTEST_CASES").ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config_with_cases(1_000))]

    #[test]
    fn any_sequence_of_inputs_keeps_every_promise(
        config in config(),
        steps in prop::collection::vec((when(), op()), 1..80),
    ) {
        let owned = run(config, &steps)?;
        let lent = run::<&Config>(&config, &steps)?;
        prop_assert_eq!(owned, lent, "the borrowed config's run differs");
    }
}

/// Sequences that mostly follow the protocol (answers to the request in flight, the
/// TTL asked for, time moving forward) reach what arbitrary ones rarely do: long renew
/// chains, and answers racing their own deadlines.
fn orderly_op() -> impl Strategy<Value = (When, Op)> {
    let ttl = prop_oneof![
        6 => Just(600_000u64),
        1 => 0u64..1_200_000,
    ]
    .prop_map(Duration::from_micros);
    let later = prop_oneof![
        (0u64..50_000).prop_map(When::Forward),
        (-1i8..=1).prop_map(When::NextTimeout),
    ];
    (
        later,
        prop_oneof![
            2 => Just(Op::Acquire),
            1 => Just(Op::Release),
            12 => Just(Op::Timeout),
            24 => answer(ttl),
            1 => Just(Op::Revoked(None)),
            2 => (id(), renewed(Just(Duration::from_millis(600))))
                .prop_map(|(id, o)| Op::RenewResponse(id, o)),
        ],
    )
}

proptest! {
    #![proptest_config(config_with_cases(700))]

    #[test]
    fn orderly_sequences_keep_every_promise(
        steps in prop::collection::vec(orderly_op(), 1..120),
    ) {
        run(Config::builder(Duration::from_millis(600)).build().unwrap(), &steps)?;
    }
}

/// Found by the properties above: `Instant::MAX` is the lease's "never", and
/// `poll_timeout` says so, yet `handle_timeout(Instant::MAX)` used to treat a timer that
/// saturated to it as due — every call timed out the request and sent another.
#[test]
fn handle_timeout_at_the_end_of_time_is_idempotent() {
    let config = Config::builder(Duration::from_millis(600)).build().unwrap();
    let end = Instant::MAX;
    let ms = Duration::from_millis;
    let idle = |lease: &mut Lease, gate: &WriteGate| {
        for _ in 0..3 {
            lease.handle_timeout(end, gate);
            assert_eq!(lease.poll_action(), None);
            assert_eq!(lease.poll_event(), None);
        }
    };

    // A request sent at the end of time: its timeout saturates to "never".
    let (mut lease, gate) = (Lease::new(config, Owner([7; 16])), WriteGate::new());
    lease.acquire(end, &gate).unwrap();
    assert!(matches!(lease.poll_action(), Some(Action::Acquire { .. })));
    assert_eq!(lease.poll_timeout(), None);
    idle(&mut lease, &gate);

    // A retry that would fall past the end of time is "never" too.
    let (mut lease, gate) = (Lease::new(config, Owner([7; 16])), WriteGate::new());
    lease.acquire(end - ms(70), &gate).unwrap();
    assert!(matches!(lease.poll_action(), Some(Action::Acquire { .. })));
    lease.handle_timeout(end - ms(10), &gate);

    // The retry would fall past the end of time: the acquire gives up, releasing what
    // the timed-out attempt may have been granted.
    assert!(matches!(lease.poll_action(), Some(Action::Release { .. })));
    let failed = lease.poll_event();
    assert!(
        matches!(
            failed,
            Some(Event::AcquireFailed {
                reason: AcquireFailure::Indeterminate(Indeterminate::Timeout),
                retry_at: None,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(lease.poll_timeout(), None);
    idle(&mut lease, &gate);
}
