//! What every clause uses: fresh keys and owners, calls bounded by the request
//! timeout, and the failure that names the clause.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, Owner, OwnerToken,
    ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_driver::LocalLockService;

use crate::caps::{std_of, Capabilities};

/// A clause the service broke: which one, and what differed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The clause, as named in [`CLAUSES`](crate::CLAUSES) (its function's name).
    pub clause: &'static str,
    /// What was asked, what the contract expects, what came back.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "clause `{}`: {}", self.clause, self.detail)
    }
}

impl std::error::Error for Violation {}

/// What a clause returns.
pub type Verdict = Result<(), Violation>;

/// Fails the clause with a formatted detail unless `cond` holds.
macro_rules! ensure {
    ($ctx:expr, $cond:expr, $($detail:tt)+) => {
        if !$cond {
            return Err($ctx.violation(format!($($detail)+)));
        }
    };
}
pub(crate) use ensure;

/// Per-process randomness for keys and owners, so that runs against one server
/// (several test binaries, or a server kept between runs) never share a key.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // splitmix64 of time and pid: spreads close values apart.
        let mut z = nanos ^ (u64::from(std::process::id()) << 32);
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

fn next() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// One clause's run: its service, limits, name and key prefix.
pub(crate) struct Ctx<'a, S> {
    pub(crate) s: &'a S,
    pub(crate) caps: &'a Capabilities,
    clause: &'static str,
    prefix: String,
}

impl<'a, S: LocalLockService> Ctx<'a, S> {
    pub(crate) fn new(s: &'a S, caps: &'a Capabilities, clause: &'static str) -> Self {
        Ctx {
            s,
            caps,
            clause,
            prefix: format!("lh-conformance/{:016x}.{}/{clause}", seed(), next()),
        }
    }

    pub(crate) fn violation(&self, detail: String) -> Violation {
        Violation {
            clause: self.clause,
            detail,
        }
    }

    /// A key of this clause's own: `<run prefix>/<clause>/<name>`.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }

    /// A key of this clause's own of exactly `len` bytes, ending in `tail` (which
    /// must fit after the prefix).
    pub(crate) fn key_of_len(&self, len: usize, tail: &str) -> String {
        let mut key = self.key("");
        let pad = len.saturating_sub(key.len() + tail.len());
        key.extend(std::iter::repeat_n('x', pad));
        key.push_str(tail);
        key
    }

    /// A fresh owner's token, in its first term.
    pub(crate) fn token(&self) -> OwnerToken {
        let mut bytes = [0u8; 16];
        let (hi, lo) = bytes.split_at_mut(8);
        hi.copy_from_slice(&seed().to_le_bytes());
        lo.copy_from_slice(&next().to_le_bytes());
        Owner(bytes).token(Term(1))
    }

    /// An identity naming `who`.
    pub(crate) fn identity(&self, who: &str) -> Identity {
        Identity::lossy(&format!("conformance {who}"))
    }

    /// The TTL the clauses ask for.
    pub(crate) fn ttl(&self) -> Duration {
        self.caps.ttl
    }

    /// Sleeps on tokio's clock (real time on a real server, virtual time when paused).
    pub(crate) async fn sleep_until(&self, until: tokio::time::Instant) {
        tokio::time::sleep_until(until).await;
    }

