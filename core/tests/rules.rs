//! One test per rule of `leasehold::rules` (core/RULES.md), written as timelines with
//! explicit instants; the `contract_*` tests pin down the service contract's TTL
//! semantics, final refusals and bounded acquires as the core follows them.
//!
//! Config used unless a test says otherwise: T = 900 ms, renew every 300 ms, request
//! timeout 90 ms, retry every 45 ms, margin 45 ms, drift 1,000 ppm (0.9 ms of 900 ms).
//! So a grant of 900 ms for a request sent at `s` is safe until `s + 854.1 ms`.

use leasehold::*;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
const fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}
const fn at_us(n: u64) -> Instant {
    Instant::from_micros(n)
}

/// Safe window of a 900 ms grant: 900 − 0.9 (drift) − 45 (margin) ms.
const WINDOW_US: u64 = 854_100;

/// The owner every test lease presents unless a test says otherwise.
const OWNER: Owner = Owner(*b"rules test owner");

/// An owner numbered `n` (a serial number in its last four bytes).
fn owner(n: u32) -> Owner {
    let mut bytes = [0; 16];
    bytes[12..].copy_from_slice(&n.to_be_bytes());
    Owner(bytes)
}

/// `assert!(matches!(value, pattern if guard))` that prints the value when it fails.
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {
        // `match`, not `let`: a temporary in `$value` lives to the end of the arm.
        match $value {
            value => assert!(
                matches!(value, $pattern $(if $guard)?),
                "{value:?} does not match {}",
                stringify!($pattern $(if $guard)?)
            ),
        }
    };
}

/// Asserts that a response or notice was the one awaited.
trait AssertApplied {
    fn applied(self);
}

impl AssertApplied for Handled {
    #[track_caller]
    fn applied(self) {
        assert_eq!(self, Handled::Applied);
    }
}

struct Rig {
    lease: Lease,
    gate: WriteGate,
}

impl Rig {
    fn new() -> Rig {
        Rig::with(Config::builder(ms(900)).build().unwrap())
    }

    fn with(config: Config) -> Rig {
        Rig {
            lease: Lease::new(config, OWNER),
            gate: WriteGate::new(),
        }
    }

    /// Starts a term at `now`; returns the acquire request.
    #[track_caller]
    fn start(&mut self, now: Instant) -> RequestId {
        self.lease.acquire(now, &self.gate).unwrap();
        match self.lease.poll_action() {
            Some(Action::Acquire { id, ttl, .. }) => {
                assert_eq!(ttl, ms(900));
                id
            }
            other => panic!("expected an acquire, got {other:?}"),
        }
    }

    /// Acquire sent at `sent`, granted with `fence`, answered at `received`.
    #[track_caller]
    fn hold(&mut self, sent: Instant, received: Instant, fence: u64) {
        let id = self.start(sent);
        self.grant(received, id, fence, ms(900));
        assert!(matches!(
            self.lease.poll_event(),
            Some(Event::Acquired { .. })
        ));
    }

    #[track_caller]
    fn grant(&mut self, now: Instant, id: RequestId, fence: u64, ttl: Duration) {
        let granted = AcquireOutcome::Granted {
            fence: Fence(fence),
            ttl,
        };
        self.lease
            .handle_response(now, id, granted.into(), &self.gate)
            .applied();
    }

    /// Fires the timer at `now`; returns the renewal it sends.
    #[track_caller]
    fn renewal_due(&mut self, now: Instant) -> RequestId {
        self.lease.handle_timeout(now, &self.gate);
        match self.lease.poll_action() {
            Some(Action::Renew { id, .. }) => id,
            other => panic!("expected a renewal at {now}, got {other:?}"),
        }
    }

    #[track_caller]
    fn renew_answer(&mut self, now: Instant, id: RequestId, outcome: RenewOutcome) {
        self.lease
            .handle_response(now, id, outcome.into(), &self.gate)
            .applied();
    }

    fn check(&self, now: Instant) -> Result<Fence, GateError> {
        self.gate.check(now)
    }

    fn drain_events(&mut self) -> Vec<Event> {
        core::iter::from_fn(|| self.lease.poll_event()).collect()
    }
}

const RENEWED: RenewOutcome = RenewOutcome::Renewed { ttl: ms(900) };
const BLIP: RenewOutcome = RenewOutcome::Indeterminate(Indeterminate::Transport);

// ----- Rule 1: deadline from send time --------------------------------------------

#[test]
fn rule1_deadline_counts_from_send_time_not_receive_time() {
    let mut r = Rig::new();
    // Sent at 10 ms, answered 50 ms later.
    r.hold(at(10), at(60), 7);
    let deadline = at_us(10_000 + WINDOW_US);
    assert_eq!(r.lease.deadline(), Some(deadline));
    assert_eq!(r.check(deadline - Duration::from_micros(1)), Ok(Fence(7)));
    assert!(
        r.check(deadline).is_err(),
        "the gate refuses at the deadline"
    );

    // A renewal sent at 310 ms and answered at 400 ms counts from 310 ms.
    let id = r.renewal_due(at(310));
    r.renew_answer(at(400), id, RENEWED);
    assert_eq!(r.lease.deadline(), Some(at_us(310_000 + WINDOW_US)));
}

#[test]
fn rule1_drift_bound_is_taken_off_the_granted_ttl() {
    let config = Config::builder(ms(10_000))
        .drift_ppm(20_000) // ±2 %
        .margin(ms(100))
        .build()
        .unwrap();
    let mut r = Rig::with(config);
    let id = {
        r.lease.acquire(at(0), &r.gate).unwrap();
        r.lease.poll_action().unwrap().id()
    };
    // The service granted 5 s instead of the 10 s asked for: the grant counts.
    r.grant(at(1), id, 1, ms(5_000));
    // 5 s − 2 % (100 ms) − 100 ms margin.
    assert_eq!(r.lease.deadline(), Some(at(4_800)));
}

#[test]
fn rule1_a_success_after_its_own_safe_deadline_is_not_a_success() {
    let mut r = Rig::new();
    let id = r.start(at(0));
    // The grant arrives 860 ms after it was sent: past its own safe window.
    r.grant(at(860), id, 3, ms(900));
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_eq!(r.check(at(860)), Err(GateError::Lost(LossReason::Expired)));
    // The gate never opened, and the key is freed, best effort.
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Release { .. })
    ));
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Lost {
            reason: LossReason::Expired,
            ..
        }]
    );

    // Same for a renewal: sent at 300, answered after 300 + window but before the
    // current deadline can't happen with equal grants, so use a short grant.
    let mut r = Rig::new();
    r.hold(at(0), at(1), 1);
    let id = r.renewal_due(at(300));
    let deadline_before = r.lease.deadline();
    r.renew_answer(at(400), id, RenewOutcome::Renewed { ttl: ms(100) });
    // 300 + 100 ms is long past: the service may have expired the key already.
    assert_eq!(r.lease.state(), State::Lost(LossReason::Shortened));
    assert!(r.gate.snapshot().unwrap().deadline <= deadline_before.unwrap());
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Lost {
            reason: LossReason::Shortened,
            ..
        }]
    );
}

#[test]
fn rule1_a_deadline_only_moves_forward() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 1);
    let first = r.lease.deadline().unwrap();
    // A renewal that the service confirms with a much shorter TTL would move the
    // deadline back: the old deadline can't be trusted any more, the term ends.
    let id = r.renewal_due(at(300));
    r.renew_answer(at(301), id, RenewOutcome::Renewed { ttl: ms(500) });
    assert_eq!(r.lease.state(), State::Lost(LossReason::Shortened));
    assert!(r.check(at(301)).is_err());
    assert!(r.gate.snapshot().unwrap().deadline <= first);

    // A normal renewal moves it forward.
    let mut r = Rig::new();
    r.hold(at(0), at(1), 1);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(301), id, RENEWED);
    assert!(r.lease.deadline().unwrap() > first);
}

// ----- Rule 2: renew every T/3, with the owner token of the term ------------------

#[test]
fn rule2_renews_every_third_of_the_ttl_from_send_times() {
    let mut r = Rig::new();
    r.hold(at(0), at(20), 1);
    assert_eq!(r.lease.poll_timeout(), Some(at(300)));
    // An early timer call does nothing.
    r.lease.handle_timeout(at(299), &r.gate);
    assert_eq!(r.lease.poll_action(), None);
    let mut sent = 300;
    for _ in 0..10 {
        let id = r.renewal_due(at(sent));
        // Answers take 40 ms; the cadence stays locked to send times.
        r.renew_answer(at(sent + 40), id, RENEWED);
        assert_eq!(r.lease.poll_timeout(), Some(at(sent + 300)));
        sent += 300;
    }
}

