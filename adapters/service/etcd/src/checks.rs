//! The ownership reads of concurrent renewals, batched: one transaction of reads
//! answers every renewal that was waiting when it was sent (group commit, no timer).
//!
//! A renewal's read must come *after* its keep-alive (see `EtcdLockService::try_renew`):
//! a renewal joins the queue only once its keep-alive was answered, and a batch takes
//! only renewals already queued, then sends its transaction. So each renewal's key is
//! read by a linearizable transaction sent after its own keep-alive was answered —
//! the same evidence as a read of its own, for a fraction of etcd's work when many
//! leases renew at once. A renewal that finds no read in flight reads its own key at
//! once (a plain read): nothing waits for company, and a lone lease pays no batching.

use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::proto::{PbKeyValue, PbTxnOpResponse};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::error::{ErrorKind, EtcdLockError, Op};
use crate::service::{EtcdLockService, Held};

/// At most this many reads in one transaction: etcd's default `--max-txn-ops`.
const MAX_BATCH: usize = 128;

/// What a batch answers each of its renewals: the key as read (`None`: no such key).
type Answer = Result<Option<PbKeyValue>, Failed>;

/// Why a batch failed, for each of its renewals to report about its own key.
#[derive(Clone)]
enum Failed {
    Client(Arc<etcd_client::Error>),
    /// The transaction was not answered within the request timeout.
    Timeout,
    Protocol(String),
}

struct Waiter {
    key: Box<str>,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    /// Batches sent and not yet answered (one, unless the queue filled a batch).
    in_flight: usize,
}

/// The queue of renewals waiting for their ownership read.
#[derive(Default)]
pub(crate) struct Checks {
    queue: Mutex<Queue>,
}

impl Checks {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Waiters are pushed and taken whole: a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A place in `in_flight`, held by whatever runs a read: a lone renewal reading its own
/// key, or a batch task. Dropping it (the read done, failed, or dropped half-way) hands
/// the place to the renewals queued meanwhile — a new batch task takes them — or gives
/// it back if none are, in one critical section: a renewal never waits in the queue
/// with no read in flight to take it.
struct InFlight {
    service: EtcdLockService,
    runtime: tokio::runtime::Handle,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let batch = {
            let mut queue = self.service.shared.checks.queue();
            if queue.waiting.is_empty() {
                queue.in_flight = queue.in_flight.saturating_sub(1);
                return;
            }
            take_batch(&mut queue)
        };
        let place = InFlight {
            service: self.service.clone(),
            runtime: self.runtime.clone(),
        };
        self.runtime.spawn(run_batch(place, batch));
    }
}

/// What the ownership read of a renewal found.
pub(crate) enum Read {
    /// The key is as created for the grant: never written since (create and mod
    /// revision both the grant's), on the grant's lease.
    Unchanged,
    /// The key as read (`None`: no such key), for the caller to judge.
    Key(Option<PbKeyValue>),
}

/// What a renewal does for its read, decided under the queue's lock.
enum Step {
    /// Nothing in flight, nobody waiting: read its own key at once.
    Alone,
    /// Queued; with a batch to send if the queue filled one (or nothing was in flight).
    Queued(Option<Vec<Waiter>>),
}

