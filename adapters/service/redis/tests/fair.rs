//! First-in, first-out waiting (`RedisLockService::with_fair`) on a real
//! `redis-server`: contenders are granted in the order they queued, a contender that
//! stops asking is skipped within its TTL (measured), a service that is not fair
//! behaves as before and never loads the fair script, and garbage in the queue keys
//! is refused before anything is written.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use leasehold::{Fence, Holder, Identity, OwnerToken, Refusal, Term};
use leasehold_redis::{lua, Acquired, QueueKeys, RedisLockError, RedisLockService, Released};
use leasehold_tokio::{acquire_with, AcquireOptions};
use redis::AsyncCommands;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn fair(url: &str) -> RedisLockService {
    service(url).await.with_fair(true)
}

fn token() -> OwnerToken {
    leasehold_redis::random_owner()
        .expect("an OS random source")
        .token(Term(1))
}

fn id(text: &str) -> Identity {
    Identity::new(text).unwrap()
}

/// A holder, then eight `leasehold_tokio` contenders started one after another, each
/// seen in the queue before the next starts: once the holder releases, each is
/// granted in turn, in exactly that order.
#[test]
fn contenders_are_granted_in_the_order_they_queued() {
    const KEY: &str = "fair-order";
    const N: usize = 8;
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = Arc::new(fair(&server.url()).await);
        let holder = acquire_with(
            service.clone(),
            KEY,
            config(1_000),
            AcquireOptions::new().identity(id("holder")),
        )
        .await
        .unwrap();
        let granted = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..N {
            let (contender, granted) = (service.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                let lease = acquire_with(
                    contender,
                    KEY,
                    config(1_000),
                    AcquireOptions::new().identity(id(&format!("c{i}"))),
                )
                .await
                .unwrap();
                granted.lock().unwrap().push(i);
                lease.release().await;
            }));
            let me = id(&format!("c{i}"));
            wait_for(&format!("c{i} queued"), std_ms(5_000), || {
                let service = service.clone();
                async move { service.waiting(KEY).await.unwrap().last() == Some(&me) }
            })
            .await;
        }
        let queued: Vec<String> = service
            .waiting(KEY)
            .await
            .unwrap()
            .iter()
            .map(|i| i.as_str().to_owned())
            .collect();
        let expected: Vec<String> = (0..N).map(|i| format!("c{i}")).collect();
        assert_eq!(queued, expected);
        holder.release().await;
        for task in tasks {
            tokio::time::timeout(std_ms(20_000), task)
                .await
                .expect("every contender is granted")
                .unwrap();
        }
        assert_eq!(*granted.lock().unwrap(), (0..N).collect::<Vec<_>>());
        assert_eq!(service.waiting(KEY).await.unwrap(), Vec::<Identity>::new());
    });
}