#[test]
fn rule2_every_request_presents_the_term_so_an_old_term_cannot_touch_a_new_one() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 1);
    let renew = {
        r.lease.handle_timeout(at(300), &r.gate);
        r.lease.poll_action().unwrap()
    };
    assert_eq!(renew.term(), Term(1));
    r.lease.release(at(310), &r.gate).unwrap();
    let release = r.lease.poll_action().unwrap();
    assert!(matches!(release, Action::Release { term: Term(1), .. }));
    // A new term right away: its requests present term 2, so the service compares a
    // different owner token and the old release cannot delete the new grant.
    r.lease.acquire(at(311), &r.gate).unwrap();
    let acquire = r.lease.poll_action().unwrap();
    assert_eq!(acquire.term(), Term(2));
    let owner = Owner([9; 16]);
    assert_ne!(owner.token(release.term()), owner.token(acquire.term()));
}

// ----- Rule 3: a blip is not loss ------------------------------------------------

#[test]
fn rule3_a_blip_is_retried_inside_the_budget_and_the_lease_survives() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(310), id, BLIP);
    assert_eq!(r.lease.state(), State::RenewPending);
    assert_eq!(r.check(at(311)), Ok(Fence(5)), "still held: writes go on");
    let events = r.drain_events();
    assert!(matches!(
        events.as_slice(),
        [Event::RenewFailed {
            retry_at: Some(t),
            writes_paused: false,
            ..
        }] if *t == at(355)
    ));
    // The retry goes out after the retry interval and succeeds.
    let id = r.renewal_due(at(355));
    r.renew_answer(at(360), id, RENEWED);
    assert_eq!(r.lease.state(), State::Holding);
    assert_eq!(r.lease.deadline(), Some(at_us(355_000 + WINDOW_US)));
}

#[test]
fn rule3_a_request_timeout_is_a_blip_too() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let first = r.renewal_due(at(300));
    // No answer within 90 ms: indeterminate, retried 45 ms later.
    r.lease.handle_timeout(at(390), &r.gate);
    assert!(matches!(
        r.drain_events().as_slice(),
        [Event::RenewFailed {
            reason: Indeterminate::Timeout,
            ..
        }]
    ));
    assert!(!r.lease.is_awaiting(first), "the driver may drop its I/O");
    let retry = r.renewal_due(at(435));
    assert_ne!(retry, first);
}

#[test]
fn rule3_never_retries_past_the_safe_deadline() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let deadline = r.lease.deadline().unwrap();
    let mut now = at(300);
    let mut sent_after_deadline = 0;
    // Every renewal fails; follow the lease's own timer until it gives up.
    while let Some(t) = r.lease.poll_timeout() {
        now = now.max(t);
        r.lease.handle_timeout(now, &r.gate);
        if let Some(action) = r.lease.poll_action() {
            if now >= deadline && matches!(action, Action::Renew { .. }) {
                sent_after_deadline += 1;
            }
            if let Action::Renew { id, .. } = action {
                let _ = r.lease.handle_response(now, id, BLIP.into(), &r.gate);
            }
        }
        if matches!(r.lease.state(), State::Lost(_)) {
            break;
        }
    }
    assert_eq!(sent_after_deadline, 0);
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_eq!(now, deadline, "lost exactly at the safe deadline");

    // A blip so close to the deadline that no retry fits schedules none.
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate);
    let _ = r.drain_events();
    let _ = id;
    let late = r.renewal_due(at(820));
    r.renew_answer(at(830), late, BLIP);
    assert!(matches!(
        r.drain_events().as_slice(),
        [Event::RenewFailed { retry_at: None, .. }]
    ));
    assert_eq!(r.lease.poll_timeout(), r.lease.deadline());
}

// ----- Rule 4: NOT_OWNER is definitive -------------------------------------------

#[test]
fn rule4_not_owner_loses_at_once_and_differs_from_expired() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(305), id, RenewOutcome::NotOwner);
    // Well before the deadline, on that very step.
    assert_eq!(r.lease.state(), State::Lost(LossReason::NotOwner));
    assert_eq!(r.check(at(305)), Err(GateError::Lost(LossReason::NotOwner)));
    // No release: the key is not ours to delete.
    assert_eq!(r.lease.poll_action(), None);
    assert_ne!(LossReason::NotOwner, LossReason::Expired);
}

#[test]
fn rule4_a_revocation_notice_for_the_held_fence_loses_at_once() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    // A notice about another grant is stale.
    assert_eq!(
        r.lease.handle_revoked(at(100), Fence(4), &r.gate),
        Handled::Stale
    );
    assert_eq!(r.check(at(100)), Ok(Fence(5)));
    r.lease.handle_revoked(at(101), Fence(5), &r.gate).applied();
    assert_eq!(r.check(at(101)), Err(GateError::Lost(LossReason::Revoked)));
}

// ----- Rule 5: lost means stop, immediately --------------------------------------

#[test]
fn rule5_the_gate_flips_before_any_output_of_the_step() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let _ = r.renewal_due(at(300));
    // The deadline passes with the renewal unanswered.
    r.lease.handle_timeout(at_us(WINDOW_US), &r.gate);
    // Before anything is polled, the gate already refuses.
    assert_eq!(
        r.check(at_us(WINDOW_US - 1)),
        Err(GateError::Lost(LossReason::Expired)),
        "refused even for a worker whose clock reads earlier"
    );
    // Only then: the best-effort release and the notification.
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Release { .. })
    ));
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Lost {
            reason: LossReason::Expired,
            ..
        }]
    );
}

#[test]
fn rule5_unlock_is_best_effort_and_never_needed_for_the_flip() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let _ = r.renewal_due(at(300));
    r.lease.handle_timeout(at_us(WINDOW_US), &r.gate);
    let release = r.lease.poll_action().unwrap();
    // The release never gets an answer; the term is over anyway, and the release's
    // timeout and its retries change nothing but what is sent.
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    r.lease.handle_timeout(at(2_000), &r.gate);
    assert!(!r.lease.is_awaiting(release.id()));
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_eq!(
        r.check(at(2_000)),
        Err(GateError::Lost(LossReason::Expired))
    );
    assert!(r
        .drain_events()
        .iter()
        .all(|e| matches!(e, Event::Lost { .. })));
}

/// Sends every release the lease asks for until it stops, none of them answered (each
/// times out); returns their send instants. Fires each timer when it is due.
fn releases_until_silent(r: &mut Rig) -> Vec<Instant> {
    let mut sent = Vec::new();
    let mut now = at(0);
    while let Some(due) = r.lease.poll_timeout() {
        now = now.max(due);
        r.lease.handle_timeout(now, &r.gate);
        while let Some(action) = r.lease.poll_action() {
            assert!(matches!(action, Action::Release { .. }), "{action:?}");
            sent.push(now);
        }
        assert!(sent.len() < 1_000, "the retries never stop");
    }
    sent
}

#[test]
fn rule6_a_release_whose_answer_is_lost_is_retried_within_twice_the_ttl() {
    // After a voluntary release and after a loss alike.
    for lose in [false, true] {
        let mut r = Rig::new();
        r.hold(at(0), at(1), 5);
        let first = if lose {
            r.lease.handle_timeout(at_us(WINDOW_US), &r.gate);
            at_us(WINDOW_US)
        } else {
            r.lease.release(at(100), &r.gate).unwrap();
            at(100)
        };
        let id = r.lease.poll_action().unwrap().id();
        r.lease
            .handle_response(
                first + ms(5),
                id,
                ReleaseOutcome::Indeterminate(Indeterminate::Transport).into(),
                &r.gate,
            )
            .applied();
        // The term ended at the first answer; the release goes on in the background.
        assert!(matches!(r.lease.state(), State::Released | State::Lost(_)));
        let retries = releases_until_silent(&mut r);
        // Jittered: 22.5 to 67.5 ms after each failure (a timeout is 90 ms), so
        // between 1,800 / 157.5 and 1,800 / 112.5 of them fit in 2 T.
        assert!((11..=17).contains(&retries.len()), "{}", retries.len());
        assert!(
            retries.iter().all(|&t| t < first + ms(1_800)),
            "{retries:?}"
        );
        assert!(
            retries.windows(2).all(|w| w[1] - w[0] >= ms(112)),
            "{retries:?}"
        );
        assert_eq!(r.lease.poll_timeout(), None);
        assert!(r.check(at(3_000)).is_err());
    }
}

#[test]
fn rule6_a_release_stops_at_its_first_answer_that_is_not_unknown() {
    for last in [
        ReleaseOutcome::Released,
        ReleaseOutcome::NotOwner,
        ReleaseOutcome::Refused(Refusal::Unauthorized),
    ] {
        let mut r = Rig::new();
        r.hold(at(0), at(1), 5);
        r.lease.release(at(100), &r.gate).unwrap();
        let mut id = r.lease.poll_action().unwrap().id();
        let unknown = ReleaseOutcome::Indeterminate(Indeterminate::Timeout);
        for _ in 0..3 {
            r.lease
                .handle_response(r.lease.poll_timeout().unwrap(), id, unknown.into(), &r.gate)
                .applied();
            let retry_at = r.lease.poll_timeout().expect("a retry is scheduled");
            r.lease.handle_timeout(retry_at, &r.gate);
            match r.lease.poll_action() {
                Some(Action::Release { id: next, .. }) => id = next,
                other => panic!("{other:?}"),
            }
        }
        r.lease
            .handle_response(at(1_000), id, last.into(), &r.gate)
            .applied();
        assert_eq!(r.lease.poll_timeout(), None, "{last:?}");
        assert_eq!(r.lease.poll_action(), None);
        assert_eq!(r.lease.state(), State::Released);
        // Only the first answer ended the term.
        assert_eq!(r.drain_events(), [Event::Released]);
    }
}

