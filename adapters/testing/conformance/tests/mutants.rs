//! The suite catches broken services: each test wraps `MemoryService` with one
//! deliberate breach of the contract and checks that the clause guarding it — named
//! in the violation — fails. A clause that passes a broken service would be a test
//! that cannot fail; `every_clause_has_a_mutant_of_its_own` fails if a clause has no
//! mutant here (or, for the quarantine clause, in the backends' tests) that breaks it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_conformance::{check_all, Capabilities, CLAUSES};
use leasehold_driver::LockService;
use leasehold_tokio::memory::MemoryService;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Bug {
    /// Renews whatever fence is presented, as long as the token holds the key.
    RenewIgnoresFence,
    /// Answers `Renewed` with 1 ms less than it applied (a `PTTL` read-back).
    RenewReportsLess,
    /// A renewal of a missing key grants it (`SET` instead of `PEXPIRE`).
    RenewRecreates,
    /// A renewal never moves the expiry earlier, but reports the TTL asked.
    RenewNeverShortens,
    /// Re-acquire by the holder's own token makes a new grant with a new fence.
    ReacquireNewFence,
    /// Anyone's release deletes the key.
    ReleaseIgnoresToken,
    /// Invalid keys are stored under an escaped name instead of refused.
    AcceptsInvalidKeys,
    /// Identities are cut to 32 bytes.
    TruncatesIdentity,
    /// Grants last twice as long as reported.
    LongerTtl,
    /// Contenders are told the holder has more time left than it was granted.
    OverstatesRemaining,
    /// The holder query never answers.
    HolderHangs,
    /// `revoked` completes at once.
    SpuriousRevocation,
    /// `holder_changed` completes at once, whoever holds the key.
    SpuriousHolderChange,
    /// Renewals answer `Renewed` and change nothing.
    RenewDoesNotExtend,
    /// The holder's re-acquire answers `Granted` and changes nothing.
    ReacquireDoesNotExtend,
    /// A TTL it cannot apply to the millisecond is rounded up or down, by turns.
    MoodyRounding,
    /// Answers travel through one queue, like replies on a pipelined connection,
    /// and a dropped query leaves its answer in it for the next query to take.
    DesyncOnDrop,
    /// The fence counter is kept with the grant and deleted with it: after a release
    /// the next grant's fence starts again from 1.
    FenceKeptWithTheKey,
    /// Renewals compare the owner but not the term: the holder's next term renews
    /// its previous term's grant.
    RenewIgnoresTerm,
    /// A release of a key that nobody holds answers `Released` (an idempotent
    /// delete that does not say whether it deleted anything).
    ReleaseOfAFreeKeyIsReleased,
    /// The holder query answers from a cache filled on the first ask and never
    /// invalidated.
    HolderCached,
    /// Keys outside printable ASCII are refused as invalid (a stricter rule of its own).
    RefusesNonAsciiKeys,
    /// A release deletes every key that starts with the released one (a pattern
    /// delete, `key*`).
    ReleaseByPrefix,
    /// A renewal of a grant that expired revives it (the expired grant is still
    /// found, its token and fence compared, and written back).
    RenewRevivesExpired,
    /// A grant applies 55 % of the TTL it reports, and tells contenders the time left
    /// of the TTL it reported: only waiting for the TTL shows it.
    ShortGrant,
    /// A release deletes the key when its holder has the identity the releasing
    /// token was granted with (it compares who holds the key, not which term).
    ReleaseByIdentity,
    /// Every release is lost on the way: it answers `Indeterminate` and deletes
    /// nothing. To the next holder, the same as a client that sends one release and
    /// gives up when its answer is lost.
    ReleaseNeverLands,
    /// A renewal applies 55 % of the TTL it reports, and tells contenders the time
    /// left of the TTL it reported.
    ShortRenewal,
}