/// B queues with a 400 ms TTL and stops asking; C queues behind it. Once the key is
/// free, C is told it is B's turn until B's place expires, and granted within B's TTL
/// of B's last attempt (never before: Redis counts the TTL from that attempt).
#[test]
fn a_contender_that_stops_asking_is_skipped_within_its_ttl() {
    const KEY: &str = "fair-skip";
    const B_TTL_MS: u64 = 400;
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = fair(&server.url()).await;
        let (h, b, c) = (token(), token(), token());
        let granted = service
            .try_acquire(KEY, h, &id("h"), ms(10_000))
            .await
            .unwrap();
        assert!(matches!(granted, Acquired::Granted { .. }), "{granted:?}");
        let b_sent = mono_now();
        let answer = service
            .try_acquire(KEY, b, &id("b"), ms(B_TTL_MS))
            .await
            .unwrap();
        assert!(
            matches!(answer, Acquired::HeldByAnother(Holder { fence, .. }) if fence.0 > 0),
            "{answer:?}"
        );
        let answer = service
            .try_acquire(KEY, c, &id("c"), ms(10_000))
            .await
            .unwrap();
        assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
        assert_eq!(service.waiting(KEY).await.unwrap(), [id("b"), id("c")]);
        assert_eq!(
            service.try_release(KEY, h).await.unwrap(),
            Released::Released
        );

        let mut turns_of_b = 0;
        let give_up = tokio::time::Instant::now() + std_ms(5_000);
        let granted_at = loop {
            assert!(tokio::time::Instant::now() < give_up, "C never granted");
            match service
                .try_acquire(KEY, c, &id("c"), ms(10_000))
                .await
                .unwrap()
            {
                Acquired::Granted { .. } => break mono_now(),
                Acquired::HeldByAnother(turn) => {
                    assert_eq!(turn.fence, Fence(0), "nobody holds the key: {turn:?}");
                    assert_eq!(turn.identity, id("b"));
                    assert!(turn.remaining <= ms(B_TTL_MS), "{turn:?}");
                    turns_of_b += 1;
                }
                other => panic!("{other:?}"),
            }
            tokio::time::sleep(std_ms(5)).await;
        };
        let waited = granted_at.saturating_duration_since(b_sent);
        println!(
            "C granted {} ms after B's last attempt was sent (B's TTL {B_TTL_MS} ms; \
             {turns_of_b} answers named B's turn)",
            waited.as_millis()
        );
        assert!(turns_of_b > 0, "C was never told it was B's turn");
        // B's place counts from when Redis ran B's attempt (after `b_sent`), in whole
        // ms of Redis's clock: C's grant cannot come before `b_sent` + TTL - 1 ms.
        assert!(
            waited >= ms(B_TTL_MS - 1),
            "C granted after {waited:?}, inside B's place"
        );
        // ... and comes at C's next attempt after B's place ends (a 5 ms poll).
        assert!(
            waited <= ms(B_TTL_MS + 150),
            "C granted only after {waited:?}"
        );
        assert_eq!(service.waiting(KEY).await.unwrap(), Vec::<Identity>::new());
    });
}

/// The quarantine after a loss of state comes first, as without the queue: once the
/// epoch marker is gone (a flushed or restarted Redis), a contender behind another's
/// turn is told the quarantine, not the turn, and starts the new epoch as a plain
/// acquire would; nobody is granted until it ends, then the first in line is.
#[test]
fn a_quarantine_comes_before_another_contenders_turn() {
    const KEY: &str = "fair-quarantine";
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = service_with_max_ttl(&server.url(), std_ms(500))
            .await
            .with_fair(true);
        let mut raw = raw(&server.url()).await;
        let (h, b, c) = (token(), token(), token());
        service
            .try_acquire(KEY, h, &id("h"), ms(500))
            .await
            .unwrap();
        for (t, name) in [(b, "b"), (c, "c")] {
            service
                .try_acquire(KEY, t, &id(name), ms(500))
                .await
                .unwrap();
        }
        service.try_release(KEY, h).await.unwrap();
        let _: () = raw.del(lua::EPOCH_KEY).await.unwrap();
        let answer = service
            .try_acquire(KEY, c, &id("c"), ms(500))
            .await
            .unwrap();
        assert!(
            matches!(answer, Acquired::Quarantined { remaining } if remaining == ms(500)),
            "{answer:?}"
        );
        let marker: Option<String> = raw.get(lua::EPOCH_KEY).await.unwrap();
        assert!(marker.is_some(), "c's attempt started the new epoch");
        let answer = service
            .try_acquire(KEY, c, &id("c"), ms(500))
            .await
            .unwrap();
        assert!(
            matches!(answer, Acquired::Quarantined { remaining } if remaining <= ms(500)),
            "{answer:?}"
        );
        // Both keep asking (as leases do); b, first in line, is granted once the
        // quarantine ends, and c is told whose turn it was until then.
        wait_for("b granted after the quarantine", std_ms(3_000), || {
            let service = service.clone();
            async move {
                let answer_c = service
                    .try_acquire(KEY, c, &id("c"), ms(500))
                    .await
                    .unwrap();
                assert!(
                    !matches!(answer_c, Acquired::Granted { .. }),
                    "c granted ahead of b: {answer_c:?}"
                );
                matches!(
                    service
                        .try_acquire(KEY, b, &id("b"), ms(500))
                        .await
                        .unwrap(),
                    Acquired::Granted { .. }
                )
            }
        })
        .await;
        assert_eq!(service.waiting(KEY).await.unwrap(), [id("c")]);
    });
}

