//! The service's keys and the rules every lock service must keep: hard TTL, fences
//! strictly increasing per key, owner-token compare on renew and release, idempotent
//! re-acquire by the same token. Pure functions of the table and `now`.

use std::hash::{BuildHasher, RandomState};
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

/// A grant as the table keeps it, 56 bytes: the identity shared with the grants
/// before it that named the same one (most of a process's leases name the same
/// `host:pid`), not 65 bytes in every key; its fence is the key's last one (a key's
/// live grant is always the latest); its expiry counted from the table's origin; and
/// who waits for its revocation.
#[derive(Clone, Debug)]
struct Held {
    token: OwnerToken,
    identity: Arc<Identity>,
    /// Nanoseconds after the table's origin (see [`Table::offset`]).
    expires_at: i64,
    /// The waker of the watch on this grant's revocation. One waker, kept with the
    /// grant and gone with it, not a waiting future per holder that every revocation
    /// wakes (nor a waker kept past its grant, holding a finished task's memory).
    watcher: Option<Waker>,
}

/// A live grant and its fence, as [`Key::live`] finds them.
struct Live<'a> {
    held: &'a mut Held,
    fence: Fence,
}

impl Live<'_> {
    /// The grant as a contender sees it at `now` (an offset, as the expiry).
    fn holder(&self, now: i64) -> Holder {
        let remaining = self.held.expires_at.saturating_sub(now).max(0) / 1_000;
        Holder {
            identity: *self.held.identity,
            fence: self.fence,
            remaining: leasehold::Duration::from_micros(remaining.unsigned_abs()),
        }
    }

    fn grant(&self, origin: Instant) -> Grant {
        // The offset came from an instant, so it maps back to one.
        let offset = std::time::Duration::from_nanos(self.held.expires_at.unsigned_abs());
        let expires_at = if self.held.expires_at >= 0 {
            origin.checked_add(offset)
        } else {
            origin.checked_sub(offset)
        };
        Grant {
            token: self.held.token,
            identity: *self.held.identity,
            fence: self.fence,
            expires_at: expires_at.unwrap_or(origin),
        }
    }
}

/// tokio's duration as the core's (microseconds, saturating).
fn core_duration(d: std::time::Duration) -> leasehold::Duration {
    leasehold::Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One key. Kept after its grant ends, so that its fence counter never goes back.
#[derive(Debug)]
struct Key {
    /// The key's name, stored once: the index holds the place of this record.
    name: Box<str>,
    grant: Option<Held>,
    /// The last fence handed out for this key.
    last_fence: u64,
    /// The highest fence whose grant was revoked from outside.
    revoked_fence: u64,
}

impl Key {
    /// The grant, if it has not expired by `now`. Expiry is evaluated lazily, on
    /// every access, so no timer runs per key.
    fn live(&mut self, now: i64) -> Option<Live<'_>> {
        if self
            .grant
            .as_ref()
            .is_some_and(|grant| grant.expires_at <= now)
        {
            self.grant = None;
        }
        let fence = Fence(self.last_fence);
        self.grant.as_mut().map(|held| Live { held, fence })
    }
}

/// How many key records are allocated at a time.
const CHUNK: usize = 64;

/// The keys a table knows, never removed (a key's fence counter must never go back):
/// the records in chunks, in the order the keys came, and a hash table of their
/// places. A hash table's buckets are a power of two, up to half of them empty:
/// holding a 4-byte place there, found again by the name in the record, keeps the
/// empty half small (a million keys: 2,097,152 buckets of 5 bytes, where a map from
/// each name to its place takes 25 bytes a bucket).
#[derive(Debug, Default)]
struct Keys {
    index: hashbrown::HashTable<u32>,
    records: Vec<Vec<Key>>,
    /// Seeded per table, as std's maps are: names may come from outside the process.
    hasher: RandomState,
}

