//! Fair acquires ([`EtcdLockService::with_fair`]): the queue of a key, in the spirit
//! of etcd's `concurrency.Mutex`.
//!
//! A contender's place is the key `<key>{queue}/<owner token>`, its value the
//! contender's identity, attached to an etcd lease of the TTL it asked (its "waiter
//! lease"); arrival order is the place's create revision. No lock key has that name
//! (keys have no braces), nor a fence counter (`<key>{fence}`), nor the epoch keys
//! (`<prefix>{leasehold}…`: what follows `{queue}/` must be an owner token). A key
//! under the prefix that is not a place of this crate (no lease, a name that is not a
//! token, a value that is not an identity) is ignored: it never has the turn, so it
//! can neither block the queue nor be granted anything.

use etcd_client::proto::{PbKeyValue, PbTxnResponse};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use leasehold::{Identity, OwnerToken};

use crate::error::{ErrorKind, EtcdLockError, Op};
use crate::service::{EtcdLockService, Kept, Waiter};
use crate::value;

/// The queue's names, for one key and one contender.
pub(crate) struct Queue {
    /// `<key>{queue}/`.
    prefix: String,
    /// `<key>{queue}/<token>`: the contender's place.
    own: String,
}

impl Queue {
    pub(crate) fn new(key: &str, token: OwnerToken) -> Queue {
        let prefix = prefix(key);
        let own = format!("{prefix}{}", token.encode().as_str());
        Queue { prefix, own }
    }

    /// The contender's place.
    pub(crate) fn own(&self) -> &str {
        &self.own
    }

    /// The two reads a fair acquire adds to its read transaction: the contender's
    /// place, and the queue in arrival order.
    pub(crate) fn reads(&self) -> [TxnOp; 2] {
        [
            TxnOp::get(self.own.as_str(), None),
            by_arrival(&self.prefix),
        ]
    }
}

/// The prefix of `key`'s queue.
fn prefix(key: &str) -> String {
    format!("{key}{{queue}}/")
}

/// A read of the whole queue under `prefix`, oldest place first.
fn by_arrival(prefix: &str) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend),
        ),
    )
}

/// What a fair acquire's read saw of the contender's own place.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) own: Option<Waiter>,
}

/// A place in a queue as read.
pub(crate) struct Place {
    pub(crate) identity: Identity,
    pub(crate) lease: i64,
    /// Whether it is the place named `own`.
    mine: bool,
}

impl Place {
    /// `kv` as a place under `prefix`, or `None` if it is not one of this crate's.
    fn parse(kv: &PbKeyValue, prefix: &str, own: Option<&str>) -> Option<Place> {
        let name = kv.key.strip_prefix(prefix.as_bytes())?;
        if kv.lease == 0 || kv.create_revision <= 0 || !value::is_token(name) {
            return None;
        }
        let identity = Identity::new(std::str::from_utf8(&kv.value).ok()?).ok()?;
        Some(Place {
            identity,
            lease: kv.lease,
            mine: own.is_some_and(|own| kv.key == own.as_bytes()),
        })
    }
}

impl EtcdLockService {
    /// The queue as the read transaction `read` saw it (its place at `at`, the queue
    /// at `at + 1`): the oldest place if it is another contender's (it has the turn),
    /// and the contender's own place. A key at the contender's own place that is not a
    /// place is a [`ErrorKind::WrongType`] error.
    pub(crate) fn queue_as_read(
        &self,
        queue: &Queue,
        key: &str,
        read: &PbTxnResponse,
        at: usize,
    ) -> Result<(Option<Place>, Option<Waiter>), EtcdLockError> {
        let own = match self.range_kv(Op::Read, key, read, at)? {
            None => None,
            Some(kv) => match Place::parse(kv, &queue.prefix, None) {
                Some(_) => Some(Waiter {
                    lease: kv.lease,
                    revision: kv.create_revision,
                }),
                None => return Err(self.not_a_place(Op::Read, key, queue.own())),
            },
        };
        let head = self
            .range(Op::Read, key, read, at + 1)?
            .iter()
            .find_map(|kv| Place::parse(kv, &queue.prefix, Some(queue.own())));
        Ok((head.filter(|head| !head.mine), own))
    }