/// A contender keeps its first place however often it asks, and one that asks again
/// after its place expired goes to the back.
#[test]
fn a_place_is_kept_across_attempts_and_lost_after_its_ttl() {
    const KEY: &str = "fair-place";
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = fair(&server.url()).await;
        let (h, a, b) = (token(), token(), token());
        service
            .try_acquire(KEY, h, &id("h"), ms(10_000))
            .await
            .unwrap();
        let a_sent = mono_now();
        service
            .try_acquire(KEY, a, &id("a"), ms(300))
            .await
            .unwrap();
        service
            .try_acquire(KEY, b, &id("b"), ms(10_000))
            .await
            .unwrap();
        service
            .try_acquire(KEY, b, &id("b"), ms(10_000))
            .await
            .unwrap();
        assert_eq!(service.waiting(KEY).await.unwrap(), [id("a"), id("b")]);
        // `waiting` leaves out a place whose deadline passed; asking again then puts
        // `a` at the back.
        wait_for("a's place to expire", std_ms(2_000), || {
            let service = service.clone();
            async move { service.waiting(KEY).await.unwrap() == [id("b")] }
        })
        .await;
        assert!(mono_now().saturating_duration_since(a_sent) >= ms(299));
        service
            .try_acquire(KEY, a, &id("a"), ms(10_000))
            .await
            .unwrap();
        assert_eq!(service.waiting(KEY).await.unwrap(), [id("b"), id("a")]);
    });
}

/// Without `with_fair`, a latecomer takes a freed key ahead of an earlier waiter, no
/// queue key is written and the fair script is never loaded: the service sends the
/// same script as before. With it, the same sequence tells the latecomer whose turn
/// it is, and the earlier waiter is granted.
#[test]
fn fair_off_keeps_todays_behaviour_and_fair_on_keeps_the_order() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut raw = raw(&server.url()).await;
        let plain = service(&server.url()).await;
        assert!(!plain.fair());
        for (service, key) in [
            (plain.clone(), "fair-off"),
            (plain.with_fair(true), "fair-on"),
        ] {
            let (h, b, c) = (token(), token(), token());
            service
                .try_acquire(key, h, &id("h"), ms(10_000))
                .await
                .unwrap();
            let answer = service
                .try_acquire(key, b, &id("b"), ms(10_000))
                .await
                .unwrap();
            assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
            if !service.fair() {
                // Still before any fair call on this server: nothing queued, the fair
                // script unknown to Redis.
                let queue = QueueKeys::new(key).unwrap();
                let exists: u32 = raw
                    .exists(&[&queue.queue, &queue.waiters, &queue.arrivals])
                    .await
                    .unwrap();
                assert_eq!(exists, 0);
                let loaded: Vec<bool> = redis::cmd("SCRIPT")
                    .arg("EXISTS")
                    .arg(lua::FAIR_ACQUIRE_SHA)
                    .arg(lua::WAITING_SHA)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                assert_eq!(loaded, [false, false]);
                assert_eq!(service.waiting(key).await.unwrap(), Vec::<Identity>::new());
            }
            service.try_release(key, h).await.unwrap();
            let latecomer = service
                .try_acquire(key, c, &id("c"), ms(10_000))
                .await
                .unwrap();
            if service.fair() {
                let Acquired::HeldByAnother(turn) = latecomer else {
                    panic!("{latecomer:?}")
                };
                assert_eq!((turn.fence, turn.identity), (Fence(0), id("b")));
                let answer = service
                    .try_acquire(key, b, &id("b"), ms(10_000))
                    .await
                    .unwrap();
                assert!(matches!(answer, Acquired::Granted { .. }), "{answer:?}");
                assert_eq!(service.waiting(key).await.unwrap(), [id("c")]);
            } else {
                assert!(
                    matches!(latecomer, Acquired::Granted { .. }),
                    "{latecomer:?}"
                );
            }
        }
    });
}