#[test]
fn rule6_a_new_term_stops_the_old_terms_release() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    r.lease.release(at(100), &r.gate).unwrap();
    let id = r.lease.poll_action().unwrap().id();
    r.lease
        .handle_response(
            at(105),
            id,
            ReleaseOutcome::Indeterminate(Indeterminate::Transport).into(),
            &r.gate,
        )
        .applied();
    assert!(r.lease.poll_timeout().is_some());
    let _ = r.start(at(110));
    // Only the acquire's own timers: its request timeout.
    assert_eq!(r.lease.poll_timeout(), Some(at(200)));
}

#[test]
fn rule5_a_worker_waking_from_a_pause_is_refused_before_the_driver_runs() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    // Driver and worker both stop for 1 s (longer than T). The worker wakes first.
    assert!(matches!(
        r.check(at(1_000)),
        Err(GateError::DeadlinePassed { .. })
    ));
}

// ----- Rule 6: release --------------------------------------------------------------

#[test]
fn rule6_release_closes_the_gate_first_then_asks_the_service() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    r.lease.release(at(100), &r.gate).unwrap();
    assert_eq!(r.check(at(100)), Err(GateError::Released));
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Release { .. })
    ));
    assert_eq!(r.lease.state(), State::Releasing);
}

#[test]
fn rule6_a_failed_or_timed_out_release_still_ends_released() {
    for answer in [
        Some(ReleaseOutcome::Released),
        Some(ReleaseOutcome::NotOwner),
        Some(ReleaseOutcome::Indeterminate(Indeterminate::Transport)),
        None, // no answer at all
    ] {
        let mut r = Rig::new();
        r.hold(at(0), at(1), 5);
        r.lease.release(at(100), &r.gate).unwrap();
        let id = r.lease.poll_action().unwrap().id();
        match answer {
            Some(outcome) => r
                .lease
                .handle_response(at(110), id, outcome.into(), &r.gate)
                .applied(),
            None => {
                assert_eq!(r.lease.poll_timeout(), Some(at(190)));
                r.lease.handle_timeout(at(190), &r.gate);
            }
        }
        assert_eq!(r.lease.state(), State::Released, "{answer:?}");
        assert_eq!(r.drain_events(), [Event::Released]);
        assert_eq!(r.check(at(200)), Err(GateError::Released));
    }
}

#[test]
fn rule6_releasing_while_acquiring_frees_a_grant_that_may_have_happened() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.lease.release(at(5), &r.gate).unwrap();
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Release { .. })
    ));
    // The grant that raced the release is stale: the gate never opens.
    let granted = AcquireOutcome::Granted {
        fence: Fence(1),
        ttl: ms(900),
    };
    assert_eq!(
        r.lease
            .handle_response(at(6), acquire, granted.into(), &r.gate),
        Handled::ReleaseQueued
    );
    assert!(r.check(at(6)).is_err());
}

/// A late grant: the acquire `id` answered `Granted` (fence 9, 900 ms).
fn late_grant(r: &mut Rig, now: Instant, id: RequestId) -> Handled {
    let granted = AcquireOutcome::Granted {
        fence: Fence(9),
        ttl: ms(900),
    };
    r.lease.handle_response(now, id, granted.into(), &r.gate)
}

/// The release the lease asks for next, as (id, term).
#[track_caller]
fn release_sent(r: &mut Rig) -> (RequestId, Term) {
    match r.lease.poll_action() {
        Some(Action::Release { id, term, .. }) => (id, term),
        other => panic!("expected a release, got {other:?}"),
    }
}

/// The user releases while the acquire is in flight; the release reaches the service
/// first and finds nothing ("not owner"), the term is released; then the acquire is
/// applied, the service grants it, and the grant arrives. The key is held by this
/// term's token: the lease sends a second release of the term, and its gate stays
/// closed.
#[test]
fn rule6_a_grant_that_arrives_after_the_release_was_answered_is_released_again() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.lease.release(at(10), &r.gate).unwrap();
    let (release, _) = release_sent(&mut r);
    r.lease
        .handle_response(at(20), release, ReleaseOutcome::NotOwner.into(), &r.gate)
        .applied();
    assert_eq!(r.lease.state(), State::Released);
    assert_eq!(r.drain_events(), [Event::Released]);

    assert_eq!(late_grant(&mut r, at(30), acquire), Handled::ReleaseQueued);
    assert_eq!(r.lease.stats().stale_responses, 1);
    let (again, term) = release_sent(&mut r);
    assert_eq!(term, Term(1));
    assert!(again > release, "a new request id");
    assert_eq!(r.lease.state(), State::Released);
    assert_eq!(r.drain_events(), []);
    assert_eq!(r.check(at(30)), Err(GateError::Released), "never opens");
    assert_eq!(
        r.lease.poll_timeout(),
        Some(at(120)),
        "bounded by its timeout"
    );
    // Its answer ends nothing more: nothing left to send or time.
    r.lease
        .handle_response(at(40), again, ReleaseOutcome::Released.into(), &r.gate)
        .applied();
    assert_eq!(r.lease.poll_action(), None);
    assert_eq!(r.lease.poll_timeout(), None);
    assert_eq!(r.drain_events(), []);
    assert_eq!(r.lease.state(), State::Released);
}

/// Only a grant to an acquire the lease really sent is released again: not one to an
/// id never handed out, nor to the release's own id, nor a late "held by another".
#[test]
fn rule6_only_a_grant_to_an_acquire_that_was_sent_is_released_again() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.lease.release(at(10), &r.gate).unwrap();
    let (release, _) = release_sent(&mut r);
    r.lease
        .handle_response(at(20), release, ReleaseOutcome::NotOwner.into(), &r.gate)
        .applied();
    let _ = r.drain_events();
    let never_sent = RequestId(release.0 + 1);
    for id in [
        never_sent,
        release,
        RequestId((2 << 32) | 1),
        RequestId(1 << 32),
    ] {
        assert_eq!(late_grant(&mut r, at(30), id), Handled::Stale);
        assert_eq!(r.lease.poll_action(), None, "{id:?}");
    }
    let held = AcquireOutcome::HeldByAnother(Holder {
        identity: Identity::EMPTY,
        fence: Fence(1),
        remaining: ms(500),
    });
    assert_eq!(
        r.lease
            .handle_response(at(31), acquire, held.into(), &r.gate),
        Handled::Stale
    );
    assert_eq!(r.lease.poll_action(), None);
    assert_eq!(r.lease.stats().stale_responses, 5);
}

/// The grant arrives while the release is in flight: the service may have handled
/// the release first, so a second release follows once the first is answered.
#[test]
fn rule6_a_late_grant_while_the_release_is_in_flight_is_released_after_it() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.lease.release(at(10), &r.gate).unwrap();
    let (release, _) = release_sent(&mut r);
    assert_eq!(late_grant(&mut r, at(15), acquire), Handled::ReleaseQueued);
    assert_eq!(r.lease.poll_action(), None, "one request in flight");
    assert!(r.lease.is_awaiting(release));
    r.lease
        .handle_response(at(20), release, ReleaseOutcome::NotOwner.into(), &r.gate)
        .applied();
    assert_eq!(r.drain_events(), [Event::Released]);
    assert_eq!(release_sent(&mut r).1, Term(1));
    assert!(r.check(at(20)).is_err());
}

/// The same after the term ended otherwise: given up at its wait bound (an attempt
/// timed out, its release was answered), or lost to "not owner" (a late duplicate of
/// the acquire re-created the key for the term's token).
#[test]
fn rule6_a_late_grant_after_giving_up_or_a_loss_is_released_again() {
    let mut r = Rig::new();
    r.lease.acquire_until(at(0), at(100), &r.gate).unwrap();
    let acquire = r.lease.poll_action().unwrap().id();
    r.lease.handle_timeout(at(90), &r.gate); // unanswered; the bound is near
    assert!(matches!(r.lease.state(), State::NotAcquired(_)));
    let (release, _) = release_sent(&mut r);
    r.lease
        .handle_response(at(95), release, ReleaseOutcome::NotOwner.into(), &r.gate)
        .applied();
    assert_eq!(late_grant(&mut r, at(120), acquire), Handled::ReleaseQueued);
    assert_eq!(release_sent(&mut r).1, Term(1));
    assert!(r.check(at(120)).is_err());

    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.grant(at(1), acquire, 5, ms(900));
    let renewal = r.renewal_due(at(300));
    r.renew_answer(at(301), renewal, RenewOutcome::NotOwner);
    assert_eq!(r.lease.poll_action(), None, "not owner: nothing to delete");
    assert_eq!(late_grant(&mut r, at(302), acquire), Handled::ReleaseQueued);
    assert_eq!(release_sent(&mut r).1, Term(1));
    assert_eq!(r.lease.state(), State::Lost(LossReason::NotOwner));
    assert!(r.check(at(302)).is_err());
}

