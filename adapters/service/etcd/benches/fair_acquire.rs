//! What fairness (`EtcdLockService::with_fair`) costs an acquire, against the same
//! single-member `etcd` (which this binary starts), fair next to not fair:
//!
//! * **free key**: `try_acquire` of a free key (then its release, not timed);
//! * **waiting**: `try_acquire` of a key another token holds, the attempts after the
//!   first (the first fair one also takes the place: a lease grant and a put);
//! * **first wait**: the first such attempt.
//!
//! For each: the median and 90th percentile latency, and the gRPC messages etcd
//! received per attempt, by method (its `grpc_server_msg_received_total`; a
//! keep-alive on a stream counts one, opening a stream one more).
//!
//! ```text
//! cargo bench -p leasehold-etcd --bench fair_acquire
//! LEASEHOLD_BENCH_N=50 cargo bench -p leasehold-etcd --bench fair_acquire
//! ```
//!
//! Fair and plain alternate attempt by attempt, so a noisy neighbour hits both alike.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold_etcd::{Acquired, EtcdLockService};

const TTL_MS: u64 = 10_000;

#[derive(Default)]
struct Tally {
    times: Vec<StdDuration>,
    messages: BTreeMap<String, u64>,
    attempts: u64,
}

impl Tally {
    fn add(
        &mut self,
        took: StdDuration,
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
    ) {
        self.times.push(took);
        self.attempts += 1;
        for (method, n) in after {
            let delta = n - before.get(method).copied().unwrap_or(0);
            if delta > 0 {
                *self.messages.entry(method.clone()).or_insert(0) += delta;
            }
        }
    }

    fn report(&mut self, what: &str) {
        self.times.sort_unstable();
        let at = |q: f64| self.times[((self.times.len() - 1) as f64 * q) as usize];
        let per: Vec<String> = self
            .messages
            .iter()
            .map(|(m, n)| format!("{m} {:.2}", *n as f64 / self.attempts as f64))
            .collect();
        let total: u64 = self.messages.values().sum();
        println!(
            "{what:<22} median {:>8.2?}  p90 {:>8.2?}  messages/attempt {:.2} ({})",
            at(0.5),
            at(0.9),
            total as f64 / self.attempts as f64,
            per.join(", ")
        );
    }
}

/// etcd's message counts once the background revokes of the last attempt landed.
async fn settled(port: u16) -> BTreeMap<String, u64> {
    let mut last = grpc_messages(port);
    loop {
        tokio::time::sleep(StdDuration::from_millis(30)).await;
        let now = grpc_messages(port);
        if now == last {
            return now;
        }
        last = now;
    }
}

fn main() {
    let n: usize = std::env::var("LEASEHOLD_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let cluster = EtcdCluster::single();
    let port = cluster.client_port(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let plain = service(&cluster).await;
        let fair = service(&cluster).await.with_fair(true);
        let services: [(&str, &EtcdLockService); 2] = [("plain", &plain), ("fair", &fair)];
        let who = identity("bench");
        let ttl = ms(TTL_MS);
        // Warm the channel and etcd.
        for (_, s) in services {
            let t = token();
            s.try_acquire("warm", t, &who, ttl).await.unwrap();
            s.try_release("warm", t).await.unwrap();
        }

        let mut free: [Tally; 2] = Default::default();
        for i in 0..n {
            for (j, (_, s)) in services.iter().enumerate() {
                let key = format!("free-{i}");
                let t = token();
                let before = settled(port).await;
                let start = StdInstant::now();
                let answer = s.try_acquire(&key, t, &who, ttl).await.unwrap();
                let took = start.elapsed();
                assert!(matches!(answer, Acquired::Granted { .. }), "{answer:?}");
                let after = settled(port).await;
                free[j].add(took, &before, &after);
                s.try_release(&key, t).await.unwrap();
            }
        }

        let mut first: [Tally; 2] = Default::default();
        let mut waiting: [Tally; 2] = Default::default();
        let mut holders = Vec::new();
        for (j, (_, s)) in services.iter().enumerate() {
            let key = format!("held-{j}");
            let holder = token();
            let Acquired::Granted { fence, .. } =
                s.try_acquire(&key, holder, &who, ttl).await.unwrap()
            else {
                panic!("the holder's grant");
            };
            holders.push((holder, fence));
            let t = waiting_token(j);
            let before = settled(port).await;
            let start = StdInstant::now();
            let answer = s.try_acquire(&key, t, &who, ttl).await.unwrap();
            let took = start.elapsed();
            assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
            first[j].add(took, &before, &settled(port).await);
        }
        for _ in 0..n {
            for (j, (_, s)) in services.iter().enumerate() {
                let key = format!("held-{j}");
                let t = waiting_token(j);
                // The holder renews (untimed, uncounted): the key stays held.
                let (holder, fence) = holders[j];
                s.try_renew(&key, holder, fence).await.unwrap();
                let before = settled(port).await;
                let start = StdInstant::now();
                let answer = s.try_acquire(&key, t, &who, ttl).await.unwrap();
                let took = start.elapsed();
                assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
                waiting[j].add(took, &before, &settled(port).await);
            }
        }
        println!("etcd single member, {n} attempts each, TTL {TTL_MS} ms, one client per service");
        for (j, (name, _)) in services.iter().enumerate() {
            free[j].report(&format!("free key, {name}"));
        }
        for (j, (name, _)) in services.iter().enumerate() {
            first[j].report(&format!("first wait, {name}"));
        }
        for (j, (name, _)) in services.iter().enumerate() {
            waiting[j].report(&format!("waiting, {name}"));
        }
    });
}

/// The waiting contender of service `j`: the same token every attempt (its first
/// attempt is the "first wait" one).
fn waiting_token(j: usize) -> leasehold::OwnerToken {
    use std::sync::OnceLock;
    static TOKENS: OnceLock<[leasehold::OwnerToken; 2]> = OnceLock::new();
    TOKENS.get_or_init(|| [token(), token()])[j]
}