/// Queue keys that hold what the fair acquire never writes make acquire and
/// `waiting` fail with a final refusal, before anything is written: no grant, no
/// fence, the queue untouched.
#[test]
fn garbage_in_the_queue_keys_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = fair(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let far = "99999999999999";
        let stranger = token().encode().as_str().to_owned();
        // (name, commands that plant the garbage, the code Redis answers, whether
        // `waiting` reads it too)
        type Plant = Vec<Vec<String>>;
        let cases: Vec<(&str, Plant, &str, bool)> = vec![
            ("queue-string", vec![sv(&["SET", "{k}:queue", "x"])], "WRONGTYPE", true),
            (
                "waiters-list",
                vec![
                    sv(&["ZADD", "{k}:queue", "1", &stranger]),
                    sv(&["RPUSH", "{k}:waiters", "x"]),
                    sv(&["SET", "{k}:arrivals", "1"]),
                ],
                "WRONGTYPE",
                true,
            ),
            (
                "place-garbage",
                vec![
                    sv(&["ZADD", "{k}:queue", "1", &stranger]),
                    sv(&["HSET", "{k}:waiters", &stranger, "soon"]),
                    sv(&["SET", "{k}:arrivals", "1"]),
                ],
                "LEASEHOLD",
                true,
            ),
            (
                "place-missing",
                vec![
                    sv(&["ZADD", "{k}:queue", "1", &stranger]),
                    sv(&["SET", "{k}:arrivals", "1"]),
                ],
                "LEASEHOLD",
                true,
            ),
            (
                "place-of-another",
                vec![
                    sv(&["ZADD", "{k}:queue", "1", &stranger]),
                    sv(&["HSET", "{k}:waiters", "someone-else", &format!("{far}\nx")]),
                    sv(&["SET", "{k}:arrivals", "1"]),
                ],
                "LEASEHOLD",
                true,
            ),
            (
                "arrivals-garbage",
                vec![
                    sv(&["ZADD", "{k}:queue", "1", &stranger]),
                    sv(&["HSET", "{k}:waiters", &stranger, &format!("{far}\nx")]),
                    sv(&["SET", "{k}:arrivals", "one"]),
                ],
                "LEASEHOLD",
                false,
            ),
            (
                "arrivals-behind",
                vec![
                    sv(&["ZADD", "{k}:queue", "5", &stranger]),
                    sv(&["HSET", "{k}:waiters", &stranger, &format!("{far}\nx")]),
                    sv(&["SET", "{k}:arrivals", "2"]),
                ],
                "LEASEHOLD",
                false,
            ),
            (
                "score-not-a-number",
                vec![
                    sv(&["ZADD", "{k}:queue", "1.5", &stranger]),
                    sv(&["HSET", "{k}:waiters", &stranger, &format!("{far}\nx")]),
                    sv(&["SET", "{k}:arrivals", "2"]),
                ],
                "LEASEHOLD",
                false,
            ),
        ];
        for (name, plant, code, waiting_reads_it) in cases {
            let key = format!("fair-garbage-{name}");
            for command in &plant {
                let mut cmd = redis::cmd(&command[0]);
                for arg in &command[1..] {
                    cmd.arg(arg.replace("{k}", &format!("{{{key}}}")));
                }
                let _: redis::Value = cmd.query_async(&mut raw).await.unwrap();
            }
            let before = dump(&mut raw, &key).await;
            let err = service
                .try_acquire(&key, token(), &id("me"), ms(1_000))
                .await
                .unwrap_err();
            assert!(
                matches!(&err, RedisLockError::Refused { refusal: Refusal::WrongType, code: c, .. } if c == code),
                "{name}: {err:?}"
            );
            assert_eq!(dump(&mut raw, &key).await, before, "{name}: nothing written");
            let lock: Option<String> = raw.get(format!("{{{key}}}")).await.unwrap();
            assert_eq!(lock, None, "{name}: no grant");
            let fence: Option<String> = raw.get(format!("{{{key}}}:fence")).await.unwrap();
            assert_eq!(fence, None, "{name}: no fence");
            if waiting_reads_it {
                let err = service.waiting(&key).await.unwrap_err();
                assert!(
                    matches!(&err, RedisLockError::Refused { code: c, .. } if c == code),
                    "{name}: {err:?}"
                );
            }
        }
    });
}

/// Redis's own time per `EVALSHA` since the last `CONFIG RESETSTAT` (script time on
/// the server, without the round trip): `INFO commandstats`' line for it.
async fn evalsha_stats(raw: &mut redis::aio::MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find(|line| line.starts_with("cmdstat_evalsha:"))
        .unwrap_or("no EVALSHA")
        .trim()
        .to_owned()
}