/// While the term is still acquiring or held, a late grant to one of its acquires
/// needs nothing: the key is the term's (its next attempt gets the same fence).
#[test]
fn rule6_a_late_grant_of_the_running_term_sends_nothing() {
    let mut r = Rig::new();
    let first = r.start(at(0));
    r.lease.handle_timeout(at(90), &r.gate); // times out, a retry is scheduled
    assert_eq!(late_grant(&mut r, at(91), first), Handled::Stale);
    assert_eq!(r.lease.poll_action(), None);
    assert_eq!(r.lease.state(), State::Acquiring);
    let retry = r.lease.poll_timeout().unwrap();
    r.lease.handle_timeout(retry, &r.gate);
    let second = r.lease.poll_action().unwrap().id();
    r.grant(retry + ms(1), second, 9, ms(900));
    assert_eq!(late_grant(&mut r, retry + ms(2), first), Handled::Stale);
    assert_eq!(r.lease.poll_action(), None);
    assert_eq!(r.lease.state(), State::Holding);
}

/// A late grant of an older term is only counted: the lease tracks only the current
/// term's acquires, and the older grant expires by its TTL.
#[test]
fn rule6_a_late_grant_of_an_older_term_is_only_counted() {
    let mut r = Rig::new();
    let old = r.start(at(0));
    r.lease.release(at(10), &r.gate).unwrap();
    let (release, _) = release_sent(&mut r);
    r.lease
        .handle_response(at(20), release, ReleaseOutcome::NotOwner.into(), &r.gate)
        .applied();
    let _ = r.drain_events();
    let newer = r.start(at(30));
    let stale = r.lease.stats().stale_responses;
    assert_eq!(late_grant(&mut r, at(31), old), Handled::Stale);
    assert_eq!(r.lease.stats().stale_responses, stale + 1);
    assert_eq!(
        r.lease.poll_action(),
        None,
        "the newer acquire is in flight"
    );
    r.grant(at(32), newer, 10, ms(900));
    assert_eq!(r.lease.state(), State::Holding);
}

// ----- Rule 7: fail-closed ----------------------------------------------------------

#[test]
fn rule7_fail_closed_pauses_writes_until_a_renewal_is_confirmed() {
    let config = Config::builder(ms(900)).fail_closed(true).build().unwrap();
    let mut r = Rig::with(config);
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    assert_eq!(
        r.check(at(301)),
        Ok(Fence(5)),
        "a renewal in flight is normal"
    );
    r.renew_answer(at(310), id, BLIP);
    assert_eq!(r.check(at(311)), Err(GateError::Paused));
    assert!(r.lease.writes_paused());
    let id = r.renewal_due(at(355));
    assert_eq!(r.check(at(356)), Err(GateError::Paused), "still unknown");
    r.renew_answer(at(360), id, RENEWED);
    assert_eq!(r.check(at(361)), Ok(Fence(5)), "confirmed: writes resume");
}

#[test]
fn rule7_without_fail_closed_writes_continue_through_a_blip() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(310), id, BLIP);
    assert_eq!(r.check(at(311)), Ok(Fence(5)));
}

// ----- Rule 8: stale responses --------------------------------------------------

#[test]
fn rule8_stale_responses_are_ignored_counted_and_extend_nothing() {
    let mut r = Rig::new();
    let first_acquire = r.start(at(0));
    r.grant(at(1), first_acquire, 5, ms(900));
    let _ = r.drain_events();
    let old = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate); // times out
    let current = r.renewal_due(at(435));
    let deadline = r.lease.deadline();

    // The timed-out renewal answers late: ignored, even though it says "renewed".
    assert_eq!(
        r.lease
            .handle_response(at(440), old, RENEWED.into(), &r.gate),
        Handled::Stale
    );
    // An unknown id; the acquire answered twice; the wrong kind of answer.
    assert_eq!(
        r.lease
            .handle_response(at(441), RequestId(999), RENEWED.into(), &r.gate),
        Handled::Stale
    );
    let granted = AcquireOutcome::Granted {
        fence: Fence(6),
        ttl: ms(900),
    };
    assert_eq!(
        r.lease
            .handle_response(at(442), first_acquire, granted.into(), &r.gate),
        Handled::Stale
    );
    assert_eq!(
        r.lease
            .handle_response(at(443), current, ReleaseOutcome::Released.into(), &r.gate),
        Handled::WrongKind
    );
    assert_eq!(r.lease.deadline(), deadline);
    assert_eq!(r.lease.stats().stale_responses, 4);
    assert_eq!(r.check(at(444)), Ok(Fence(5)));
    // The current one still counts.
    r.renew_answer(at(450), current, RENEWED);
    assert_eq!(r.lease.deadline(), Some(at_us(435_000 + WINDOW_US)));
}

#[test]
fn rule8_answers_from_a_previous_term_cannot_reopen_the_gate() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let old_renewal = r.renewal_due(at(300));
    r.renew_answer(at(301), old_renewal, RenewOutcome::NotOwner);
    let _ = r.drain_events();
    // New term; its acquire is pending. The old term's renewal answer shows up.
    let _ = r.start(at(400));
    assert_eq!(
        r.lease
            .handle_response(at(401), old_renewal, RENEWED.into(), &r.gate),
        Handled::Stale
    );
    assert_eq!(r.lease.state(), State::Acquiring);
    assert_eq!(r.check(at(401)), Err(GateError::NotHeld));
}

/// An input past the deadline expires the term first, which queues the loss's release
/// under the next id; an answer that carries that id answers a request never handed
/// out. It is stale: counted, and the release still goes out.
#[test]
fn rule8_an_answer_for_the_id_the_expiry_just_queued_is_stale_and_the_release_goes_out() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.grant(at(1), acquire, 5, ms(900));
    let _ = r.drain_events();
    let next = RequestId(acquire.0 + 1);
    assert_eq!(
        r.lease
            .handle_response(at(900), next, ReleaseOutcome::Released.into(), &r.gate),
        Handled::EndedTerm
    );
    assert_eq!(r.lease.stats().stale_responses, 1);
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_eq!(release_sent(&mut r), (next, Term(1)));
    assert!(r.lease.is_awaiting(next));
}

// ----- Rule 8: what an answer did (`Handled`) ---------------------------------------

/// A driver loop that skips the drain whenever an answer is ignored (`Handled::changed`), and
/// otherwise drains `poll_event`: what it saw.
fn deliver_skipping_ignored(r: &mut Rig, answers: &[(Instant, RequestId, Response)]) -> Vec<Event> {
    let mut seen = Vec::new();
    for &(now, id, response) in answers {
        if let Handled::Stale | Handled::WrongKind =
            r.lease.handle_response(now, id, response, &r.gate)
        {
            continue;
        }
        while let Some(event) = r.lease.poll_event() {
            seen.push(event);
        }
    }
    seen
}

/// A late "not owner" to a renewal of the held term is not the answer awaited, yet it
/// ends the term: it is `EndedTerm`, not `Stale`, so a loop that skips the drain on
/// ignored answers still sees the loss.
#[test]
fn rule8_a_loop_that_skips_ignored_answers_still_sees_a_late_not_owner() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let late = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate); // times out, a retry is scheduled
    let _ = r.drain_events();
    assert_eq!(r.lease.state(), State::RenewPending);
    let answers = [
        // A duplicate of the acquire's answer: ignored, nothing to drain.
        (
            at(391),
            RequestId::new(Term(1), 1),
            AcquireOutcome::Granted {
                fence: Fence(5),
                ttl: ms(900),
            }
            .into(),
        ),
        (at(395), late, RenewOutcome::NotOwner.into()),
    ];
    let seen = deliver_skipping_ignored(&mut r, &answers);
    assert_matches!(
        seen.as_slice(),
        [Event::Lost {
            reason: LossReason::NotOwner,
            ..
        }]
    );
    assert_eq!(r.lease.state(), State::Lost(LossReason::NotOwner));
    assert_eq!(r.check(at(395)), Err(GateError::Lost(LossReason::NotOwner)));
    assert_eq!(r.lease.stats().stale_responses, 2);
}

/// Ids are per lease: every lease's first request is term 1, sequence 1. An answer
/// delivered to the wrong lease under the right id is taken if it is of the kind that
/// lease awaits: the driver must key answers by (lease, id).
#[test]
fn rule8_request_ids_are_per_lease() {
    let mut a = Rig::new();
    let mut b = Rig {
        lease: Lease::new(Config::builder(ms(900)).build().unwrap(), owner(2)),
        gate: WriteGate::new(),
    };
    let first_a = a.start(at(0));
    let first_b = b.start(at(0));
    assert_eq!(first_a, first_b, "the same id from two leases");
    assert_eq!(first_a, RequestId::new(Term(1), 1));
    assert_eq!((first_a.term(), first_a.sequence()), (Term(1), 1));
    assert_eq!((first_b.term(), first_b.sequence()), (Term(1), 1));

    // `a`'s answer, delivered to `b` by mistake: of another kind than `b` awaits, it
    // is ignored and `b` still waits; of the kind `b` awaits, `b` takes it.
    let renewed_for_a = RenewOutcome::Renewed { ttl: ms(900) };
    assert_eq!(
        b.lease
            .handle_response(at(1), first_a, renewed_for_a.into(), &b.gate),
        Handled::WrongKind
    );
    assert!(b.lease.is_awaiting(first_b));
    let granted_to_a = AcquireOutcome::Granted {
        fence: Fence(7),
        ttl: ms(900),
    };
    assert_eq!(
        b.lease
            .handle_response(at(2), first_a, granted_to_a.into(), &b.gate),
        Handled::Applied
    );
    assert_eq!(b.lease.fence(), Some(Fence(7)), "b holds a's fence");
    // `a` still waits for its own answer.
    assert!(a.lease.is_awaiting(first_a));
    assert_eq!(a.lease.state(), State::Acquiring);
}

