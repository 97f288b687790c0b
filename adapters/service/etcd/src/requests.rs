//! The typed requests: acquire, renew, release, holder, and the revocation watch.

use etcd_client::proto::{PbKeyValue, PbTxnOpResponse, PbTxnResponse};
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use leasehold::{Duration, Fence, Holder, Identity, OwnerToken};

use crate::checks::Read;
use crate::epoch::Marker;
use crate::error::{ErrorKind, EtcdLockError, Op};
use crate::queue::{Queue, Seen};
use crate::service::{
    ttl_secs, Acquired, EtcdLockService, Held, NotHeld, Released, Renewed, Revoked, MAX_TTL_SECS,
};
use crate::value::{self, Stored};

/// A key as this crate reads it: a grant of ours (any token), or not.
enum Found<'a> {
    /// `<token>\n<fence>\n<identity>` on a lease, with a positive create revision.
    Grant(Stored<'a>, Held),
    /// Anything else: not a lease this crate wrote.
    Foreign,
}

fn found(kv: &PbKeyValue) -> Found<'_> {
    match Stored::parse(&kv.value) {
        Some(stored) if kv.lease != 0 && kv.create_revision > 0 => Found::Grant(
            stored,
            Held {
                lease: kv.lease,
                revision: kv.create_revision,
                fence: stored.fence(),
            },
        ),
        _ => Found::Foreign,
    }
}

