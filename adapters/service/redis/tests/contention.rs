//! 16 contenders on one key with short TTLs, for `LEASEHOLD_REDIS_CONTENTION_SECS`
//! seconds (default 30). Every contender is its own client (own connection) and,
//! while its gate is open, writes to one fenced storage every ~2 ms.
//!
//! Checked: every write is admitted by the storage's `FenceGate` (no stale writer
//! ever reached it); fences strictly increase from one holder to the next; and the
//! gates' open intervals never overlap: each holder's gate closed (release, loss or
//! safe deadline) before the next holder's grant was reported. One term in eight
//! "crashes" (its driver is dropped without a release), so handoffs through Redis's
//! expiry are exercised too.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use leasehold::{Event, Fence, Instant};

const CONTENDERS: usize = 16;
const TTL_MS: u64 = 300;

#[derive(Debug, Clone, Copy)]
struct TermRecord {
    contender: usize,
    fence: Fence,
    opened: Instant,
    closed: Instant,
    writes: u32,
    lost: bool,
    crashed: bool,
}

/// xorshift: hold times without a dependency.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn sixteen_contenders_never_overlap_and_fences_increase() {
    let secs: u64 = std::env::var("LEASEHOLD_REDIS_CONTENTION_SECS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("LEASEHOLD_REDIS_CONTENTION_SECS is a number of seconds")
        })
        .unwrap_or(30);
    let server = RedisServer::start();
    let records = run_local(async {
        let storage = Storage::default();
        let records = Rc::new(RefCell::new(Vec::<TermRecord>::new()));
        let end = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for contender in 0..CONTENDERS {
            let service = service(&server.url()).await;
            let storage = storage.clone();
            let records = records.clone();
            tasks.push(tokio::task::spawn_local(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15 ^ ((contender as u64 + 1) * 0x2545_f491);
                while tokio::time::Instant::now() < end {
                    let mut holder = spawn_term(service.clone(), "contended", config(TTL_MS));
                    let Some((fence, _)) = holder.acquired_before(end).await else {
                        holder.release().await;
                        break;
                    };
                    // Hold 10–400 ms (some holds outlive several renewals), writing.
                    let hold = std_ms(10 + next(&mut seed) % 390);
                    let until = tokio::time::Instant::now() + hold;
                    let mut writes = 0;
                    while tokio::time::Instant::now() < until {
                        match holder.gate.check(mono_now()) {
                            Ok(f) => {
                                assert_eq!(f, fence);
                                if let Err(stale) = storage.write(f) {
                                    panic!("contender {contender}: {stale}");
                                }
                                writes += 1;
                            }
                            Err(_) => break,
                        }
                        tokio::time::sleep(std_ms(2)).await;
                    }
                    let opened = holder.acquired_at().unwrap();
                    let lost = holder.count(|e| matches!(e, Event::Lost { .. })) > 0;
                    // One term in eight crashes instead of releasing: the next holder
                    // must wait for Redis to expire the key, and this gate closes at
                    // its safe deadline.
                    let crashed = !lost && next(&mut seed).is_multiple_of(8);
                    let closed = if crashed {
                        let deadline = holder.last_deadline().unwrap();
                        holder.crash();
                        deadline
                    } else {
                        holder.release_and_wait().await;
                        holder.gate_closed_at().expect("the term ended")
                    };
                    records.borrow_mut().push(TermRecord {
                        contender,
                        fence,
                        opened,
                        closed,
                        writes,
                        lost,
                        crashed,
                    });
                    // Give the others a chance before trying again.
                    tokio::time::sleep(std_ms(next(&mut seed) % 40)).await;
                }
            }));
        }
        for task in tasks {
            task.await.expect("a contender panicked");
        }
        storage.assert_no_stale_admitted();
        let rejected = storage.log().iter().filter(|(_, ok)| !ok).count();
        assert_eq!(rejected, 0, "no stale write ever reached storage");
        let records = records.borrow().clone();
        records
    });

    let mut terms = records.clone();
    terms.sort_by_key(|t| t.opened);
    assert!(
        terms.len() >= 2 * CONTENDERS.min(secs as usize),
        "too few handoffs: {}",
        terms.len()
    );
    for pair in terms.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            b.fence > a.fence,
            "fences must strictly increase across holders: {a:?} then {b:?}"
        );
        assert!(
            a.closed <= b.opened,
            "two gates open at once: {a:?} closed after {b:?} opened"
        );
    }
    let writes: u32 = terms.iter().map(|t| t.writes).sum();
    let lost = terms.iter().filter(|t| t.lost).count();
    let crashed = terms.iter().filter(|t| t.crashed).count();
    let gaps: Vec<u64> = terms
        .windows(2)
        .map(|p| {
            p[1].opened
                .saturating_duration_since(p[0].closed)
                .as_millis()
        })
        .collect();
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    let winners = {
        let mut w: Vec<usize> = terms.iter().map(|t| t.contender).collect();
        w.sort_unstable();
        w.dedup();
        w.len()
    };
    eprintln!(
        "[contention] {secs} s, {CONTENDERS} contenders, TTL {TTL_MS} ms: {} terms by {winners} \
         contenders, {writes} fenced writes, 0 rejected, {lost} terms lost, {crashed} crashed; \
         handoff gap median {} ms, max {} ms",
        terms.len(),
        sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        sorted.last().copied().unwrap_or(0),
    );
}