impl EtcdLockService {
    /// Reads `key` for the ownership check of a renewal whose keep-alive was answered:
    /// at once if no read is in flight, else in the next batch (see the module doc);
    /// bounded by the request timeout.
    pub(crate) async fn read_after_keep_alive(
        &self,
        key: &str,
        held: Held,
    ) -> Result<Read, EtcdLockError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run a batch on: a read of its own.
            return self.read_unless_unchanged(key, held).await;
        };
        let (answer, answered) = oneshot::channel();
        let step = {
            let mut queue = self.shared.checks.queue();
            if queue.in_flight == 0 && queue.waiting.is_empty() {
                queue.in_flight += 1;
                Step::Alone
            } else {
                queue.waiting.push(Waiter {
                    key: Box::from(key),
                    answer,
                });
                if queue.in_flight == 0 || queue.waiting.len() >= MAX_BATCH {
                    queue.in_flight += 1;
                    Step::Queued(Some(take_batch(&mut queue)))
                } else {
                    Step::Queued(None)
                }
            }
        };
        let place = || InFlight {
            service: self.clone(),
            runtime: runtime.clone(),
        };
        match step {
            Step::Alone => {
                let place = place();
                let read = self.read_unless_unchanged(key, held).await;
                // The queue meanwhile goes to a batch task (even if this renewal is
                // dropped during the read).
                drop(place);
                return read;
            }
            Step::Queued(Some(batch)) => {
                runtime.spawn(run_batch(place(), batch));
            }
            // The read in flight takes this renewal when it ends.
            Step::Queued(None) => {}
        }
        let after = self.request_timeout;
        let endpoints = &self.shared.endpoints;
        match tokio::time::timeout(after, answered).await {
            Ok(Ok(Ok(kv))) => Ok(Read::Key(kv)),
            Ok(Ok(Err(Failed::Client(err)))) => {
                Err(EtcdLockError::from_shared_client(Op::Check, endpoints, err).for_key(key))
            }
            Ok(Ok(Err(Failed::Timeout))) | Err(_) => {
                Err(self.error(Op::Check, ErrorKind::Timeout(Some(after)), key))
            }
            Ok(Ok(Err(Failed::Protocol(detail)))) => Err(self.protocol(Op::Check, key, detail)),
            // The batch's task was dropped (the runtime is shutting down).
            Ok(Err(_)) => Err(self
                .error(Op::Check, ErrorKind::Service, key)
                .because("the batched read was dropped before it answered")),
        }
    }

    /// A renewal's read of its own: one transaction comparing the key with the grant
    /// as created (create and mod revision both `held.revision`, lease `held.lease`),
    /// reading it only if it differs. Unchanged since creation means the value is the
    /// one the grant was made (or adopted) with: an adopted grant whose key was written
    /// after its creation never compares equal, and is judged from the read.
    async fn read_unless_unchanged(&self, key: &str, held: Held) -> Result<Read, EtcdLockError> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, held.revision),
                Compare::mod_revision(key, CompareOp::Equal, held.revision),
                Compare::lease(key, CompareOp::Equal, held.lease),
            ])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.txn(Op::Check, key, txn).await?.0;
        if answer.succeeded {
            return Ok(Read::Unchanged);
        }
        Ok(Read::Key(
            self.range_kv(Op::Check, key, &answer, 0)?.cloned(),
        ))
    }

    /// One transaction reading every key of `batch`; each waiter gets its key's answer.
    async fn run_batch(&self, batch: Vec<Waiter>) {
        let reads: Vec<TxnOp> = batch
            .iter()
            .map(|w| TxnOp::get(w.key.as_bytes(), None))
            .collect();
        let txn = Txn::new().and_then(reads);
        let first = batch.first().map_or("", |w| &w.key);
        let before = self.shared.memory.before();
        let answer = self
            .timed(Op::Check, first, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await;
        if let Ok(Ok(answer)) = &answer {
            self.observe(answer.0.header.as_ref(), before);
        }
        let responses = match answer {
            Ok(Ok(answer)) if answer.0.responses.len() == batch.len() => answer.0.responses,
            Ok(Ok(answer)) => {
                let detail = format!(
                    "{} reads in one transaction, etcd answered {}",
                    batch.len(),
                    answer.0.responses.len()
                );
                return fail_all(batch, &Failed::Protocol(detail));
            }
            Ok(Err(err)) => return fail_all(batch, &Failed::Client(Arc::new(err))),
            Err(_) => return fail_all(batch, &Failed::Timeout),
        };
        for (waiter, response) in batch.into_iter().zip(responses) {
            let answer = match response.response {
                Some(PbTxnOpResponse::ResponseRange(range)) => Ok(range.kvs.into_iter().next()),
                other => Err(Failed::Protocol(format!(
                    "a range response, etcd answered {other:?}"
                ))),
            };
            // A renewal that gave up meanwhile no longer listens.
            let _ = waiter.answer.send(answer);
        }
    }
}

/// Runs one batch holding `place`; dropping it at the end hands over to the next.
async fn run_batch(place: InFlight, batch: Vec<Waiter>) {
    place.service.run_batch(batch).await;
}

fn take_batch(queue: &mut Queue) -> Vec<Waiter> {
    let n = queue.waiting.len().min(MAX_BATCH);
    queue.waiting.drain(..n).collect()
}

fn fail_all(batch: Vec<Waiter>, why: &Failed) {
    for waiter in batch {
        let _ = waiter.answer.send(Err(why.clone()));
    }
}