impl EtcdLockService {
    /// Acquires `key` for `token`, presenting `identity`, for `ttl` (rounded up to
    /// whole seconds).
    ///
    /// 1. Read the key and its fence counter (one transaction). If the key exists, no
    ///    lease is granted: a grant to `token` (an earlier attempt succeeded but its
    ///    answer was lost) → keep *its* lease alive, check it, and answer its fence
    ///    again; a grant to another token → [`Acquired::HeldByAnother`] with its
    ///    identity, fence and remaining TTL; anything else → an
    ///    [`ErrorKind::WrongType`] error (so is a counter that is not a decimal). A
    ///    contender waiting for a held key costs etcd two reads per attempt (the key
    ///    and counter, its lease's TTL), no writes.
    /// 2. Otherwise `LeaseGrant` with the TTL; etcd answers the TTL it applied.
    /// 3. The fence: the larger of the counter + 1 and this client's wall clock in µs
    ///    since the Unix epoch. The clock is the floor for an etcd that lost its data
    ///    or was restored from an older backup (its revisions and the counter start
    ///    again lower); the counter keeps fences increasing whatever the clocks do.
    /// 4. One transaction: if `create_revision(key) == 0` and the counter is as read
    ///    (`mod_revision`), put `key = <token>\n<fence>\n<identity>` attached to the new
    ///    lease and the counter = fence → [`Acquired::Granted`]; otherwise, if the key
    ///    was created since the read, answer as in 1 from the transaction's read, and
    ///    if only the counter moved (a grant came and went in between), a
    ///    [`ErrorKind::Service`] error the lease retries; the new lease is revoked in
    ///    the background either way.
    ///
    /// With [`with_fair`](Self::with_fair), the read also reads the contender's place
    /// and the key's queue; a free key is granted only to the oldest place (the
    /// grant compares the contender's place and deletes it), and an answer other than
    /// a grant takes or keeps the contender's place (see `with_fair`).
    ///
    /// The granted TTL counts from after the request was sent (the lease is granted, or
    /// kept alive, after it), so a deadline the caller computes from its send time is
    /// never later than etcd's expiry.
    pub async fn try_acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: impl Into<Duration>,
    ) -> Result<Acquired, EtcdLockError> {
        // std's `Duration` or the core's.
        let ttl: Duration = ttl.into();
        self.check_key(Op::Read, key)?;
        self.within_max_ttl(Op::Grant, key, ttl)?;
        let secs = ttl_secs(ttl).ok_or_else(|| {
            self.error(Op::Grant, ErrorKind::Unsupported, key)
                .because(format_args!(
                    "a TTL of {} s is above etcd's maximum lease TTL ({} s)",
                    ttl.as_micros() / 1_000_000,
                    crate::MAX_TTL_SECS
                ))
        })?;

        let mut seen = Seen::default();
        if !self.fair {
            return self
                .acquire(key, token, identity, secs, None, &mut seen)
                .await;
        }
        self.forget_expired_places();
        let queue = Queue::new(key, token);
        let answer = self
            .acquire(key, token, identity, secs, Some(&queue), &mut seen)
            .await?;
        match answer {
            Acquired::Granted { .. } => self.leave_queue(key, token, seen.own, "granted"),
            _ => {
                self.take_place(&queue, key, token, identity, secs, seen.own)
                    .await?;
            }
        }
        Ok(answer)
    }

    /// One acquire (see [`try_acquire`](Self::try_acquire)); with `fair`, the queue's
    /// names, and what the read saw of it goes in `seen`.
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        secs: i64,
        fair: Option<&Queue>,
        seen: &mut Seen,
    ) -> Result<Acquired, EtcdLockError> {
        let counter_key = value::fence_key(key);
        let (marker_key, quarantine_key) = (&*self.shared.marker_key, &*self.shared.quarantine_key);
        let mut reads = vec![
            TxnOp::get(key, None),
            TxnOp::get(counter_key.as_str(), None),
            TxnOp::get(marker_key, None),
            TxnOp::get(quarantine_key, None),
        ];
        if let Some(queue) = fair {
            reads.extend(queue.reads());
        }
        let read = self.txn(Op::Read, key, Txn::new().and_then(reads)).await?.0;
        let turn = match fair {
            Some(queue) => {
                let (turn, own) = self.queue_as_read(queue, key, &read, 4)?;
                seen.own = own;
                turn
            }
            None => None,
        };
        if let Some(kv) = self.range_kv(Op::Read, key, &read, 0)? {
            return self.already_held(Op::Read, key, token, kv).await;
        }
        let (counter, counter_revision) =
            self.counter(Op::Read, key, self.range_kv(Op::Read, key, &read, 1)?)?;
        // A free key: unless etcd may have forgotten a grant that is still alive.
        let now = read
            .header
            .as_ref()
            .map(Marker::of)
            .ok_or_else(|| self.protocol(Op::Read, key, "a read without a header"))?;
        let marker = self.range_kv(Op::Read, key, &read, 2)?;
        if let Some(kv) = self.range_kv(Op::Read, key, &read, 3)? {
            self.shared.memory.quarantined();
            return Ok(Acquired::Quarantined {
                remaining: self.quarantine_left(key, kv.lease).await,
            });
        }
        let stored = marker.and_then(|kv| Marker::parse(&kv.value));
        let lost = match (marker, stored) {
            (None, _) => Some("no epoch marker: the data set is new or was emptied"),
            (Some(_), None) => Some("the epoch marker is not `<cluster id> <raft term>`"),
            (Some(_), Some(stored)) => stored.lost_since(now),
        };
        let lost = lost.or_else(|| {
            self.shared
                .memory
                .rolled_back()
                .then_some("this client saw etcd's revision go back")
        });
        if let Some(why) = lost {
            tracing::warn!(key, why, "etcd may have lost grants: starting a quarantine");
            let remaining = self.start_quarantine(key, now).await?;
            return Ok(Acquired::Quarantined { remaining });
        }
        // Fair: a free key goes to the oldest place in the queue (or to anyone while
        // it is empty).
        if let Some(head) = turn {
            let remaining = self.remaining(key, head.lease).await;
            return Ok(Acquired::HeldByAnother(Holder::turn_of(
                head.identity,
                remaining,
            )));
        }
        let marker_revision = marker.map_or(0, |kv| kv.create_revision);
        let fence = (counter + 1).max(wall_clock_micros());
        if fence > MAX_FENCE {
            return Err(self
                .error(Op::Read, ErrorKind::Unsupported, key)
                .because("its fence counter is at 2^63 - 1, the largest fence"));
        }

        let (lease, granted) = self.grant_lease(Op::Grant, key, secs).await?;

        let stored = value::encode(token, fence, identity);
        let mut puts = vec![
            TxnOp::put(
                key,
                stored.clone(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(counter_key.as_str(), fence.to_string(), None),
            TxnOp::get(key, None),
        ];
        // Keep the marker up to date with the cluster and the highest term seen.
        if stored_marker_behind(marker.and_then(|kv| Marker::parse(&kv.value)), now) {
            puts.push(TxnOp::put(marker_key, now.encode(), None));
        }
        let mut compares = vec![
            Compare::create_revision(key, CompareOp::Equal, 0),
            Compare::mod_revision(counter_key.as_str(), CompareOp::Equal, counter_revision),
            // The same epoch, and no quarantine started since the read.
            Compare::create_revision(marker_key, CompareOp::Equal, marker_revision),
            Compare::create_revision(quarantine_key, CompareOp::Equal, 0),
        ];
        // Fair, and the oldest place is this contender's: it is still there (a place
        // that expired since the read lost its turn), and the grant deletes it.
        if let (Some(queue), Some(own)) = (fair, seen.own) {
            compares.push(Compare::create_revision(
                queue.own(),
                CompareOp::Equal,
                own.revision,
            ));
            puts.push(TxnOp::delete(queue.own(), None));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(puts)
            .or_else([TxnOp::get(key, None)]);
        // On an error the put may have happened: the lease is left alone, for a retry
        // to find (and re-grant) it. Unused, it expires by itself after its TTL.
        let answer = self.txn(Op::Acquire, key, txn).await?.0;
        if !answer.succeeded {
            self.revoke_in_background(key, lease, "unused grant");
            let Some(kv) = self.range_kv(Op::Acquire, key, &answer, 0)? else {
                // The key is still free: the counter moved since the read, or the
                // epoch did (a quarantine started), or the contender's place in the
                // queue went, which the next attempt reads.
                return Err(self.error(Op::Acquire, ErrorKind::Service, key).because(
                    "its fence counter, the epoch or the contender's place in the queue moved \
                     during the acquire; try again",
                ));
            };
            // Created since the read.
            return self.already_held(Op::Acquire, key, token, kv).await;
        }

        let kv = self
            .range_kv(Op::Acquire, key, &answer, 2)?
            .ok_or_else(|| {
                self.protocol(Op::Acquire, key, "the key is missing right after its put")
            })?;
        if kv.value != stored || kv.lease != lease || kv.create_revision <= 0 {
            return Err(self.protocol(
                Op::Acquire,
                key,
                format_args!(
                    "the key as put (lease {lease}), etcd answered lease {} create_revision {}",
                    kv.lease, kv.create_revision
                ),
            ));
        }
        let held = Held {
            lease,
            revision: kv.create_revision,
            fence,
        };
        if let Some(old) = self.remember(key, token, held) {
            self.revoke_in_background(key, old.lease, "superseded grant");
        }
        Ok(Acquired::Granted {
            fence: Fence(held.fence),
            ttl: granted,
            lease,
            regranted: false,
        })
    }

    /// Refuses a TTL above `max_ttl` before anything is sent: a grant (or a renewal)
    /// longer than the quarantine could outlive it.
    pub(crate) fn within_max_ttl(
        &self,
        op: Op,
        key: &str,
        ttl: Duration,
    ) -> Result<(), EtcdLockError> {
        if ttl <= self.max_ttl {
            return Ok(());
        }
        Err(self
            .error(op, ErrorKind::Unsupported, key)
            .because(format_args!(
            "a TTL of {:?} is above this service's max_ttl of {:?}, the quarantine that covers \
             the grants etcd may lose; raise max_ttl (the same on every client of this etcd) \
             or ask for less",
            std::time::Duration::from(ttl),
            std::time::Duration::from(self.max_ttl)
        )))
    }

    /// Starts a quarantine (unless one was started meanwhile): an etcd lease of
    /// `max_ttl` (whole seconds, at least etcd's minimum) carrying the quarantine key,
    /// and the epoch marker written anew as `now`. Answers how long it lasts.
    pub(crate) async fn start_quarantine(
        &self,
        key: &str,
        now: Marker,
    ) -> Result<Duration, EtcdLockError> {
        let op = Op::Quarantine;
        let secs = ttl_secs(self.max_ttl).unwrap_or(MAX_TTL_SECS);
        let (lease, granted) = self.grant_lease(op, key, secs).await?;
        let quarantine_key = &*self.shared.quarantine_key;
        let txn = Txn::new()
            .when([Compare::create_revision(
                quarantine_key,
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    quarantine_key,
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(&*self.shared.marker_key, now.encode(), None),
            ])
            .or_else([TxnOp::get(quarantine_key, None)]);
        let answer = self.txn(op, key, txn).await?.0;
        // A quarantine stands now, this one or another client's.
        self.shared.memory.quarantined();
        if answer.succeeded {
            return Ok(granted);
        }
        // Another client started it first: its lease decides.
        self.revoke_in_background(key, lease, "unused quarantine");
        match self.range_kv(op, key, &answer, 0)? {
            Some(kv) => Ok(self.quarantine_left(key, kv.lease).await),
            None => Ok(granted),
        }
    }

    /// Starts a quarantine in the background (a rollback seen by a renewal or a
    /// release, which answer as usual meanwhile); a failure leaves it to the next
    /// acquire.
    pub(crate) fn quarantine_in_background(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.clone();
        runtime.spawn(async move {
            let key = &*service.shared.marker_key;
            let answer = match service.get(Op::Quarantine, key).await {
                Ok(answer) => answer,
                Err(err) => {
                    tracing::debug!(error = %err, "starting the quarantine failed; the next acquire does");
                    return;
                }
            };
            let Some(now) = answer.0.header.as_ref().map(Marker::of) else {
                return;
            };
            if let Err(err) = service.start_quarantine(key, now).await {
                tracing::debug!(error = %err, "starting the quarantine failed; the next acquire does");
            }
        });
    }

    /// How long the quarantine on etcd lease `lease` has left; its whole length
    /// (`max_ttl`) if etcd cannot say (an overstatement: a contender retries late).
    async fn quarantine_left(&self, key: &str, lease: i64) -> Duration {
        match self.time_to_live(key, lease).await {
            Ok(left) if !left.is_zero() => left,
            // Expired since the read, or unknown: at least a second more.
            Ok(_) => Duration::from_secs(1),
            Err(_) => self.max_ttl,
        }
    }

    /// The acquire answer for a key that exists as `kv`: ours from an earlier attempt
    /// (re-granted), held by another, or not a grant at all.
    async fn already_held(
        &self,
        op: Op,
        key: &str,
        token: OwnerToken,
        kv: &PbKeyValue,
    ) -> Result<Acquired, EtcdLockError> {
        let (stored, held) = match found(kv) {
            Found::Grant(stored, held) => (stored, held),
            Found::Foreign => return Err(self.wrong_type(op, key, kv)),
        };
        if !stored.is(&token.encode()) {
            return Ok(Acquired::HeldByAnother(
                self.holder_of(key, stored.identity(), held).await,
            ));
        }
        if let Some(old) = self.remember(key, token, held) {
            self.revoke_in_background(key, old.lease, "superseded grant");
        }
        // Its lease was last kept alive before this request was sent: keep it alive
        // now, so the TTL answered counts from after the send.
        match self.extend(key, token, held).await? {
            Renewed::Renewed { ttl } => Ok(Acquired::Granted {
                fence: Fence(held.fence),
                ttl,
                lease: held.lease,
                regranted: true,
            }),
            // It went away between the read and the keep-alive: the next attempt will
            // find the key free.
            Renewed::NotOwner(why) => Err(self
                .error(Op::KeepAlive, ErrorKind::Service, key)
                .because(format_args!(
                    "the earlier grant ended while it was granted again: {why:?}"
                ))),
        }
    }

    /// The holder of a grant read as `held`, with its lease's remaining TTL (see
    /// [`remaining`](Self::remaining)).
    async fn holder_of(&self, key: &str, identity: Identity, held: Held) -> Holder {
        Holder {
            identity,
            fence: Fence(held.fence),
            remaining: self.remaining(key, held.lease).await,
        }
    }

    /// The remaining TTL of `lease` (a holder's, or a place's in the queue).
    ///
    /// If `LeaseTimeToLive` fails, zero: an understatement, never an overstatement (a
    /// contender that waits for it retries early, not late), and the failure is
    /// logged.
    async fn remaining(&self, key: &str, lease: i64) -> Duration {
        match self.time_to_live(key, lease).await {
            Ok(remaining) => remaining,
            Err(err) => {
                tracing::debug!(key, lease, error = %err, "a lease's TTL is unknown; reported as 0");
                Duration::from_secs(0)
            }
        }
    }

    /// `LeaseGrant` of `secs`: the lease and the TTL etcd applied.
    pub(crate) async fn grant_lease(
        &self,
        op: Op,
        key: &str,
        secs: i64,
    ) -> Result<(i64, Duration), EtcdLockError> {
        let grant = self
            .call(
                op,
                key,
                |mut c| async move { c.lease_grant(secs, None).await },
            )
            .await?;
        if !grant.error().is_empty() {
            return Err(self
                .error(op, ErrorKind::Service, key)
                .because(grant.error()));
        }
        let granted = self.reported_ttl(op, key, grant.ttl())?;
        if grant.id() == 0 {
            return Err(self.protocol(op, key, "lease id 0"));
        }
        Ok((grant.id(), granted))
    }

    /// Who holds `key` now (`None`: nobody). One read of the key, then
    /// `LeaseTimeToLive` of its lease for the remaining TTL (zero if that fails, see
    /// above). A key that holds something else is an [`ErrorKind::WrongType`] error.
    pub async fn try_holder(&self, key: &str) -> Result<Option<Holder>, EtcdLockError> {
        self.check_key(Op::Holder, key)?;
        let answer = self.get(Op::Holder, key).await?.0;
        let Some(kv) = answer.kvs.first() else {
            return Ok(None);
        };
        match found(kv) {
            Found::Grant(stored, held) => {
                Ok(Some(self.holder_of(key, stored.identity(), held).await))
            }
            Found::Foreign => Err(self.wrong_type(Op::Holder, key, kv)),
        }
    }

    /// Raises the fence counter of `key` to at least `at_least` and returns it.
    ///
    /// For recovery when storage has admitted fences above what this etcd would grant
    /// next (fences from another lock service, or a clock that went back across a
    /// loss of etcd's data): seed the counter from the newest fence storage admitted,
    /// so that the *next* grant's fence is newer than it. Never lowers the counter,
    /// and leaves the key alone: a grant that is held keeps its fence and renews. At
    /// most 2^63 − 2, so that one more grant fits below the largest fence.
    pub async fn raise_fence(&self, key: &str, at_least: Fence) -> Result<Fence, EtcdLockError> {
        self.check_key(Op::RaiseFence, key)?;
        if at_least.0 >= MAX_FENCE {
            return Err(self
                .error(Op::RaiseFence, ErrorKind::Unsupported, key)
                .because(
                    "fences stop at 2^63 - 1: the counter can be raised to 2^63 - 2 at most",
                ));
        }
        let counter_key = value::fence_key(key);
        for _ in 0..3 {
            let read = self.get(Op::RaiseFence, &counter_key).await?.0;
            let (counter, revision) = self.counter(Op::RaiseFence, key, read.kvs.first())?;
            if counter >= at_least.0 {
                return Ok(Fence(counter));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    counter_key.as_str(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(
                    counter_key.as_str(),
                    at_least.0.to_string(),
                    None,
                )]);
            if self.txn(Op::RaiseFence, key, txn).await?.0.succeeded {
                return Ok(at_least);
            }
        }
        Err(self
            .error(Op::RaiseFence, ErrorKind::Service, key)
            .because("the fence counter changed under each of 3 attempts"))
    }

    /// The fence counter read as `kv` (none: 0) and its `mod_revision` (none: 0); a
    /// counter that is not a decimal fence, or has a lease, is a
    /// [`ErrorKind::WrongType`] error.
    fn counter(
        &self,
        op: Op,
        key: &str,
        kv: Option<&PbKeyValue>,
    ) -> Result<(u64, i64), EtcdLockError> {
        match kv {
            None => Ok((0, 0)),
            Some(kv) => match value::decimal(&kv.value) {
                Some(counter) if kv.lease == 0 && counter <= MAX_FENCE => {
                    Ok((counter, kv.mod_revision))
                }
                _ => Err(self
                    .error(op, ErrorKind::WrongType, key)
                    .because(format_args!(
                        "its fence counter `{}` is not a decimal fence",
                        value::fence_key(key)
                    ))),
            },
        }
    }

    fn wrong_type(&self, op: Op, key: &str, kv: &PbKeyValue) -> EtcdLockError {
        let why = if kv.lease == 0 && Stored::parse(&kv.value).is_some() {
            "it holds a grant's value but no lease is attached (written by hand?)"
        } else {
            "its value is not `<owner token>\\n<fence>\\n<identity>`"
        };
        self.error(op, ErrorKind::WrongType, key).because(why)
    }

    /// Renews `token`'s grant of `key` with `fence`: keeps its lease alive, then checks
    /// that the key still holds `token`, on that lease, with that create revision.
    ///
    /// The keep-alive alone is not enough: a key deleted from outside leaves its lease
    /// alive (and renewable) with nothing attached. The check runs *after* the
    /// keep-alive, so "still ours at the check" means "ours when the lease was
    /// extended" (a key deleted and re-created in between has another create revision).
    ///
    /// A grant this service did not make (another process, or a restarted one) is
    /// looked up by reading the key: if it holds `token`, its lease is adopted.
    pub async fn try_renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> Result<Renewed, EtcdLockError> {
        self.check_key(Op::KeepAlive, key)?;
        let held = match self.lookup(key, token) {
            Some(held) if held.fence == fence.0 => held,
            // Not known here, or known with another fence (another instance sharing
            // nothing with this one may have made a newer grant): ask etcd.
            _ => match self.discover(key, token).await? {
                Ok(held) => held,
                Err(why) => return Ok(Renewed::NotOwner(why)),
            },
        };
        // The key was deleted and created again for this same token (a late duplicate
        // acquire): a newer grant, which the client holding `fence` cannot write with.
        // Never keep it alive on that client's behalf.
        if held.fence != fence.0 {
            return Ok(Renewed::NotOwner(NotHeld::NewerGrant));
        }
        self.extend(key, token, held).await
    }

    /// Reads the key: the grant it holds for `token`, or why there is none.
    async fn discover(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<Result<Held, NotHeld>, EtcdLockError> {
        let answer = self.get(Op::Check, key).await?;
        let Some(kv) = answer.0.kvs.first() else {
            return Ok(Err(NotHeld::KeyGone));
        };
        match found(kv) {
            Found::Grant(stored, held) if stored.is(&token.encode()) => {
                tracing::debug!(key, %token, lease = held.lease, "adopted a grant this service did not make");
                self.remember(key, token, held);
                Ok(Ok(held))
            }
            _ => Ok(Err(NotHeld::KeyTaken)),
        }
    }

    /// Keep-alive of `held.lease`, then the ownership check (a read of the key).
    async fn extend(
        &self,
        key: &str,
        token: OwnerToken,
        held: Held,
    ) -> Result<Renewed, EtcdLockError> {
        let Some(ttl) = self.keep_alive(key, held.lease).await? else {
            self.forget(key, token);
            return Ok(Renewed::NotOwner(NotHeld::LeaseGone));
        };
        let read = match self.read_after_keep_alive(key, held).await? {
            Read::Unchanged => return Ok(Renewed::Renewed { ttl }),
            Read::Key(kv) => kv,
        };
        let why = match read.as_ref().map(found) {
            None => NotHeld::KeyGone,
            Some(Found::Grant(stored, now)) if stored.is(&token.encode()) && now == held => {
                return Ok(Renewed::Renewed { ttl });
            }
            Some(Found::Grant(stored, now))
                if stored.is(&token.encode()) && now.revision > held.revision =>
            {
                NotHeld::NewerGrant
            }
            Some(_) => NotHeld::KeyTaken,
        };
        // The lease is ours but holds nothing of this grant any more.
        self.forget(key, token);
        self.revoke_in_background(key, held.lease, "orphaned lease");
        Ok(Renewed::NotOwner(why))
    }

    /// One keep-alive of `lease` on its persistent stream (see `keep_alive.rs`):
    /// `Some(ttl)` if etcd extended the lease (the TTL it applied: the lease's granted
    /// TTL), `None` if it has no such lease. The answer is to a keep-alive sent after
    /// this call began, and the whole exchange is bounded by the request timeout.
    pub(crate) async fn keep_alive(
        &self,
        key: &str,
        lease: i64,
    ) -> Result<Option<Duration>, EtcdLockError> {
        let streams = &self.shared.keep_alives;
        let exchange = |c: Client| streams.keep_alive(c, lease);
        match self.timed(Op::KeepAlive, key, exchange).await? {
            Ok(Some(answer)) if answer.ttl() > 0 => {
                if answer.id() != lease {
                    return Err(self.protocol(
                        Op::KeepAlive,
                        key,
                        format_args!(
                            "an answer for lease {lease}, etcd answered for {}",
                            answer.id()
                        ),
                    ));
                }
                self.reported_ttl(Op::KeepAlive, key, answer.ttl())
                    .map(Some)
            }
            // TTL 0 (or less) on the stream: etcd has no such lease.
            Ok(Some(_)) => Ok(None),
            Ok(None) => Err(self
                .error(Op::KeepAlive, ErrorKind::Transport, key)
                .because("the keep-alive stream closed without an answer")),
            // How etcd-client reports TTL 0 on the first answer; confirm it with
            // etcd rather than trust a message.
            Err(etcd_client::Error::LeaseKeepAliveError(message))
                if message == "lease not found" =>
            {
                if self.time_to_live(key, lease).await?.is_zero() {
                    Ok(None)
                } else {
                    Err(self.protocol(
                        Op::KeepAlive,
                        key,
                        "the keep-alive stream refused a lease that etcd still lists",
                    ))
                }
            }
            Err(err) => Err(
                EtcdLockError::from_client(Op::KeepAlive, &self.shared.endpoints, err).for_key(key),
            ),
        }
    }

    /// Releases `token`'s grant of `key`: reads the key, and if it is a grant to
    /// `token` (its value names `token`, a lease is attached), deletes it in a
    /// transaction that compares the value and lease just read (so a key that changed
    /// in between is not deleted; it is read again, at most three times). Then the lease is revoked (it holds nothing any more; a failure to
    /// revoke only leaves it to expire by itself). If the release fails, the lease
    /// this service knows for the grant is revoked in the background, which deletes
    /// the key too if it is still attached.
    pub async fn try_release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<Released, EtcdLockError> {
        self.check_key(Op::Release, key)?;
        // Release is the last request of a term: the grant is forgotten whatever the
        // answer, so a failed release leaves nothing behind in this service.
        let known = self.forget(key, token);
        // A fair contender that gives up releases: it leaves the queue now.
        self.leave_queue(key, token, None, "gave up");
        let released = self.compare_and_delete(key, token).await;
        let revoke_known = |why| {
            if let Some(held) = known {
                self.revoke_in_background(key, held.lease, why);
            }
        };
        let deleted_lease = match released {
            Err(err) => {
                // Revoking our own lease deletes the key if it is still attached.
                revoke_known("release failed");
                return Err(err);
            }
            Ok(None) => {
                revoke_known("released after loss");
                return Ok(Released::NotOwner);
            }
            Ok(Some(lease)) => lease,
        };
        for lease in std::iter::once(deleted_lease)
            .chain(known.map(|h| h.lease).filter(|&l| l != deleted_lease))
        {
            if let Err(err) = self.revoke(key, lease).await {
                tracing::debug!(key, lease, error = %err, "release: revoking the lease failed; it expires by itself");
            }
        }
        Ok(Released::Released)
    }

    /// Deletes `key` if it is a grant to `token`: `Some(lease of the deleted key)`, or
    /// `None` if it is not.
    async fn compare_and_delete(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<Option<i64>, EtcdLockError> {
        let ours = token.encode();
        let answer = self.get(Op::Release, key).await?.0;
        let mut current = answer.kvs.first().cloned();
        for _ in 0..3 {
            let Some(kv) = current.take() else {
                return Ok(None);
            };
            let held = match found(&kv) {
                Found::Grant(stored, held) if stored.is(&ours) => held,
                _ => return Ok(None),
            };
            let txn = Txn::new()
                .when([
                    Compare::value(key, CompareOp::Equal, kv.value),
                    Compare::lease(key, CompareOp::Equal, held.lease),
                ])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]);
            let answer = self.txn(Op::Release, key, txn).await?.0;
            if answer.succeeded {
                return match answer.responses.first().and_then(|r| r.response.as_ref()) {
                    Some(PbTxnOpResponse::ResponseDeleteRange(_)) => Ok(Some(held.lease)),
                    other => Err(self.protocol(
                        Op::Release,
                        key,
                        format_args!("a delete response, etcd answered {other:?}"),
                    )),
                };
            }
            current = self.range_kv(Op::Release, key, &answer, 0)?.cloned();
        }
        Err(self
            .error(Op::Release, ErrorKind::Service, key)
            .because("the key changed under each of 3 compare-and-delete attempts"))
    }

    /// Watches `token`'s grant of `key` (with `fence`) until
    /// etcd shows it gone: the key deleted (released, expired with its lease, revoked,
    /// deleted from outside), or written by anyone else.
    ///
    /// First reads the key (gone already → answers at once), then watches it from the
    /// revision after that read, so nothing in between is missed. Returns an error if
    /// the read or the watch stream fails, or etcd cancels the watch (compaction, no
    /// leader); the `LockService` impl then watches again after a pause.
    pub async fn watch_revocation(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> Result<Revoked, EtcdLockError> {
        self.check_key(Op::Watch, key)?;
        let value = token.encode();
        // The grant's creation of the key, if this service made or adopted it: a key
        // deleted and put again with the same bytes is another creation.
        let known = self
            .lookup(key, token)
            .filter(|held| held.fence == fence.0)
            .map(|held| held.revision);
        let grant = |kv: &PbKeyValue| {
            Stored::parse(&kv.value)
                .is_some_and(|stored| stored.is(&value) && stored.fence() == fence.0)
                && known.is_none_or(|revision| kv.create_revision == revision)
        };

        let read = self.get(Op::Watch, key).await?.0;
        let read_at = read.header.as_ref().map_or(0, |h| h.revision);
        if read_at <= 0 {
            return Err(self.protocol(Op::Watch, key, "a read without a revision"));
        }
        let created = match read.kvs.first() {
            None => {
                return Ok(Revoked {
                    why: NotHeld::KeyGone,
                    revision: read_at,
                })
            }
            Some(kv) if !grant(kv) => {
                return Ok(Revoked {
                    why: NotHeld::KeyTaken,
                    revision: read_at,
                })
            }
            Some(kv) => kv.create_revision,
        };
        // From here on, still the grant only on the creation just read.
        let ours = |kv: &PbKeyValue| kv.create_revision == created && grant(kv);

        self.watch_from(Op::Watch, key, read_at + 1, |put, kv| {
            match put {
                // PUT: still ours only if it is our value on our creation.
                true if ours(kv) => None,
                true => Some(Revoked {
                    why: NotHeld::KeyTaken,
                    revision: kv.mod_revision,
                }),
                false => Some(Revoked {
                    why: NotHeld::KeyGone,
                    revision: kv.mod_revision,
                }),
            }
        })
        .await
    }

    /// Watches `key` until its holder is no longer the grant with fence `seen` (or,
    /// for `None`, until anyone holds it): returns the revision of the change.
    ///
    /// First reads the key (already changed → answers at once), then watches it from
    /// the revision after that read, so nothing in between is missed. A put that keeps
    /// the fence (a re-grant to the same owner) is not a change. Returns an error if
    /// the read or the watch stream fails, or etcd cancels the watch.
    pub async fn watch_holder(&self, key: &str, seen: Option<Fence>) -> Result<i64, EtcdLockError> {
        let op = Op::HolderWatch;
        self.check_key(op, key)?;
        let seen = seen.map(|fence| fence.0);
        let fence_of = |kv: &PbKeyValue| Stored::parse(&kv.value).map(|stored| stored.fence());
        let read = self.get(op, key).await?.0;
        let read_at = read.header.as_ref().map_or(0, |h| h.revision);
        if read_at <= 0 {
            return Err(self.protocol(op, key, "a read without a revision"));
        }
        if read.kvs.first().and_then(fence_of) != seen {
            return Ok(read_at);
        }
        self.watch_from(op, key, read_at + 1, |put, kv| {
            (!put || fence_of(kv) != seen).then_some(kv.mod_revision)
        })
        .await
    }

    /// Watches `key` from `revision` until `changed` (told whether the event is a put,
    /// and the key it carries) returns an answer. Creating the stream is bounded by the
    /// request timeout; the stream itself lives as long as it takes.
    async fn watch_from<T>(
        &self,
        op: Op,
        key: &str,
        revision: i64,
        mut changed: impl FnMut(bool, &PbKeyValue) -> Option<T>,
    ) -> Result<T, EtcdLockError> {
        let options = etcd_client::WatchOptions::new().with_start_revision(revision);
        let mut stream = self
            .call(op, key, |mut c| {
                let options = options.clone();
                async move { c.watch(key, Some(options)).await }
            })
            .await?;
        loop {
            let answer = match stream.message().await {
                Ok(Some(answer)) => answer.0,
                Ok(None) => {
                    return Err(self
                        .error(op, ErrorKind::Transport, key)
                        .because("the watch stream ended"))
                }
                Err(err) => {
                    return Err(
                        EtcdLockError::from_client(op, &self.shared.endpoints, err).for_key(key)
                    )
                }
            };
            for event in &answer.events {
                let Some(kv) = event.kv.as_ref() else {
                    return Err(self.protocol(op, key, "an event without its key"));
                };
                let put = match event.r#type {
                    0 => true,
                    1 => false,
                    other => {
                        return Err(self.protocol(
                            op,
                            key,
                            format_args!("an event of unknown type {other}"),
                        ))
                    }
                };
                if let Some(answer) = changed(put, kv) {
                    return Ok(answer);
                }
            }
            if answer.canceled {
                return Err(self
                    .error(op, ErrorKind::Service, key)
                    .because(format_args!(
                        "etcd cancelled the watch: {} (compact revision {})",
                        answer.cancel_reason, answer.compact_revision
                    )));
            }
        }
    }

    /// The `n`th response of a transaction, as the key it read (`None`: no such key).
    pub(crate) fn range_kv<'a>(
        &self,
        op: Op,
        key: &str,
        answer: &'a PbTxnResponse,
        n: usize,
    ) -> Result<Option<&'a PbKeyValue>, EtcdLockError> {
        self.range(op, key, answer, n).map(<[PbKeyValue]>::first)
    }

    /// The `n`th response of a transaction, as the keys it read.
    pub(crate) fn range<'a>(
        &self,
        op: Op,
        key: &str,
        answer: &'a PbTxnResponse,
        n: usize,
    ) -> Result<&'a [PbKeyValue], EtcdLockError> {
        match answer.responses.get(n).and_then(|r| r.response.as_ref()) {
            Some(PbTxnOpResponse::ResponseRange(range)) => Ok(&range.kvs),
            other => Err(self.protocol(
                op,
                key,
                format_args!("a range response at {n}, etcd answered {other:?}"),
            )),
        }
    }

    /// A TTL etcd reported, in seconds: positive, or the reply makes no sense.
    pub(crate) fn reported_ttl(
        &self,
        op: Op,
        key: &str,
        secs: i64,
    ) -> Result<Duration, EtcdLockError> {
        match u64::try_from(secs) {
            Ok(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
            _ => Err(self.protocol(
                op,
                key,
                format_args!("a positive TTL, etcd answered {secs}"),
            )),
        }
    }
}

/// Whether a grant should write `now` over the stored marker.
fn stored_marker_behind(stored: Option<Marker>, now: Marker) -> bool {
    stored.is_none_or(|stored| stored.behind(now))
}

/// The largest fence: 2^63 − 1, where Redis's counter and SQL's `BIGINT` columns (see
/// `leasehold-storage`) stop too.
const MAX_FENCE: u64 = i64::MAX.unsigned_abs();

/// The wall clock in µs since the Unix epoch (0 if it reads before it): a fence's
/// floor, so an etcd that lost its counter still grants fences above the old ones.
fn wall_clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}