struct Broken {
    inner: MemoryService,
    bug: Bug,
    replies: Mutex<VecDeque<HolderOutcome>>,
    turns: AtomicU64,
    /// `FenceKeptWithTheKey`: the key's generation (a release starts a new one, with
    /// a fence counter of its own).
    generations: Mutex<HashMap<String, u64>>,
    /// `HolderCached`: the first answer to each key's holder query.
    cache: Mutex<HashMap<String, HolderOutcome>>,
    /// `ReleaseByPrefix`: every key granted so far.
    granted: Mutex<HashSet<String>>,
    /// `RenewRevivesExpired`: the last grant of each key not released (token, fence).
    last: Mutex<HashMap<String, (OwnerToken, Fence)>>,
    /// `ShortGrant`, `ShortRenewal`: per key, the grant's fence and how much more
    /// than it applied it reported.
    claimed: Mutex<HashMap<String, (Fence, Duration)>>,
    /// `ReleaseByIdentity`: the identity each token was granted a key with, and the
    /// token of each key's latest grant.
    identities: Mutex<HashMap<OwnerToken, Identity>>,
    grantees: Mutex<HashMap<String, OwnerToken>>,
}

impl Broken {
    fn new(bug: Bug) -> Broken {
        Broken {
            inner: MemoryService::new(),
            bug,
            replies: Mutex::new(VecDeque::new()),
            turns: AtomicU64::new(0),
            generations: Mutex::default(),
            cache: Mutex::default(),
            granted: Mutex::default(),
            last: Mutex::default(),
            claimed: Mutex::default(),
            identities: Mutex::default(),
            grantees: Mutex::default(),
        }
    }

    fn is(&self, bug: Bug) -> bool {
        self.bug == bug
    }

    /// The key as the inner service stores it.
    fn stored(&self, key: &str) -> String {
        if !self.is(Bug::FenceKeptWithTheKey) || leasehold::check_key(key).is_err() {
            return key.to_owned();
        }
        let generation = self.generations.lock().unwrap().get(key).copied();
        format!("{key}#{}", generation.unwrap_or(0))
    }

    /// The contender's view of `holder`: the time left of the TTL a short grant or
    /// renewal reported, not of the one it applied.
    fn told(&self, key: &str, holder: Holder) -> Holder {
        match self.claimed.lock().unwrap().get(key) {
            Some(&(fence, more)) if fence == holder.fence => Holder {
                remaining: holder.remaining.saturating_add(more),
                ..holder
            },
            _ => holder,
        }
    }
}

/// 55 % of `ttl`.
fn short(ttl: Duration) -> Duration {
    Duration::from_micros(ttl.as_micros() / 20 * 11)
}