/// An answer of the wrong kind under the id in flight is ignored and counted;
/// the request stays in flight, and its right answer is still taken.
#[test]
fn rule8_an_answer_of_the_wrong_kind_leaves_the_request_in_flight() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let _ = r.drain_events();
    let renewal = r.renewal_due(at(300));
    let deadline = r.lease.deadline();
    let granted = AcquireOutcome::Granted {
        fence: Fence(6),
        ttl: ms(900),
    };
    assert_eq!(
        r.lease
            .handle_response(at(301), renewal, granted.into(), &r.gate),
        Handled::WrongKind
    );
    assert_eq!(r.lease.stats().stale_responses, 1);
    assert!(r.lease.is_awaiting(renewal));
    assert_eq!(r.lease.state(), State::RenewPending);
    assert_eq!(r.lease.deadline(), deadline);
    assert_eq!(r.lease.poll_action(), None);
    assert_eq!(r.drain_events(), []);
    assert_eq!(r.check(at(301)), Ok(Fence(5)));

    assert_eq!(
        r.lease
            .handle_response(at(302), renewal, RENEWED.into(), &r.gate),
        Handled::Applied
    );
    assert_eq!(r.lease.deadline(), Some(at_us(300_000 + WINDOW_US)));
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Renewed { deadline, sent_at, .. }]
            if *deadline == at_us(300_000 + WINDOW_US) && *sent_at == at(300)
    );
    assert_eq!(r.lease.stats().stale_responses, 1);
}

/// The gate's snapshot names the full term of the lease, in every state of every term.
/// (The last term, `MAX_TERM`, is tested in core/src/gate.rs, and its wrap to term 1 in
/// `terms_wrap_after_max_term_to_one` in core/src/lease.rs.)
#[test]
fn rule8_the_gate_snapshot_carries_the_leases_term() {
    let mut r = Rig::new();
    assert_eq!(r.gate.snapshot().unwrap().term, Term(0));
    for n in 1..=3u32 {
        let at_n = |t: u64| at(u64::from(n) * 10_000 + t);
        let acquire = r.start(at_n(0));
        assert_eq!(r.lease.term(), Term(n));
        let snap = r.gate.snapshot().unwrap();
        assert_eq!((snap.status, snap.term), (GateStatus::Closed, Term(n)));
        r.grant(at_n(1), acquire, u64::from(n), ms(900));
        let snap = r.gate.snapshot().unwrap();
        assert_eq!((snap.status, snap.term), (GateStatus::Held, r.lease.term()));
        r.lease.release(at_n(2), &r.gate).unwrap();
        let snap = r.gate.snapshot().unwrap();
        assert_eq!((snap.status, snap.term), (GateStatus::Released, Term(n)));
        let (release, _) = release_sent(&mut r);
        r.lease
            .handle_response(at_n(3), release, ReleaseOutcome::Released.into(), &r.gate)
            .applied();
        let _ = r.drain_events();
    }
}

/// An answer in a call whose `now` is past the safe deadline, stale as it is, comes
/// with the end of the term: the deadline expired it first.
#[test]
fn rule8_a_stale_answer_past_the_deadline_reports_the_expiry() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let old = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate); // times out
    let _ = r.drain_events();
    // Past the safe deadline (854.1 ms), before `handle_timeout` said so.
    assert_eq!(
        r.lease
            .handle_response(at(860), old, RENEWED.into(), &r.gate),
        Handled::EndedTerm
    );
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_eq!(r.lease.stats().stale_responses, 1);
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Lost {
            reason: LossReason::Expired,
            ..
        }]
    );
    assert_matches!(r.lease.poll_action(), Some(Action::Release { .. }));
    assert_eq!(r.check(at(860)), Err(GateError::Lost(LossReason::Expired)));
}

// ----- Time never goes backwards -------------------------------------------------

#[test]
fn time_going_backwards_is_clamped_and_never_extends_a_deadline() {
    let mut r = Rig::new();
    r.hold(at(100), at(101), 5);
    let id = r.renewal_due(at(400));
    // The answer carries a `now` from before the send (a clock glitch).
    r.renew_answer(at(50), id, RENEWED);
    // The deadline counts from the real send time; nothing moved back.
    assert_eq!(r.lease.deadline(), Some(at_us(400_000 + WINDOW_US)));
    assert_eq!(r.lease.latest_instant(), at(400));
    // And a timer call with an old instant is harmless.
    r.lease.handle_timeout(at(0), &r.gate);
    assert_eq!(r.lease.state(), State::Holding);
}

#[test]
fn handle_timeout_is_idempotent_and_never_leaves_a_timer_in_the_past() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.lease.handle_timeout(at(300), &r.gate);
    r.lease.handle_timeout(at(300), &r.gate);
    assert_eq!(r.lease.poll_action(), None, "no duplicate renewal");
    assert!(r.lease.is_awaiting(id));
    assert!(r.lease.poll_timeout().unwrap() > at(300));
}

// ----- Rule 9: config validation ------------------------------------------------

#[test]
fn rule9_each_config_violation_has_its_own_error() {
    let t = ms(900);
    let cases: [(ConfigBuilder, ConfigError); 11] = [
        (Config::builder(Duration::ZERO), ConfigError::ZeroTtl),
        (
            Config::builder(t).renew_interval(Duration::ZERO),
            ConfigError::ZeroRenewInterval,
        ),
        (
            Config::builder(t).renew_interval(t),
            ConfigError::RenewIntervalNotBelowTtl,
        ),
        (
            Config::builder(t).request_timeout(Duration::ZERO),
            ConfigError::ZeroRequestTimeout,
        ),
        (
            Config::builder(t).request_timeout(t),
            ConfigError::RequestTimeoutNotBelowTtl,
        ),
        (
            Config::builder(t).retry_interval(Duration::ZERO),
            ConfigError::ZeroRetryInterval,
        ),
        (
            Config::builder(t).retry_interval(t),
            ConfigError::RetryIntervalNotBelowTtl,
        ),
        (Config::builder(t).margin(t), ConfigError::MarginNotBelowTtl),
        (
            Config::builder(t).drift_ppm(1_000_000),
            ConfigError::DriftNotBelowOneMillionPpm,
        ),
        (
            Config::builder(t).margin(ms(400)).renew_interval(ms(500)),
            ConfigError::RenewIntervalNotBelowSafeWindow,
        ),
        (
            Config::builder(t).request_timeout(ms(600)),
            ConfigError::RenewalNotAnsweredInsideSafeWindow,
        ),
    ];
    for (builder, expected) in cases {
        assert_eq!(builder.build(), Err(expected));
        // Every error explains itself.
        assert!(!expected.to_string().is_empty());
    }
    assert!(Config::builder(t).build().is_ok());
}

// ----- Rule 10: TTL sizing ---------------------------------------------------------

#[test]
fn rule10_budget_sizes_the_ttl_from_the_lessons_numbers() {
    let budget = Budget {
        work_p99: ms(200),
        renew_rtt_p99: ms(20),
        pause_budget: ms(150),
        margin: ms(30),
    };
    assert_eq!(budget.total(), ms(400));
    assert_eq!(
        budget.check(ms(400)),
        Err(BudgetError {
            ttl: ms(400),
            required: ms(400),
            failing_term: BudgetPart::Margin
        })
    );
    assert_eq!(
        budget.check(ms(360)).unwrap_err().failing_term,
        BudgetPart::PauseBudget
    );
    assert_eq!(budget.check(ms(600)), Ok(()));
    let config = Config::builder(ms(600))
        .margin(budget.margin)
        .build()
        .unwrap();
    assert_eq!(config.renew_interval(), ms(200));
    // The error says which term does not fit.
    let message = budget.check(ms(300)).unwrap_err().to_string();
    assert!(message.contains("pause budget"), "{message}");
}

// ----- The contract's TTL semantics: a renewal replaces the expiry -------------------
//
// A renewal sets the service's expiry to (handling time + r), r >= the TTL asked.
// An answer with r < asked breaks that, and the core cannot know what the renewals it
// never heard back from did: whenever such an answer arrives, the term ends.