    /// Takes or keeps `token`'s place in `key`'s queue after an answer other than a
    /// grant. `seen`: its place as the acquire's read saw it. A place that exists is
    /// kept alive (one keep-alive); one that does not (the first attempt, or it
    /// expired) is put anew on a new lease of `secs`.
    pub(crate) async fn take_place(
        &self,
        queue: &Queue,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        secs: i64,
        seen: Option<Waiter>,
    ) -> Result<(), EtcdLockError> {
        let waiters = &self.shared.waiters;
        let ttl = std::time::Duration::from_secs(secs.unsigned_abs());
        let kept = |lease| Kept {
            lease,
            until: std::time::Instant::now() + ttl,
        };
        if let Some(own) = seen {
            if self.keep_alive(key, own.lease).await?.is_some() {
                if let Some(old) = self.remember_in(waiters, key, token, kept(own.lease)) {
                    self.revoke_in_background(key, old.lease, "superseded place");
                }
                return Ok(());
            }
            // Expired since the read: a new place, at the back.
            self.forget_in(waiters, key, token);
        } else if let Some(old) = self.forget_in(waiters, key, token) {
            // Its place went (expired, or deleted from outside).
            self.revoke_in_background(key, old.lease, "lost place");
        }
        let (lease, _) = self.grant_lease(Op::Queue, key, secs).await?;
        let put = Txn::new()
            .when([Compare::create_revision(queue.own(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    queue.own(),
                    identity.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(queue.own(), None),
            ])
            .or_else([TxnOp::get(queue.own(), None)]);
        // On an error the put may have happened: the lease is left to expire (a
        // place nobody keeps alive leaves within its TTL).
        let answer = self.txn(Op::Queue, key, put).await?.0;
        let at = usize::from(answer.succeeded);
        if !answer.succeeded {
            // Another attempt of the same token put it first: that one is the place.
            self.revoke_in_background(key, lease, "unused place");
        }
        let kv = self
            .range_kv(Op::Queue, key, &answer, at)?
            .ok_or_else(|| self.protocol(Op::Queue, key, "the place is missing after its put"))?;
        if Place::parse(kv, &queue.prefix, None).is_none() {
            return Err(self.not_a_place(Op::Queue, key, queue.own()));
        }
        if let Some(old) = self.remember_in(waiters, key, token, kept(kv.lease)) {
            self.revoke_in_background(key, old.lease, "superseded place");
        }
        Ok(())
    }

    /// Forgets the places whose contenders stopped asking (their TTL has passed since
    /// their last attempt: etcd expired them), closing their keep-alive streams.
    pub(crate) fn forget_expired_places(&self) {
        let now = std::time::Instant::now();
        for expired in self.shared.waiters.remove_where(|kept| kept.until <= now) {
            self.shared.keep_alives.close(expired.lease);
        }
    }

    /// How many places in queues this service keeps alive for its contenders.
    pub fn places(&self) -> usize {
        self.shared.waiters.len()
    }

    /// Forgets `token`'s place in `key`'s queue (granted, or given up) and revokes
    /// its lease in the background, which deletes the place if it is still there;
    /// also the lease of the place `seen` by the last read, if another.
    pub(crate) fn leave_queue(
        &self,
        key: &str,
        token: OwnerToken,
        seen: Option<Waiter>,
        why: &'static str,
    ) {
        let known = self.forget_in(&self.shared.waiters, key, token);
        for lease in known.map(|w| w.lease).into_iter().chain(
            seen.map(|w| w.lease)
                .filter(|&l| Some(l) != known.map(|w| w.lease)),
        ) {
            self.revoke_in_background(key, lease, why);
        }
    }

    /// The contenders waiting for `key` on a fair service, oldest first: the
    /// identity of each live place in its queue (see [`with_fair`](Self::with_fair)).
    /// One linearizable read. Places leave when granted, released, or within their TTL
    /// when their contender stops asking; keys under the queue's prefix that are not
    /// places are left out.
    pub async fn waiting(&self, key: &str) -> Result<Vec<Identity>, EtcdLockError> {
        self.check_key(Op::Queue, key)?;
        let prefix = prefix(key);
        let read = Txn::new().and_then([by_arrival(&prefix)]);
        let answer = self.txn(Op::Queue, key, read).await?.0;
        Ok(self
            .range(Op::Queue, key, &answer, 0)?
            .iter()
            .filter_map(|kv| Place::parse(kv, &prefix, None))
            .map(|place| place.identity)
            .collect())
    }

    fn not_a_place(&self, op: Op, key: &str, own: &str) -> EtcdLockError {
        self.error(op, ErrorKind::WrongType, key)
            .because(format_args!(
                "`{own}`, this contender's place in the queue, holds something else (no \
                 lease, or a value that is not an identity)"
            ))
    }
}