impl LockService for Broken {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        let mut identity = *identity;
        if self.is(Bug::RefusesNonAsciiKeys)
            && !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            return AcquireOutcome::Refused(Refusal::InvalidKey);
        }
        let original = key;
        let mut key = self.stored(key);
        if self.is(Bug::AcceptsInvalidKeys) && leasehold::check_key(&key).is_err() {
            key = format!("escaped:{}", key.len());
        }
        if self.is(Bug::TruncatesIdentity) {
            let text = identity.as_str();
            identity = Identity::lossy(text.get(..32).unwrap_or(text));
        }
        if self.is(Bug::ReacquireDoesNotExtend) {
            if let Some(grant) = self.inner.grant(&key).filter(|g| g.token == token) {
                return AcquireOutcome::Granted {
                    fence: grant.fence,
                    ttl,
                };
            }
        }
        if self.is(Bug::ReacquireNewFence) {
            let _ = self.inner.release(&key, token).await;
        }
        let mut ttl = ttl;
        if self.is(Bug::MoodyRounding) && ttl.as_micros() % 1_000 != 0 {
            let down = ttl.as_micros() / 1_000 * 1_000;
            let up = self.turns.fetch_add(1, Ordering::Relaxed) % 2;
            ttl = Duration::from_micros(down + up * 1_000);
        }
        let asked = if self.is(Bug::LongerTtl) {
            ttl.saturating_mul(2)
        } else if self.is(Bug::ShortGrant) {
            short(ttl)
        } else {
            ttl
        };
        let outcome = self.inner.acquire(&key, token, &identity, asked).await;
        if let AcquireOutcome::Granted { fence, .. } = outcome {
            self.granted.lock().unwrap().insert(original.to_owned());
            self.identities.lock().unwrap().insert(token, identity);
            self.grantees.lock().unwrap().insert(key.clone(), token);
            self.last
                .lock()
                .unwrap()
                .insert(key.clone(), (token, fence));
            if self.is(Bug::ShortGrant) {
                let more = ttl.saturating_sub(asked);
                self.claimed
                    .lock()
                    .unwrap()
                    .insert(key.clone(), (fence, more));
            }
        }
        match outcome {
            AcquireOutcome::Granted { fence, .. }
                if self.is(Bug::LongerTtl) || self.is(Bug::ShortGrant) =>
            {
                AcquireOutcome::Granted { fence, ttl }
            }
            AcquireOutcome::HeldByAnother(holder) if self.is(Bug::OverstatesRemaining) => {
                AcquireOutcome::HeldByAnother(Holder {
                    remaining: holder.remaining.saturating_add(Duration::from_secs(1)),
                    ..holder
                })
            }
            AcquireOutcome::HeldByAnother(holder) => {
                AcquireOutcome::HeldByAnother(self.told(&key, holder))
            }
            other => other,
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        if self.is(Bug::RefusesNonAsciiKeys)
            && !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            return RenewOutcome::Refused(Refusal::InvalidKey);
        }
        let key = &*self.stored(key);
        let grant = self.inner.grant(key);
        let mut fence = fence;
        let mut token = token;
        let mut applied = ttl;
        if self.is(Bug::RenewIgnoresTerm) {
            if let Some(grant) = grant.filter(|g| g.token.owner == token.owner) {
                token = grant.token;
            }
        }
        if self.is(Bug::RenewRevivesExpired) && grant.is_none() {
            let last = self.last.lock().unwrap().get(key).copied();
            if last == Some((token, fence)) {
                // Written back as it was: same token, same fence, a fresh TTL.
                let _ = self.inner.acquire(key, token, &Identity::EMPTY, ttl).await;
                return RenewOutcome::Renewed { ttl };
            }
        }
        if self.is(Bug::ShortRenewal) {
            applied = short(ttl);
        }
        if self.is(Bug::RenewIgnoresFence) {
            if let Some(grant) = grant.filter(|g| g.token == token) {
                fence = grant.fence;
            }
        }
        if self.is(Bug::RenewDoesNotExtend)
            && grant.is_some_and(|g| g.token == token && g.fence == fence)
        {
            return RenewOutcome::Renewed { ttl };
        }
        if self.is(Bug::RenewRecreates) && grant.is_none() {
            return match self.inner.acquire(key, token, &Identity::EMPTY, ttl).await {
                AcquireOutcome::Granted { ttl, .. } => RenewOutcome::Renewed { ttl },
                _ => RenewOutcome::NotOwner,
            };
        }
        if self.is(Bug::RenewNeverShortens) {
            if let Some(grant) = grant {
                let left = grant
                    .expires_at
                    .saturating_duration_since(tokio::time::Instant::now());
                applied = applied.max(Duration::from_micros(left.as_micros() as u64));
            }
        }
        match self.inner.renew(key, token, fence, applied).await {
            RenewOutcome::Renewed { ttl: r } if self.is(Bug::RenewReportsLess) => {
                RenewOutcome::Renewed {
                    ttl: r.saturating_sub(Duration::from_millis(1)),
                }
            }
            RenewOutcome::Renewed { .. } if self.is(Bug::RenewNeverShortens) => {
                RenewOutcome::Renewed { ttl }
            }
            RenewOutcome::Renewed { ttl: r } if self.is(Bug::ShortRenewal) => {
                let more = ttl.saturating_sub(r);
                self.claimed
                    .lock()
                    .unwrap()
                    .insert(key.to_owned(), (fence, more));
                RenewOutcome::Renewed { ttl }
            }
            RenewOutcome::Renewed { ttl: r } => {
                self.claimed.lock().unwrap().remove(key);
                RenewOutcome::Renewed { ttl: r }
            }
            other => other,
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        if self.is(Bug::RefusesNonAsciiKeys)
            && !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            return ReleaseOutcome::Refused(Refusal::InvalidKey);
        }
        if self.is(Bug::ReleaseNeverLands) {
            return ReleaseOutcome::Indeterminate(leasehold::Indeterminate::Transport);
        }
        if self.is(Bug::ReleaseByIdentity) {
            let same_identity = {
                let grantee = self.grantees.lock().unwrap().get(key).copied();
                let identities = self.identities.lock().unwrap();
                grantee.filter(|&grantee| {
                    grantee != token
                        && identities.get(&token).is_some()
                        && identities.get(&token) == identities.get(&grantee)
                })
            };
            if let Some(grantee) = same_identity {
                return self.inner.release(key, grantee).await;
            }
        }
        let original = key;
        let key = &*self.stored(key);
        if self.is(Bug::ReleaseIgnoresToken) {
            return match self.inner.revoke(key) {
                Some(_) => ReleaseOutcome::Released,
                None => ReleaseOutcome::NotOwner,
            };
        }
        if self.is(Bug::ReleaseOfAFreeKeyIsReleased) && self.inner.grant(key).is_none() {
            return ReleaseOutcome::Released;
        }
        let outcome = self.inner.release(key, token).await;
        if outcome == ReleaseOutcome::Released {
            self.last.lock().unwrap().remove(key);
            self.claimed.lock().unwrap().remove(key);
            if self.is(Bug::FenceKeptWithTheKey) {
                *self
                    .generations
                    .lock()
                    .unwrap()
                    .entry(original.to_owned())
                    .or_default() += 1;
            }
            if self.is(Bug::ReleaseByPrefix) {
                let granted: Vec<String> = self.granted.lock().unwrap().iter().cloned().collect();
                for other in granted.iter().filter(|k| k.starts_with(original)) {
                    self.inner.revoke(other);
                }
            }
        }
        outcome
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        if self.is(Bug::HolderHangs) {
            std::future::pending::<()>().await;
        }
        if self.is(Bug::RefusesNonAsciiKeys)
            && !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            return HolderOutcome::Refused(Refusal::InvalidKey);
        }
        if self.is(Bug::HolderCached) {
            if let Some(&cached) = self.cache.lock().unwrap().get(key) {
                return cached;
            }
        }
        let original = key;
        let key = &*self.stored(key);
        let answer = match self.inner.holder(key).await {
            HolderOutcome::Held(holder) => HolderOutcome::Held(self.told(key, holder)),
            other => other,
        };
        if self.is(Bug::HolderCached) {
            self.cache
                .lock()
                .unwrap()
                .insert(original.to_owned(), answer);
        }
        if !self.is(Bug::DesyncOnDrop) {
            return answer;
        }
        self.replies.lock().unwrap().push_back(answer);
        // The reply is on its way; a request dropped now never takes it.
        tokio::task::yield_now().await;
        self.replies.lock().unwrap().pop_front().unwrap_or(answer)
    }

    async fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) {
        if self.is(Bug::SpuriousRevocation) {
            return;
        }
        self.inner.revoked(&self.stored(key), token, fence).await
    }

    async fn holder_changed(&self, key: &str, seen: Option<Fence>) {
        if self.is(Bug::SpuriousHolderChange) {
            return;
        }
        self.inner.holder_changed(&self.stored(key), seen).await
    }
}