/// A renewal at 300 ms times out at 390 ms (retry due at 435 ms); its answer
/// arrives late at `late` and confirms `ttl`; it is handled as `expected`.
#[track_caller]
fn late_renewal_answer(ttl: Duration, late: Instant, expected: Handled) -> Rig {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let first = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate);
    assert_eq!(r.lease.state(), State::RenewPending);
    assert_eq!(r.check(at(390)), Ok(Fence(5)));
    if late >= at(435) {
        let _retry = r.renewal_due(at(435));
    }
    let _ = r.drain_events();
    let answer = RenewOutcome::Renewed { ttl };
    assert_eq!(
        r.lease.handle_response(late, first, answer.into(), &r.gate),
        expected,
        "the late answer is not the request in flight"
    );
    r
}

#[test]
fn contract_a_late_renewal_confirming_a_shorter_ttl_closes_the_gate_at_once() {
    for ttl in [Duration::ZERO, ms(40), ms(899)] {
        for late in [at(400), at(440)] {
            let mut r = late_renewal_answer(ttl, late, Handled::EndedTerm);
            assert_eq!(
                r.lease.state(),
                State::Lost(LossReason::Shortened),
                "{ttl} {late}"
            );
            assert_eq!(
                r.check(late),
                Err(GateError::Lost(LossReason::Shortened)),
                "{ttl} at {late}: the old deadline (854.1 ms) is no longer trusted"
            );
            assert!(matches!(
                r.lease.poll_action(),
                Some(Action::Release { .. })
            ));
            assert_matches!(
                r.drain_events().as_slice(),
                [Event::Lost {
                    reason: LossReason::Shortened,
                    ..
                }]
            );
        }
    }
}

#[test]
fn contract_a_late_renewal_confirming_the_ttl_asked_changes_nothing() {
    let r = late_renewal_answer(ms(900), at(400), Handled::Stale);
    assert_eq!(r.lease.state(), State::RenewPending);
    assert_eq!(
        r.lease.deadline(),
        Some(at_us(WINDOW_US)),
        "not extended either"
    );
    assert_eq!(r.check(at(400)), Ok(Fence(5)));
    assert_eq!(r.lease.stats().stale_responses, 1);
}

#[test]
fn contract_an_in_time_renewal_confirming_less_than_asked_ends_the_term() {
    // ttl 0: nothing left at all. ttl 600: the deadline would still move forward
    // (300 + 600 - 0.6 - 45 = 854.4 > 854.1 ms), but a service that applies less than
    // asked may have shortened a renewal whose answer is lost, so it cannot be trusted.
    for ttl in [Duration::ZERO, ms(40), ms(600)] {
        let mut r = Rig::new();
        r.hold(at(0), at(1), 5);
        let id = r.renewal_due(at(300));
        r.renew_answer(at(301), id, RenewOutcome::Renewed { ttl });
        assert_eq!(r.lease.state(), State::Lost(LossReason::Shortened), "{ttl}");
        assert_eq!(
            r.check(at(301)),
            Err(GateError::Lost(LossReason::Shortened))
        );
    }
}

#[test]
fn contract_a_renewal_that_is_never_answered_keeps_the_gate_open_only_until_the_deadline() {
    // Unanswered, the renewal sent at 300 ms expires at 300 + 900 ms at the earliest
    // (r >= asked): the deadline of the grant, 854.1 ms, stays the last safe instant.
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let _ = r.renewal_due(at(300));
    assert_eq!(r.check(at_us(WINDOW_US - 1)), Ok(Fence(5)));
    assert!(r.check(at_us(WINDOW_US)).is_err());
}

// ----- A grant other than asked: the cadence follows the granted TTL ---------------

#[test]
fn contract_a_reduced_grant_is_renewed_every_third_of_the_grant() {
    let mut r = Rig::new();
    let id = r.start(at(0));
    r.grant(at(1), id, 5, ms(300));
    // 300 - 0.3 (drift) - 45 (margin).
    assert_eq!(r.lease.deadline(), Some(at_us(254_700)));
    assert_eq!(
        r.lease.poll_timeout(),
        Some(at(100)),
        "granted / 3, not T / 3"
    );
    assert!(matches!(
        r.drain_events().as_slice(),
        [Event::Acquired { granted, .. }] if *granted == ms(300)
    ));
    r.lease.handle_timeout(at(100), &r.gate);
    let Some(Action::Renew { id, ttl, .. }) = r.lease.poll_action() else {
        panic!("no renewal at 100 ms")
    };
    assert_eq!(ttl, ms(300), "renewals ask for the granted TTL");
    r.renew_answer(at(110), id, RenewOutcome::Renewed { ttl: ms(300) });
    assert_eq!(r.lease.deadline(), Some(at_us(354_700)));
    assert_eq!(r.lease.poll_timeout(), Some(at(200)));
}

#[test]
fn contract_a_longer_grant_is_renewed_every_third_of_the_grant() {
    // etcd raises a TTL below its minimum: asked 900 ms, granted 2 s.
    let mut r = Rig::new();
    let id = r.start(at(0));
    r.grant(at(1), id, 5, ms(2_000));
    let renew_at = r.lease.poll_timeout().unwrap();
    assert!(
        (at_us(666_665)..=at_us(666_667)).contains(&renew_at),
        "{renew_at}"
    );
    r.lease.handle_timeout(renew_at, &r.gate);
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Renew { ttl, .. }) if ttl == ms(2_000)
    ));
}

#[test]
fn contract_a_grant_too_short_to_renew_is_refused_and_released() {
    // 150 ms: renewal at 50, timeout at 140 > 150 - 0.15 - 45 = 104.85 ms.
    let mut r = Rig::new();
    let id = r.start(at(0));
    r.grant(at(1), id, 5, ms(150));
    assert_eq!(
        r.lease.state(),
        State::NotAcquired(AcquireFailure::GrantTooShort)
    );
    assert_eq!(
        r.check(at(1)),
        Err(GateError::NotHeld),
        "the gate never opened"
    );
    assert!(matches!(
        r.lease.poll_action(),
        Some(Action::Release { .. })
    ));
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::AcquireFailed {
            reason: AcquireFailure::GrantTooShort,
            retry_at: None,
            ..
        }]
    );
    // No retry: the service would grant the same again.
    r.lease.handle_timeout(at(1_000), &r.gate);
    assert_eq!(r.lease.poll_action(), None);
}

// ----- Release after an acquire whose outcome is unknown ---------------------------

#[test]
fn contract_release_after_an_unanswered_acquire_sends_a_release() {
    let mut r = Rig::new();
    let _ = r.start(at(0));
    r.lease.handle_timeout(at(90), &r.gate);
    assert!(matches!(
        r.drain_events().as_slice(),
        [Event::AcquireFailed {
            reason: AcquireFailure::Indeterminate(Indeterminate::Timeout),
            retry_at: Some(_),
            ..
        }]
    ));
    r.lease.release(at(100), &r.gate).unwrap();
    assert_eq!(r.lease.state(), State::Releasing);
    let Some(Action::Release { id, term, .. }) = r.lease.poll_action() else {
        panic!("the acquire may have been granted: a release must go out")
    };
    assert_eq!(term, Term(1));
    r.lease
        .handle_response(at(105), id, ReleaseOutcome::Released.into(), &r.gate)
        .applied();
    assert_eq!(r.lease.state(), State::Released);
}

#[test]
fn contract_release_after_every_acquire_was_answered_no_sends_nothing() {
    let mut r = Rig::new();
    let id = r.start(at(0));
    let held = AcquireOutcome::HeldByAnother(Holder {
        identity: Identity::new("other:1").unwrap(),
        fence: Fence(4),
        remaining: ms(700),
    });
    r.lease
        .handle_response(at(2), id, held.into(), &r.gate)
        .applied();
    r.lease.release(at(10), &r.gate).unwrap();
    assert_eq!(r.lease.state(), State::Released);
    assert_eq!(r.lease.poll_action(), None);
}

#[test]
fn contract_an_unanswered_acquire_still_needs_a_release_after_a_later_attempt_is_told_no() {
    let held = || {
        AcquireOutcome::HeldByAnother(Holder {
            identity: Identity::new("other:1").unwrap(),
            fence: Fence(4),
            remaining: ms(700),
        })
    };
    // Giving up at the bound, and releasing while acquiring: both must send a release.
    for give_up in [true, false] {
        let mut r = Rig::new();
        if give_up {
            // The retry after attempt 1's timeout (at 90 + 22..67 ms) falls inside the
            // bound; the one after attempt 2's answer (80 ms after it is sent) cannot.
            r.lease.acquire_until(at(0), at(200), &r.gate).unwrap();
        } else {
            r.lease.acquire(at(0), &r.gate).unwrap();
        }
        assert!(matches!(
            r.lease.poll_action(),
            Some(Action::Acquire { .. })
        ));
        // Attempt 1 is never answered: it may still reach the service and be applied.
        r.lease.handle_timeout(at(90), &r.gate);
        let retry_at = r.lease.poll_timeout().unwrap();
        r.lease.handle_timeout(retry_at, &r.gate);
        let second = match r.lease.poll_action() {
            Some(Action::Acquire { id, .. }) => id,
            other => panic!("expected the second attempt, got {other:?}"),
        };
        let now = retry_at + ms(80);
        r.lease
            .handle_response(now, second, held().into(), &r.gate)
            .applied();
        if !give_up {
            r.lease.release(now + ms(1), &r.gate).unwrap();
            assert_eq!(r.lease.state(), State::Releasing);
        } else {
            assert!(matches!(r.lease.state(), State::NotAcquired(_)));
        }
        assert!(
            matches!(r.lease.poll_action(), Some(Action::Release { .. })),
            "the first attempt may have been granted: release it (give up: {give_up})"
        );
    }
}

