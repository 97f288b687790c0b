//! The service's keys and the rules every lock service must keep: hard TTL, fences
//! strictly increasing per key, owner-token compare on renew and release, idempotent
//! re-acquire by the same token. Pure functions of the table and `now`.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Waker;

use leasehold::{
    AcquireOutcome, Fence, Holder, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use tokio::time::Instant;

/// A live grant of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Who holds it.
    pub token: OwnerToken,
    /// Who holds it, in words.
    pub identity: Identity,
    /// Its fence.
    pub fence: Fence,
    /// When the service expires it (its hard TTL), on tokio's clock.
    pub expires_at: Instant,
}

/// A grant as the table keeps it: the identity shared with the grants before it that
/// named the same one (most of a process's leases name the same `host:pid`), not 65
/// bytes in every key; and who waits for its revocation.
#[derive(Clone, Debug)]
struct Held {
    token: OwnerToken,
    identity: Arc<Identity>,
    fence: Fence,
    expires_at: Instant,
    /// The waker of the watch on this grant's revocation. One waker, kept with the
    /// grant and gone with it, not a waiting future per holder that every revocation
    /// wakes (nor a waker kept past its grant, holding a finished task's memory).
    watcher: Option<Waker>,
}

impl Held {
    /// The grant as a contender sees it at `now`.
    fn holder(&self, now: Instant) -> Holder {
        Holder {
            identity: *self.identity,
            fence: self.fence,
            remaining: core_duration(self.expires_at.saturating_duration_since(now)),
        }
    }

    fn grant(&self) -> Grant {
        Grant {
            token: self.token,
            identity: *self.identity,
            fence: self.fence,
            expires_at: self.expires_at,
        }
    }
}

/// tokio's duration as the core's (microseconds, saturating).
fn core_duration(d: std::time::Duration) -> leasehold::Duration {
    leasehold::Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One key. Kept after its grant ends, so that its fence counter never goes back.
#[derive(Debug, Default)]
struct Key {
    grant: Option<Held>,
    /// The last fence handed out for this key.
    last_fence: u64,
    /// The highest fence whose grant was revoked from outside.
    revoked_fence: u64,
}

impl Key {
    /// The grant, if it has not expired by `now`. Expiry is evaluated lazily, on
    /// every access, so no timer runs per key.
    fn live(&mut self, now: Instant) -> Option<&mut Held> {
        if self
            .grant
            .as_ref()
            .is_some_and(|grant| grant.expires_at <= now)
        {
            self.grant = None;
        }
        self.grant.as_mut()
    }
}

#[derive(Debug, Default)]
pub(crate) struct Table {
    keys: HashMap<Box<str>, Key>,
    /// The identity the last grant named, shared with the next grant that names it.
    last_identity: Option<Arc<Identity>>,
}

impl Table {
    /// `identity`, shared with the last grant's when it is the same.
    fn intern(&mut self, identity: Identity) -> Arc<Identity> {
        match &self.last_identity {
            Some(last) if **last == identity => Arc::clone(last),
            _ => Arc::clone(self.last_identity.insert(Arc::new(identity))),
        }
    }

    fn key(&mut self, key: &str) -> &mut Key {
        // Look up first so the common case does not allocate the key's name.
        if !self.keys.contains_key(key) {
            self.keys.insert(key.into(), Key::default());
        }
        self.keys.get_mut(key).expect("inserted above")
    }

    pub(crate) fn acquire(
        &mut self,
        key: &str,
        token: OwnerToken,
        identity: Identity,
        ttl: std::time::Duration,
        now: Instant,
    ) -> AcquireOutcome {
        let identity = self.intern(identity);
        let key = self.key(key);
        let ttl_granted = core_duration(ttl);
        match key.live(now) {
            // The same token again: an earlier attempt was granted but its answer got
            // lost. Grant again with the same fence.
            Some(grant) if grant.token == token => {
                grant.expires_at = now + ttl;
                grant.identity = identity;
                AcquireOutcome::Granted {
                    fence: grant.fence,
                    ttl: ttl_granted,
                }
            }
            Some(grant) => AcquireOutcome::HeldByAnother(grant.holder(now)),
            None => {
                key.last_fence += 1;
                let fence = Fence(key.last_fence);
                key.grant = Some(Held {
                    token,
                    identity,
                    fence,
                    expires_at: now + ttl,
                    watcher: None,
                });
                AcquireOutcome::Granted {
                    fence,
                    ttl: ttl_granted,
                }
            }
        }
    }

    /// Compare-and-expire: extends only `token`'s own live grant with `fence`.
    pub(crate) fn renew(
        &mut self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: std::time::Duration,
        now: Instant,
    ) -> RenewOutcome {
        match self.keys.get_mut(key).and_then(|key| key.live(now)) {
            Some(grant) if grant.token == token && grant.fence == fence => {
                grant.expires_at = now + ttl;
                RenewOutcome::Renewed {
                    ttl: core_duration(ttl),
                }
            }
            _ => RenewOutcome::NotOwner,
        }
    }

    /// Compare-and-delete: deletes only `token`'s own live grant.
    pub(crate) fn release(&mut self, key: &str, token: OwnerToken, now: Instant) -> ReleaseOutcome {
        let Some(key) = self.keys.get_mut(key) else {
            return ReleaseOutcome::NotOwner;
        };
        match key.live(now) {
            Some(grant) if grant.token == token => {
                key.grant = None;
                ReleaseOutcome::Released
            }
            _ => ReleaseOutcome::NotOwner,
        }
    }

    /// Who holds `key` at `now`.
    pub(crate) fn holder(&mut self, key: &str, now: Instant) -> HolderOutcome {
        match self.keys.get_mut(key).and_then(|key| key.live(now)) {
            Some(held) => HolderOutcome::Held(held.holder(now)),
            None => HolderOutcome::Free,
        }
    }

    pub(crate) fn grant(&mut self, key: &str, now: Instant) -> Option<Grant> {
        self.keys.get_mut(key)?.live(now).map(|held| held.grant())
    }

    /// Deletes the live grant from outside and remembers it was revoked; with it,
    /// the waker of its watcher (to be woken once the table is unlocked).
    pub(crate) fn revoke(&mut self, key: &str, now: Instant) -> Option<(Grant, Option<Waker>)> {
        let key = self.keys.get_mut(key)?;
        let grant = key.live(now)?.grant();
        let watcher = key.grant.take().and_then(|held| held.watcher);
        key.revoked_fence = key.revoked_fence.max(grant.fence.0);
        Some((grant, watcher))
    }

    /// Ends the live grant as if its TTL ran out now (no notification).
    pub(crate) fn expire(&mut self, key: &str, now: Instant) -> Option<Grant> {
        let key = self.keys.get_mut(key)?;
        let grant = key.live(now)?.grant();
        key.grant = None;
        Some(grant)
    }

    /// Whether the grant with `fence` (or a later one) of `key` was revoked; if not,
    /// and that grant is live at `now`, `waker` is woken when it is revoked. A grant
    /// that is over can no longer be revoked: its watch waits for good.
    pub(crate) fn watch_revocation(
        &mut self,
        key: &str,
        fence: Fence,
        waker: &Waker,
        now: Instant,
    ) -> bool {
        let Some(key) = self.keys.get_mut(key) else {
            return false; // never granted here, so never revoked
        };
        if key.revoked_fence >= fence.0 {
            return true;
        }
        if let Some(held) = key.live(now).filter(|held| held.fence == fence) {
            if !held
                .watcher
                .as_ref()
                .is_some_and(|known| known.will_wake(waker))
            {
                held.watcher = Some(waker.clone());
            }
        }
        false
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}