/// Runs the suite against `bug` and checks that `clause` is among the violations.
async fn caught(bug: Bug, clause: &str) {
    let mut caps = Capabilities::new(Duration::from_secs(1));
    caps.granularity = Duration::from_micros(1);
    caps.min_ttl = Duration::from_micros(1);
    let service = Broken::new(bug);
    let violations = check_all(&service, &caps).await;
    assert!(
        violations.iter().any(|v| v.clause == clause),
        "{bug:?} was not caught by `{clause}`; violations: {violations:#?}"
    );
    for violation in &violations {
        eprintln!("{bug:?}: {violation}");
        assert!(violation
            .to_string()
            .starts_with(&format!("clause `{}`:", violation.clause)));
    }
}

/// One test per mutant, and the table of them that the coverage test reads.
macro_rules! mutant {
    ($($test:ident: $bug:ident => $clause:ident;)*) => {
        $(
            #[tokio::test(start_paused = true)]
            async fn $test() {
                caught(Bug::$bug, stringify!($clause)).await;
            }
        )*

        /// Every mutant: its bug and the clause that must catch it.
        const MUTANTS: &[(Bug, &str)] = &[$((Bug::$bug, stringify!($clause))),*];
    };
}

mutant! {
    hanging_holder_query: HolderHangs => grant_on_a_free_key_reports_ttl_and_fence;
    reacquire_with_a_new_fence: ReacquireNewFence => same_token_reacquire_keeps_the_fence;
    moody_rounding: MoodyRounding => grants_are_a_function_of_the_ttl_asked;
    overstated_remaining: OverstatesRemaining => another_token_is_told_who_holds_the_key;
    fence_kept_with_the_key: FenceKeptWithTheKey => fences_increase_across_releases;
    renew_reporting_less: RenewReportsLess => renew_by_the_holder_applies_at_least_the_ttl_asked;
    renew_ignoring_the_fence: RenewIgnoresFence => renew_with_another_fence_is_not_owner;
    renew_ignoring_the_term: RenewIgnoresTerm => renew_by_another_token_is_not_owner;
    renew_recreating: RenewRecreates => renew_never_recreates_a_released_key;
    release_ignoring_the_token: ReleaseIgnoresToken => release_by_another_token_is_not_owner;
    release_of_a_free_key_released: ReleaseOfAFreeKeyIsReleased => release_by_the_holder_frees_the_key;
    cached_holder_query: HolderCached => holder_reports_and_changes_nothing;
    accepting_invalid_keys: AcceptsInvalidKeys => invalid_keys_are_refused;
    refusing_non_ascii_keys: RefusesNonAsciiKeys => odd_but_valid_keys_work_end_to_end;
    release_by_prefix: ReleaseByPrefix => keys_that_share_a_prefix_are_separate;
    truncating_identities: TruncatesIdentity => identities_round_trip;
    spurious_revocation: SpuriousRevocation => revoked_fires_only_when_the_grant_is_gone;
    spurious_holder_change: SpuriousHolderChange => holder_changed_fires_on_every_change;
    late_replies_taken_for_the_next: DesyncOnDrop => abandoned_requests_leave_nothing_behind;
    longer_ttl_than_reported: LongerTtl => the_ttl_is_hard;
    short_grant: ShortGrant => the_ttl_is_hard;
    renew_not_extending: RenewDoesNotExtend => renewals_and_reacquires_extend_the_expiry;
    reacquire_not_extending: ReacquireDoesNotExtend => renewals_and_reacquires_extend_the_expiry;
    renew_reviving_expired: RenewRevivesExpired => renew_never_recreates_an_expired_key;
    renew_never_shortening: RenewNeverShortens => a_renewal_replaces_the_expiry;
    short_renewal: ShortRenewal => a_renewal_holds_for_the_ttl_it_reports;
    release_by_identity: ReleaseByIdentity => a_late_release_never_frees_the_next_holders_grant;
    release_never_landing: ReleaseNeverLands => a_release_whose_first_tries_are_lost_frees_the_key;
}