#[test]
fn contract_a_renewal_answer_for_an_id_that_was_no_renewal_of_the_grant_proves_nothing() {
    let mut r = Rig::new();
    let acquire = r.start(at(0));
    r.grant(at(1), acquire, 5, ms(900));
    let _ = r.drain_events();
    // Tagged with the acquire's id, or with an id of this term never issued.
    let never_sent = RequestId(acquire.0 & !u64::from(u32::MAX));
    for id in [acquire, never_sent] {
        for outcome in [
            RenewOutcome::NotOwner,
            RenewOutcome::Renewed { ttl: ms(1) },
            RenewOutcome::Refused(Refusal::WrongType),
        ] {
            assert_eq!(
                r.lease.handle_response(at(20), id, outcome.into(), &r.gate),
                Handled::Stale
            );
            assert_eq!(r.lease.state(), State::Holding, "{id:?} {outcome:?}");
            assert_eq!(r.check(at(20)), Ok(Fence(5)));
        }
    }
    // A real renewal of the grant, answered late, still ends the term.
    let renewal = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate);
    assert_eq!(
        r.lease
            .handle_response(at(395), renewal, RenewOutcome::NotOwner.into(), &r.gate),
        Handled::EndedTerm
    );
    assert_eq!(r.lease.state(), State::Lost(LossReason::NotOwner));
}

#[test]
fn contract_a_release_after_the_safe_deadline_reports_the_expiry() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    // The driver slept through the deadline (854.1 ms) and every timer before it.
    r.lease.release(at(10_000), &r.gate).unwrap();
    assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::Lost {
            reason: LossReason::Expired,
            ..
        }]
    );
    assert!(
        matches!(r.lease.poll_action(), Some(Action::Release { .. })),
        "unlock is still attempted, best effort"
    );
    assert_eq!(
        r.check(at(10_000)),
        Err(GateError::Lost(LossReason::Expired))
    );
}

// ----- NOT_OWNER to an older renewal of the current term ---------------------------

#[test]
fn contract_not_owner_to_an_older_renewal_after_a_newer_success_ends_the_term() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let older = r.renewal_due(at(300));
    r.lease.handle_timeout(at(390), &r.gate);
    let newer = r.renewal_due(at(435));
    r.renew_answer(at(440), newer, RENEWED);
    assert_eq!(r.lease.state(), State::Holding);
    let _ = r.drain_events();
    // Under owner-and-fence compare, "not owner" means the grant was deleted or
    // replaced after the newer OK was produced (renewals never re-create a key).
    assert_eq!(
        r.lease
            .handle_response(at(450), older, RenewOutcome::NotOwner.into(), &r.gate),
        Handled::EndedTerm
    );
    assert_eq!(r.lease.state(), State::Lost(LossReason::NotOwner));
    assert_eq!(r.check(at(450)), Err(GateError::Lost(LossReason::NotOwner)));
    assert_eq!(
        r.lease.poll_action(),
        None,
        "no release: the key is not ours"
    );
}

#[test]
fn contract_not_owner_from_a_previous_term_stays_stale() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let old = r.renewal_due(at(300));
    r.lease.release(at(310), &r.gate).unwrap();
    let release = r.lease.poll_action().unwrap().id();
    r.lease
        .handle_response(at(311), release, ReleaseOutcome::Released.into(), &r.gate)
        .applied();
    r.hold(at(400), at(401), 6);
    assert_eq!(
        r.lease
            .handle_response(at(402), old, RenewOutcome::NotOwner.into(), &r.gate),
        Handled::Stale
    );
    assert_eq!(r.check(at(402)), Ok(Fence(6)));
}

// ----- A revocation notice at or after the deadline is stale -----------------------
//
// Counted as stale; the deadline ended the term in that call (`Handled::EndedTerm`).

#[test]
fn contract_a_revocation_at_or_after_the_deadline_is_stale_and_counted() {
    for fence in [Fence(4), Fence(5)] {
        let mut r = Rig::new();
        r.hold(at(0), at(1), 5);
        assert_eq!(
            r.lease.handle_revoked(at_us(WINDOW_US), fence, &r.gate),
            Handled::EndedTerm,
            "{fence}"
        );
        assert_eq!(r.lease.state(), State::Lost(LossReason::Expired));
        assert_eq!(r.lease.stats().stale_responses, 1);
    }
}

// ----- Final refusals and bounded acquires ----------------------------------------

#[test]
fn contract_a_final_refusal_ends_the_acquire_at_once_whatever_the_bound() {
    let mut r = Rig::new();
    let id = r.start(at(0));
    let refused = AcquireOutcome::Refused(Refusal::WrongType);
    r.lease
        .handle_response(at(2), id, refused.into(), &r.gate)
        .applied();
    assert_eq!(
        r.lease.state(),
        State::NotAcquired(AcquireFailure::Refused(Refusal::WrongType))
    );
    assert_matches!(
        r.drain_events().as_slice(),
        [Event::AcquireFailed {
            reason: AcquireFailure::Refused(Refusal::WrongType),
            retry_at: None,
            ..
        }]
    );
    assert_eq!(
        r.lease.poll_action(),
        None,
        "never retried, nothing to release"
    );
    assert_eq!(r.lease.poll_timeout(), None);
    // A new term may start after it.
    assert!(r.lease.acquire(at(10), &r.gate).is_ok());
}

#[test]
fn contract_a_refused_renewal_ends_the_term() {
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(301), id, RenewOutcome::Refused(Refusal::Unauthorized));
    assert_eq!(r.lease.state(), State::Lost(LossReason::Refused));
    assert_eq!(r.check(at(301)), Err(GateError::Lost(LossReason::Refused)));
}

#[test]
fn contract_acquire_until_now_tries_once() {
    let mut r = Rig::new();
    r.lease.acquire_until(at(0), at(0), &r.gate).unwrap();
    let id = r.lease.poll_action().unwrap().id();
    let held = AcquireOutcome::HeldByAnother(Holder {
        identity: Identity::EMPTY,
        fence: Fence(1),
        remaining: ms(500),
    });
    r.lease
        .handle_response(at(3), id, held.into(), &r.gate)
        .applied();
    assert_eq!(
        r.lease.state(),
        State::NotAcquired(AcquireFailure::HeldByAnother)
    );
    assert_eq!(
        r.lease.poll_action(),
        None,
        "answered no: nothing to release"
    );
}

#[test]
fn contract_a_bounded_acquire_gives_up_and_releases_what_may_have_been_granted() {
    let mut r = Rig::new();
    r.lease.acquire_until(at(0), at(200), &r.gate).unwrap();
    let mut sent = vec![];
    let mut now = at(0);
    loop {
        if let Some(action) = r.lease.poll_action() {
            sent.push((now, action));
        }
        let _ = r.drain_events();
        if matches!(r.lease.state(), State::NotAcquired(_)) {
            break;
        }
        now = r.lease.poll_timeout().unwrap();
        r.lease.handle_timeout(now, &r.gate);
    }
    // Every attempt timed out (no answers): the last one left the outcome unknown.
    assert_eq!(
        r.lease.state(),
        State::NotAcquired(AcquireFailure::Indeterminate(Indeterminate::Timeout))
    );
    let acquires: Vec<_> = sent
        .iter()
        .filter(|(_, a)| matches!(a, Action::Acquire { .. }))
        .map(|(t, _)| *t)
        .collect();
    assert!(acquires.iter().all(|t| *t < at(200)), "{acquires:?}");
    assert!(now <= at(290), "the bound plus one request timeout: {now}");
    // It may have been granted: the release is the last request, after the bound.
    assert!(
        matches!(sent.last(), Some((_, Action::Release { .. }))),
        "{sent:?}"
    );
}

#[test]
fn contract_acquire_retries_are_jittered_around_the_retry_interval() {
    let mut gaps = vec![];
    for n in 1..50u32 {
        let mut lease = Lease::new(Config::builder(ms(900)).build().unwrap(), owner(n));
        let gate = WriteGate::new();
        lease.acquire(at(0), &gate).unwrap();
        let id = lease.poll_action().unwrap().id();
        let held = AcquireOutcome::HeldByAnother(Holder {
            identity: Identity::EMPTY,
            fence: Fence(1),
            remaining: ms(500),
        });
        lease
            .handle_response(at(0), id, held.into(), &gate)
            .applied();
        let retry = lease.poll_timeout().unwrap();
        gaps.push(retry.as_micros());
    }
    // Between half and one and a half of the 45 ms retry interval, and spread out.
    assert!(
        gaps.iter().all(|g| (22_500..=67_500).contains(g)),
        "{gaps:?}"
    );
    let (min, max) = (gaps.iter().min().unwrap(), gaps.iter().max().unwrap());
    assert!(max - min > 30_000, "{gaps:?}");
}