impl Keys {
    /// The place of `key`'s record, if the table knows it.
    fn find(&self, key: &str, hash: u64) -> Option<u32> {
        let same = |&i: &u32| record(&self.records, i).is_some_and(|record| *record.name == *key);
        self.index.find(hash, same).copied()
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Key> {
        let i = self.find(key, self.hasher.hash_one(key))?;
        self.at_mut(i)
    }

    fn at_mut(&mut self, i: u32) -> Option<&mut Key> {
        let i = i as usize;
        self.records.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    /// `key`'s record, made on first use; `None` once four billion keys are known.
    fn entry(&mut self, key: &str) -> Option<&mut Key> {
        let hash = self.hasher.hash_one(key);
        let i = match self.find(key, hash) {
            Some(i) => i,
            None => {
                // Below `u32::MAX`: a watch keeps one more than a place.
                let i = u32::try_from(self.index.len())
                    .ok()
                    .filter(|&i| i < u32::MAX)?;
                if self.records.last().is_none_or(|chunk| chunk.len() == CHUNK) {
                    self.records.push(Vec::with_capacity(CHUNK));
                }
                self.records.last_mut()?.push(Key {
                    name: key.into(),
                    grant: None,
                    last_fence: 0,
                    revoked_fence: 0,
                });
                let (records, hasher) = (&self.records, &self.hasher);
                let rehash = |&i: &u32| {
                    record(records, i).map_or(0, |record| hasher.hash_one(&*record.name))
                };
                self.index.insert_unique(hash, i, rehash);
                i
            }
        };
        let i = i as usize;
        self.records.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

/// The record at place `i`.
fn record(records: &[Vec<Key>], i: u32) -> Option<&Key> {
    let i = i as usize;
    records.get(i / CHUNK)?.get(i % CHUNK)
}

#[derive(Debug)]
pub(crate) struct Table {
    keys: Keys,
    /// The identity the last grant named, shared with the next grant that names it.
    last_identity: Option<Arc<Identity>>,
    /// The instant grants' expiries count from: an `i64` of nanoseconds from it is
    /// 8 bytes less per key than an `Instant`.
    origin: Instant,
}

impl Default for Table {
    fn default() -> Table {
        Table {
            keys: Keys::default(),
            last_identity: None,
            origin: Instant::now(),
        }
    }
}

impl Table {
    /// `at` as nanoseconds from the origin, negative before it: a service made on one
    /// runtime may be used on another whose (paused) clock is behind, and its
    /// instants must keep their order. Saturates 292 years away.
    fn offset(&self, at: Instant) -> i64 {
        let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at.checked_duration_since(self.origin) {
            Some(after) => nanos(after),
            None => -nanos(self.origin.duration_since(at)),
        }
    }

    /// The expiry of a grant given `ttl` at `now`.
    fn expiry(now: i64, ttl: std::time::Duration) -> i64 {
        now.saturating_add(i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX))
    }

    /// `identity`, shared with the last grant's when it is the same.
    fn intern(&mut self, identity: Identity) -> Arc<Identity> {
        match &self.last_identity {
            Some(last) if **last == identity => Arc::clone(last),
            _ => Arc::clone(self.last_identity.insert(Arc::new(identity))),
        }
    }

    pub(crate) fn acquire(
        &mut self,
        key: &str,
        token: OwnerToken,
        identity: Identity,
        ttl: std::time::Duration,
        now: Instant,
    ) -> AcquireOutcome {
        let now = self.offset(now);
        let identity = self.intern(identity);
        let Some(key) = self.keys.entry(key) else {
            // Four billion keys in one shard: no place for another.
            return AcquireOutcome::Refused(leasehold::Refusal::Unsupported);
        };
        let ttl_granted = core_duration(ttl);
        match key.live(now) {
            // The same token again: an earlier attempt was granted but its answer got
            // lost. Grant again with the same fence.
            Some(live) if live.held.token == token => {
                live.held.expires_at = Table::expiry(now, ttl);
                live.held.identity = identity;
                AcquireOutcome::Granted {
                    fence: live.fence,
                    ttl: ttl_granted,
                }
            }
            Some(live) => AcquireOutcome::HeldByAnother(live.holder(now)),
            None => {
                key.last_fence += 1;
                key.grant = Some(Held {
                    token,
                    identity,
                    expires_at: Table::expiry(now, ttl),
                    watcher: None,
                });
                AcquireOutcome::Granted {
                    fence: Fence(key.last_fence),
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
        let now = self.offset(now);
        match self.keys.get_mut(key).and_then(|key| key.live(now)) {
            Some(live) if live.held.token == token && live.fence == fence => {
                live.held.expires_at = Table::expiry(now, ttl);
                RenewOutcome::Renewed {
                    ttl: core_duration(ttl),
                }
            }
            _ => RenewOutcome::NotOwner,
        }
    }

    /// Compare-and-delete: deletes only `token`'s own live grant.
    pub(crate) fn release(&mut self, key: &str, token: OwnerToken, now: Instant) -> ReleaseOutcome {
        let now = self.offset(now);
        let Some(key) = self.keys.get_mut(key) else {
            return ReleaseOutcome::NotOwner;
        };
        match key.live(now) {
            Some(live) if live.held.token == token => {
                key.grant = None;
                ReleaseOutcome::Released
            }
            _ => ReleaseOutcome::NotOwner,
        }
    }

    /// Who holds `key` at `now`.
    pub(crate) fn holder(&mut self, key: &str, now: Instant) -> HolderOutcome {
        let now = self.offset(now);
        match self.keys.get_mut(key).and_then(|key| key.live(now)) {
            Some(live) => HolderOutcome::Held(live.holder(now)),
            None => HolderOutcome::Free,
        }
    }

    pub(crate) fn grant(&mut self, key: &str, now: Instant) -> Option<Grant> {
        let (now, origin) = (self.offset(now), self.origin);
        self.keys
            .get_mut(key)?
            .live(now)
            .map(|live| live.grant(origin))
    }

    /// Deletes the live grant from outside and remembers it was revoked; with it,
    /// the waker of its watcher (to be woken once the table is unlocked).
    pub(crate) fn revoke(&mut self, key: &str, now: Instant) -> Option<(Grant, Option<Waker>)> {
        let (now, origin) = (self.offset(now), self.origin);
        let key = self.keys.get_mut(key)?;
        let grant = key.live(now)?.grant(origin);
        let watcher = key.grant.take().and_then(|held| held.watcher);
        key.revoked_fence = key.revoked_fence.max(grant.fence.0);
        Some((grant, watcher))
    }

    /// Ends the live grant as if its TTL ran out now (no notification).
    pub(crate) fn expire(&mut self, key: &str, now: Instant) -> Option<Grant> {
        let (now, origin) = (self.offset(now), self.origin);
        let key = self.keys.get_mut(key)?;
        let grant = key.live(now)?.grant(origin);
        key.grant = None;
        Some(grant)
    }

    /// Where `key`'s record is, if the table knows the key (records are never
    /// removed, so a place stays the key's).
    pub(crate) fn place(&self, key: &str) -> Option<u32> {
        self.keys.find(key, self.keys.hasher.hash_one(key))
    }

    /// Whether the grant with `fence` (or a later one) of the key at `place` was
    /// revoked; if not, and that grant is live at `now`, `waker` is woken when it is
    /// revoked. A grant that is over can no longer be revoked: its watch waits for
    /// good.
    pub(crate) fn watch_revocation(
        &mut self,
        place: u32,
        fence: Fence,
        waker: &Waker,
        now: Instant,
    ) -> bool {
        let now = self.offset(now);
        let Some(key) = self.keys.at_mut(place) else {
            return false;
        };
        if key.revoked_fence >= fence.0 {
            return true;
        }
        if let Some(live) = key.live(now).filter(|live| live.fence == fence) {
            let watcher = &mut live.held.watcher;
            if !watcher.as_ref().is_some_and(|known| known.will_wake(waker)) {
                *watcher = Some(waker.clone());
            }
        }
        false
    }

    /// Forgets the waker of the watch on the grant with `fence` of the key at
    /// `place`, if that grant is still there (live or expired).
    pub(crate) fn unwatch(&mut self, place: u32, fence: Fence) {
        if let Some(key) = self.keys.at_mut(place) {
            if key.last_fence == fence.0 {
                if let Some(held) = &mut key.grant {
                    held.watcher = None;
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    /// Each name reaches its own record, past the first chunk of records too.
    #[test]
    fn every_key_keeps_its_own_record_across_chunks() {
        use leasehold::{AcquireOutcome, Fence, Identity, Owner, Term};

        let mut table = super::Table::default();
        let now = super::Instant::now();
        let ttl = std::time::Duration::from_secs(1);
        let token = Owner([1; 16]).token(Term(1));
        let keys = 3 * super::CHUNK + 5;
        // Key `i` is granted `i % 5 + 1` times (5 and the chunk share no factor), so
        // its fence tells it from the keys at the same place in other chunks.
        for round in 0..5 {
            for i in (0..keys).filter(|i| i % 5 >= round) {
                let key = format!("k{i}");
                table.acquire(&key, token, Identity::EMPTY, ttl, now);
                table.release(&key, token, now);
            }
        }
        for i in 0..keys {
            let granted = table.acquire(&format!("k{i}"), token, Identity::EMPTY, ttl, now);
            let fence = Fence(i as u64 % 5 + 2);
            assert!(
                matches!(granted, AcquireOutcome::Granted { fence: f, .. } if f == fence),
                "k{i}: {granted:?}"
            );
        }
        assert_eq!(table.len(), keys);
    }

    /// A key the service knows costs its name, this record, and a 4-byte place in a
    /// hash table that is up to half empty: a million leases keep a million of them.
    #[test]
    fn a_key_stays_small() {
        let key = size_of::<super::Key>();
        assert!(key <= 88, "a key is {key} B");
    }
}