/// The clause that is not in `check_all` (it takes a hook that makes the service lose
/// its state), and the backend tests whose mutant — a loss that starts no quarantine,
/// on a real server — breaks it.
const QUARANTINE_MUTANTS: &[(&str, &str)] = &[
    (
        "redis",
        include_str!("../../../service/redis/tests/state_loss.rs"),
    ),
    (
        "etcd",
        include_str!("../../../service/etcd/tests/state_loss.rs"),
    ),
    (
        "postgres",
        include_str!("../../../service/postgres/tests/state_loss.rs"),
    ),
];

/// Every clause has a mutant that breaks it, and every mutant is a bug of its own: a
/// clause without one would be a check nobody has seen fail.
#[test]
fn every_clause_has_a_mutant_of_its_own() {
    let bugs: HashSet<Bug> = MUTANTS.iter().map(|&(bug, _)| bug).collect();
    assert_eq!(bugs.len(), MUTANTS.len(), "a bug used for two mutants");
    let missing: Vec<&str> = CLAUSES
        .iter()
        .copied()
        .filter(|clause| !MUTANTS.iter().any(|(_, c)| c == clause))
        .collect();
    assert!(missing.is_empty(), "clauses without a mutant: {missing:?}");
    assert!(MUTANTS.iter().all(|(_, clause)| CLAUSES.contains(clause)));
    for (backend, source) in QUARANTINE_MUTANTS {
        assert!(
            source.contains("fn the_clause_catches_a_loss_that_starts_no_quarantine()")
                && source.contains("a_lost_state_grants_nothing_until_the_quarantine_ends("),
            "the {backend} test of the quarantine clause's mutant is gone"
        );
    }
    println!(
        "{} clauses in check_all, {} mutants ({} distinct bugs); the quarantine clause's \
         mutants: {} backends",
        CLAUSES.len(),
        MUTANTS.len(),
        bugs.len(),
        QUARANTINE_MUTANTS.len()
    );
}