    /// Awaits `call`, failing the clause if it takes longer than the request timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, Violation> {
        let limit = std_of(self.caps.request_timeout);
        tokio::time::timeout(limit, call)
            .await
            .map_err(|_| self.violation(format!("{what} did not answer within {limit:?}")))
    }

    pub(crate) async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<AcquireOutcome, Violation> {
        let what = format!("acquire({key:?}, {token}, ttl {:?})", std_of(ttl));
        self.bounded(&what, self.s.acquire(key, token, identity, ttl))
            .await
    }

    pub(crate) async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> Result<RenewOutcome, Violation> {
        let what = format!("renew({key:?}, {token}, {fence}, ttl {:?})", std_of(ttl));
        self.bounded(&what, self.s.renew(key, token, fence, ttl))
            .await
    }

    pub(crate) async fn release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<ReleaseOutcome, Violation> {
        let what = format!("release({key:?}, {token})");
        self.bounded(&what, self.s.release(key, token)).await
    }

    pub(crate) async fn holder(&self, key: &str) -> Result<HolderOutcome, Violation> {
        let what = format!("holder({key:?})");
        self.bounded(&what, self.s.holder(key)).await
    }

    /// Acquires a key that must be granted with exactly `ttl` (the capabilities say
    /// the service applies it as asked); the fence.
    pub(crate) async fn granted(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Fence, Violation> {
        match self.acquire(key, token, identity, ttl).await? {
            AcquireOutcome::Granted { fence, ttl: g } => {
                ensure!(
                    self,
                    g == ttl,
                    "acquire({key:?}) on a free key asked for {:?} (a TTL the capabilities \
                     say it applies as asked) and was granted {:?}",
                    std_of(ttl),
                    std_of(g)
                );
                Ok(fence)
            }
            other => Err(self.violation(format!(
                "acquire({key:?}) on a free key: expected Granted, got {other:?}"
            ))),
        }
    }

    /// `holder(key)` must report `Held`; the holder.
    pub(crate) async fn held(&self, key: &str, why: &str) -> Result<Holder, Violation> {
        match self.holder(key).await? {
            HolderOutcome::Held(holder) => Ok(holder),
            other => Err(self.violation(format!(
                "holder({key:?}) {why}: expected Held, got {other:?}"
            ))),
        }
    }

    /// `holder(key)` must report `Held` by `identity` with `fence`, at most `ttl` left.
    pub(crate) async fn held_by(
        &self,
        key: &str,
        identity: &Identity,
        fence: Fence,
        ttl: Duration,
        why: &str,
    ) -> Verdict {
        let holder = self.held(key, why).await?;
        ensure!(
            self,
            holder.identity == *identity && holder.fence == fence && holder.remaining <= ttl,
            "holder({key:?}) {why}: expected identity {identity:?}, {fence}, remaining <= \
             {:?}; got {holder:?}",
            std_of(ttl)
        );
        Ok(())
    }

    /// `holder(key)` must report `Free`.
    pub(crate) async fn free(&self, key: &str, why: &str) -> Verdict {
        match self.holder(key).await? {
            HolderOutcome::Free => Ok(()),
            other => Err(self.violation(format!(
                "holder({key:?}) {why}: expected Free, got {other:?}"
            ))),
        }
    }

    /// Renewing must answer `Renewed { ttl: r }` with `r >= ttl`; `r`.
    pub(crate) async fn renewed(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
        why: &str,
    ) -> Result<Duration, Violation> {
        match self.renew(key, token, fence, ttl).await? {
            RenewOutcome::Renewed { ttl: r } => {
                ensure!(
                    self,
                    r >= ttl,
                    "renew({key:?}, {fence}, ttl {:?}) {why}: answered Renewed with ttl {:?}, \
                     less than asked",
                    std_of(ttl),
                    std_of(r)
                );
                Ok(r)
            }
            other => Err(self.violation(format!(
                "renew({key:?}, {fence}) {why}: expected Renewed, got {other:?}"
            ))),
        }
    }

    /// Renewing must answer `NotOwner`.
    pub(crate) async fn renew_not_owner(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        why: &str,
    ) -> Verdict {
        let outcome = self.renew(key, token, fence, self.ttl()).await?;
        ensure!(
            self,
            outcome == RenewOutcome::NotOwner,
            "renew({key:?}, {token}, {fence}) {why}: expected NotOwner, got {outcome:?}"
        );
        Ok(())
    }

    /// Releasing must answer `expected`.
    pub(crate) async fn release_is(
        &self,
        key: &str,
        token: OwnerToken,
        expected: ReleaseOutcome,
        why: &str,
    ) -> Verdict {
        let outcome = self.release(key, token).await?;
        ensure!(
            self,
            outcome == expected,
            "release({key:?}, {token}) {why}: expected {expected:?}, got {outcome:?}"
        );
        Ok(())
    }

    /// The timing check, on the service's own time base: a grant (or renewal) of `ttl`
    /// whose request was sent at `sent` must still turn another token away — acquire
    /// answers `HeldByAnother` naming `identity` and `fence` — when asked before
    /// `sent + ttl − tolerance`, and report at most `ttl` left and no less than what is
    /// left of `sent + ttl` when the answer came, less the tolerance and the
    /// service's granularity (which its report of the remaining time may round down).
    /// A service that applies less than the TTL it reported fails here.
    pub(crate) async fn refused_until(
        &self,
        key: &str,
        identity: &Identity,
        fence: Fence,
        ttl: Duration,
        sent: tokio::time::Instant,
        why: &str,
    ) -> Verdict {
        let them = self.identity("contender");
        let asked = tokio::time::Instant::now();
        let answer = self.acquire(key, self.token(), &them, self.ttl()).await?;
        let answered = tokio::time::Instant::now();
        let (at, expiry) = (asked.saturating_duration_since(sent), std_of(ttl));
        let holder = match answer {
            AcquireOutcome::HeldByAnother(holder) => holder,
            other => {
                return Err(self.violation(format!(
                    "acquire({key:?}) by another token {why}, {at:?} after the request that \
                     set a TTL of {expiry:?} was sent (tolerance {:?}): expected \
                     HeldByAnother, got {other:?} — the service applied less than the TTL \
                     it reported",
                    std_of(self.caps.tolerance)
                )))
            }
        };
        let left = (sent + expiry).saturating_duration_since(answered);
        let slack = std_of(self.caps.tolerance.saturating_add(self.caps.granularity));
        let at_least = left.saturating_sub(slack);
        let remaining = std_of(holder.remaining);
        ensure!(
            self,
            holder.identity == *identity
                && holder.fence == fence
                && remaining <= expiry
                && remaining >= at_least,
            "acquire({key:?}) by another token {why}: expected HeldByAnother with identity \
             {identity:?}, {fence}, remaining between {at_least:?} ({left:?} left of the TTL \
             of {expiry:?} since its request was sent, less tolerance and granularity \
             {slack:?}) and {expiry:?}; got {holder:?}"
        );
        Ok(())
    }

    /// Acquiring must answer `HeldByAnother` naming `identity` and `fence`, with at
    /// most `ttl` left.
    pub(crate) async fn held_by_another(
        &self,
        key: &str,
        contender: OwnerToken,
        identity: &Identity,
        fence: Fence,
        ttl: Duration,
        why: &str,
    ) -> Verdict {
        let them = self.identity("contender");
        match self.acquire(key, contender, &them, self.ttl()).await? {
            AcquireOutcome::HeldByAnother(holder) => {
                ensure!(
                    self,
                    holder.identity == *identity
                        && holder.fence == fence
                        && holder.remaining <= ttl,
                    "acquire({key:?}) by another token {why}: expected HeldByAnother with \
                     identity {identity:?}, {fence}, remaining <= {:?}; got {holder:?}",
                    std_of(ttl)
                );
                Ok(())
            }
            other => Err(self.violation(format!(
                "acquire({key:?}) by another token {why}: expected HeldByAnother, got {other:?}"
            ))),
        }
    }
}