/// The retry jitter is seeded from the owner: contenders with different owners (even
/// serial numbers one apart) that are refused at the same instants retry at
/// different ones, and a lease with the same owner retries at the same instants.
#[test]
fn contract_contenders_retry_at_instants_of_their_own_owner() {
    let config = Config::builder(ms(900)).build().unwrap();
    let retries = |owner: Owner| -> Vec<Instant> {
        let gate = WriteGate::new();
        let mut lease = Lease::new(config, owner);
        let mut retries = vec![];
        lease.acquire(at(0), &gate).unwrap();
        for round in 0..5 {
            // Refused at 0, 100, 200… ms: every retry falls within 67.5 ms.
            let now = at(100 * round);
            if round > 0 {
                lease.handle_timeout(now, &gate);
            }
            let id = lease.poll_action().unwrap().id();
            let held = AcquireOutcome::HeldByAnother(Holder {
                identity: Identity::EMPTY,
                fence: Fence(1),
                remaining: ms(500),
            });
            lease.handle_response(now, id, held.into(), &gate).applied();
            retries.push(lease.poll_timeout().unwrap());
        }
        retries
    };
    let pairs = [
        (owner(1), owner(2)),
        (Owner(*b"pump-controller7"), Owner(*b"pump-controller8")),
        (OWNER, Owner([0; 16])),
    ];
    for (a, b) in pairs {
        let (ra, rb) = (retries(a), retries(b));
        assert_ne!(ra[0], rb[0], "{a:?} and {b:?}: {ra:?}");
        assert_ne!(ra, rb);
        assert_eq!(ra, retries(a), "the same owner, the same instants");
    }
}

/// The jitter's bounds hold at the smallest intervals too: owner 334,885 draws a
/// factor of exactly 0.5 first, which for an odd interval of µs rounded the wait down
/// (1 µs of 3), and for 1 µs to no wait at all: the retry then went out in the very
/// call that timed the attempt out, whose `AcquireFailed` said `retry_at: None` ("the
/// acquire is over") while the lease was still acquiring.
#[test]
fn contract_a_retry_waits_at_least_half_the_retry_interval_even_at_one_microsecond() {
    let held = AcquireOutcome::HeldByAnother(Holder {
        identity: Identity::EMPTY,
        fence: Fence(1),
        remaining: ms(500),
    });
    let half = owner(334_885);
    // Its first draw is 0.5 exactly: 22.5 ms of the default 45 ms.
    let gate = WriteGate::new();
    let mut lease = Lease::new(Config::builder(ms(900)).build().unwrap(), half);
    lease.acquire(at(0), &gate).unwrap();
    let id = lease.poll_action().unwrap().id();
    lease
        .handle_response(at(10), id, held.into(), &gate)
        .applied();
    assert_eq!(lease.poll_timeout(), Some(at_us(32_500)));
    for interval in [1u64, 3, 5] {
        let config = Config::builder(ms(900))
            .retry_interval(Duration::from_micros(interval))
            .build()
            .unwrap();
        let gate = WriteGate::new();
        let mut lease = Lease::new(config, half);
        lease.acquire(at(0), &gate).unwrap();
        let id = lease.poll_action().unwrap().id();
        lease
            .handle_response(at(10), id, held.into(), &gate)
            .applied();
        let gap = lease.poll_timeout().unwrap().as_micros() - at(10).as_micros();
        assert!(
            2 * gap >= interval && 2 * gap <= 3 * interval,
            "retry interval {interval} µs: retried after {gap} µs"
        );
    }

    let config = Config::builder(ms(900))
        .retry_interval(Duration::from_micros(1))
        .build()
        .unwrap();
    let gate = WriteGate::new();
    let mut lease = Lease::new(config, half);
    lease.acquire(at(0), &gate).unwrap();
    while lease.poll_action().is_some() {}
    // The attempt is never answered: it times out.
    lease.handle_timeout(at(90), &gate);
    assert_eq!(lease.state(), State::Acquiring);
    let events: Vec<_> = core::iter::from_fn(|| lease.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::AcquireFailed { retry_at: Some(t), .. } if *t > at(90))),
        "{events:?}"
    );
    assert!(lease.poll_action().is_none(), "no retry in the same call");
}

/// Fair waiting: a client that released waits `release_backoff` before it contends
/// again, and that is longer than any waiter's gap between two attempts, so some
/// waiter's attempt always comes first.
#[test]
fn contract_the_release_backoff_outlasts_every_waiters_retry_gap() {
    let config = Config::builder(ms(900)).build().unwrap();
    let backoff = config.release_backoff().as_micros();
    let mut longest = 0;
    for n in 1..200u32 {
        let mut lease = Lease::new(config, owner(n));
        let gate = WriteGate::new();
        let mut now = at(0);
        lease.acquire(now, &gate).unwrap();
        for _ in 0..20 {
            let id = lease.poll_action().unwrap().id();
            let held = AcquireOutcome::HeldByAnother(Holder {
                identity: Identity::EMPTY,
                fence: Fence(1),
                remaining: ms(500),
            });
            lease.handle_response(now, id, held.into(), &gate).applied();
            let retry = lease.poll_timeout().unwrap();
            longest = longest.max(retry.as_micros() - now.as_micros());
            now = retry;
            lease.handle_timeout(now, &gate);
        }
    }
    // 2 × 45 ms against at most 1.5 × 45 ms: half an interval to spare.
    assert_eq!(backoff, 90_000);
    assert!(
        longest <= 67_500 && backoff - longest >= 22_500,
        "{longest} µs"
    );
}

/// Fair waiting, the lease's side: after a held term ends by release, the lease names
/// the instant it may contend again, one back-off after the release was last sent; no
/// turn to wait for after a term that never held.
#[test]
fn contract_a_released_hold_waits_one_backoff_before_its_next_turn() {
    let mut r = Rig::new();
    let backoff = r.lease.config().release_backoff();
    assert_eq!(r.lease.turn(), None, "no term yet");
    r.hold(at(0), at(1), 5);
    assert_eq!(r.lease.turn(), None, "while held");
    r.lease.release(at(100), &r.gate).unwrap();
    assert_eq!(r.lease.turn(), None, "while the release is in flight");
    let id = r.lease.poll_action().unwrap().id();
    // The release is answered "unknown", then sent again: the copy sent last may be
    // the one that frees the key, so the turn counts from it.
    let unknown = ReleaseOutcome::Indeterminate(Indeterminate::Timeout);
    r.lease
        .handle_response(at(150), id, unknown.into(), &r.gate)
        .applied();
    assert_eq!(r.lease.state(), State::Released);
    assert_eq!(r.lease.turn(), Some(at(100) + backoff));
    let retry_at = r.lease.poll_timeout().unwrap();
    r.lease.handle_timeout(retry_at, &r.gate);
    let id = r.lease.poll_action().unwrap().id();
    r.lease
        .handle_response(
            retry_at + ms(1),
            id,
            ReleaseOutcome::Released.into(),
            &r.gate,
        )
        .applied();
    assert_eq!(r.lease.turn(), Some(retry_at + backoff));
    // A new term starts where the driver let the turn pass; it has no turn to wait
    // for while it runs, nor once it is released without ever holding.
    r.start(retry_at + backoff);
    assert_eq!(r.lease.turn(), None);
    r.lease.release(at(400), &r.gate).unwrap();
    assert_eq!(
        r.lease.state(),
        State::Releasing,
        "the attempt may have been granted"
    );
    let id = r.lease.poll_action().unwrap().id();
    r.lease
        .handle_response(at(401), id, ReleaseOutcome::Released.into(), &r.gate)
        .applied();
    assert_eq!(r.lease.state(), State::Released);
    assert_eq!(r.lease.turn(), None, "never held");
    // Nor after a loss.
    r.hold(at(1_000), at(1_001), 6);
    let id = r.renewal_due(at(1_300));
    r.lease
        .handle_response(at(1_301), id, RenewOutcome::NotOwner.into(), &r.gate)
        .applied();
    assert_matches!(r.lease.state(), State::Lost(_));
    assert_eq!(r.lease.turn(), None, "lost, not released");
}

#[test]
fn contract_a_renewal_confirming_more_than_asked_counts_only_what_was_asked() {
    // The renewal sent at 300 ms is answered with 5 s. The one sent at 300 ms is the
    // newest, but an older renewal of the term still in the network, handled after
    // it, may set the expiry to its own handling time + 900 ms.
    let mut r = Rig::new();
    r.hold(at(0), at(1), 5);
    let id = r.renewal_due(at(300));
    r.renew_answer(at(301), id, RenewOutcome::Renewed { ttl: ms(5_000) });
    assert_eq!(r.lease.state(), State::Holding);
    assert_eq!(r.lease.deadline(), Some(at_us(300_000 + WINDOW_US)));
    assert_eq!(
        r.lease.poll_timeout(),
        Some(at(600)),
        "cadence of the granted TTL"
    );
}