fn sv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Every key of lock `key` and its queue, as `DUMP` renders them.
async fn dump(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<Option<Vec<u8>>> {
    let queue = QueueKeys::new(key).unwrap();
    let mut out = Vec::new();
    for k in [
        format!("{{{key}}}"),
        format!("{{{key}}}:fence"),
        queue.queue,
        queue.waiters,
        queue.arrivals,
    ] {
        out.push(redis::cmd("DUMP").arg(k).query_async(raw).await.unwrap());
    }
    out
}

/// What a fair acquire costs next to a plain one, on one connection, one at a time:
/// the grant of a free key and the answer to a contender while it is held (the
/// contender's place refreshed), as round trips and as Redis's own time per script
/// (`INFO commandstats`: acquires and releases together). `cargo test -p
/// leasehold-redis --test fair -- --nocapture acquire_latency` prints them.
#[test]
fn acquire_latency_fair_and_plain() {
    const ROUNDS: usize = 2_000;
    let server = RedisServer::start();
    runtime().block_on(async {
        let plain = service(&server.url()).await;
        let fair = plain.clone().with_fair(true);
        let mut raw = raw(&server.url()).await;
        for (label, service) in [("plain", &plain), ("fair", &fair), ("plain", &plain), ("fair", &fair)] {
            let key = format!("latency-{label}");
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut raw)
                .await
                .unwrap();
            let (mut grant, mut busy) = (Vec::new(), Vec::new());
            let other = token();
            for _ in 0..ROUNDS {
                let me = token();
                let started = std::time::Instant::now();
                let granted = service
                    .try_acquire(&key, me, &id("me"), ms(10_000))
                    .await
                    .unwrap();
                grant.push(started.elapsed());
                assert!(matches!(granted, Acquired::Granted { .. }), "{granted:?}");
                let started = std::time::Instant::now();
                let answer = service
                    .try_acquire(&key, other, &id("other"), ms(10_000))
                    .await
                    .unwrap();
                busy.push(started.elapsed());
                assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
                service.try_release(&key, me).await.unwrap();
                if service.fair() {
                    // The waiter leaves (as a real one would once granted), so the
                    // next round's grant meets an empty queue as the plain one does.
                    let _: () = redis::cmd("DEL")
                        .arg(QueueKeys::new(&key).unwrap().queue)
                        .arg(QueueKeys::new(&key).unwrap().waiters)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                }
            }
            grant.sort();
            busy.sort();
            let median = |v: &[std::time::Duration]| v[v.len() / 2];
            println!(
                "{label}: grant of a free key median {:?} p99 {:?}; answer while held median {:?} p99 {:?}",
                median(&grant),
                grant[grant.len() * 99 / 100],
                median(&busy),
                busy[busy.len() * 99 / 100],
            );
            println!("{label}: {}", evalsha_stats(&mut raw).await);
        }
        // A deep queue: 100 places; the one in the middle asks again and again (its
        // place refreshed: ZSCORE, HGET, HSET, no walk while the key is held).
        let key = "latency-deep";
        fair.try_acquire(key, token(), &id("h"), ms(60_000))
            .await
            .unwrap();
        let waiters: Vec<OwnerToken> = (0..100).map(|_| token()).collect();
        for w in &waiters {
            fair.try_acquire(key, *w, &id("w"), ms(60_000))
                .await
                .unwrap();
        }
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut raw)
            .await
            .unwrap();
        let mut busy = Vec::new();
        for _ in 0..ROUNDS {
            let started = std::time::Instant::now();
            fair.try_acquire(key, waiters[50], &id("w"), ms(60_000))
                .await
                .unwrap();
            busy.push(started.elapsed());
        }
        busy.sort();
        println!(
            "fair, 100 waiting: answer while held median {:?} p99 {:?}",
            busy[busy.len() / 2],
            busy[busy.len() * 99 / 100]
        );
        println!("fair, 100 waiting: {}", evalsha_stats(&mut raw).await);
        assert_eq!(fair.waiting(key).await.unwrap().len(), 100);
    });
}
