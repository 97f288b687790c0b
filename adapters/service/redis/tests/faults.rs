//! Fault tests against real `redis-server` processes.
//!
//! Each shows what happens to a held lease when something breaks, and checks the two
//! safety properties: no write from the old holder is admitted by storage's
//! `FenceGate` after a newer fence, and the old holder's write gate closed no later
//! than Redis expired its grant (measured by a watcher that samples `GET`+`PTTL` on
//! its own connection, on the same monotonic clock).
//!
//! `harness = false`: this binary is also the child process of the SIGSTOP test (run
//! with `LEASEHOLD_REDIS_CHILD` set), so its `main` dispatches before running the
//! tests through libtest-mimic.

mod common;

use std::process::Stdio;

use common::*;
use leasehold::{Event, Fence, GateError, LossReason};
use leasehold_driver::TermEnd;
use leasehold_redis::{Acquired, RedisLockError, RedisLockService, Renewed};
use libtest_mimic::{Arguments, Trial};
use nix::sys::signal::Signal;
use redis::AsyncCommands;
use tokio::io::AsyncBufReadExt;

const CHILD_ENV: &str = "LEASEHOLD_REDIS_CHILD";

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_main(&spec);
        return;
    }
    let args = Arguments::from_args();
    let tests: Vec<(&str, fn())> = vec![
        (
            "restart_without_persistence_keeps_fences_increasing",
            restart_without_persistence,
        ),
        (
            "restart_with_aof_always_keeps_lease_and_counter",
            restart_with_aof,
        ),
        (
            "outage_longer_than_ttl_expires_before_redis_does",
            outage_longer_than_ttl,
        ),
        (
            "client_paused_past_ttl_with_sigstop",
            client_paused_with_sigstop,
        ),
        (
            "network_stall_blip_survives_long_stall_expires",
            network_stall,
        ),
        (
            "key_deleted_or_overwritten_from_outside",
            key_deleted_or_overwritten,
        ),
        (
            "lost_acquire_answer_is_regranted_with_the_same_fence",
            lost_acquire_answer,
        ),
        (
            "failover_to_a_replica_that_has_the_grant",
            failover_replicated,
        ),
        (
            "failover_to_a_replica_that_lost_the_grant_quarantines_then_hands_out_a_newer_fence",
            failover_lost_write,
        ),
        (
            "unconfirmed_renewals_do_not_count_with_min_replicas",
            unconfirmed_renewals_do_not_count,
        ),
        (
            "failover_with_min_replicas_keeps_the_lease_and_no_second_holder",
            failover_with_min_replicas,
        ),
        (
            "min_replicas_above_the_replicas_there_are_is_a_clear_error",
            min_replicas_above_the_replicas,
        ),
        (
            "garbage_in_redis_ends_the_acquire_with_a_final_refusal",
            garbage_in_redis,
        ),
        (
            "held_key_replaced_by_a_hash_ends_the_term_refused",
            held_key_replaced_by_hash,
        ),
        (
            "garbage_replies_are_protocol_errors_never_grants",
            garbage_replies,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            Trial::test(name, move || {
                test();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// Applies an in-process holder's write if its gate allows it.
fn try_write(holder: &Running, storage: &Storage) -> Option<Result<u64, leasehold::StaleFence>> {
    holder
        .gate
        .check(mono_now())
        .ok()
        .map(|fence| storage.write(fence))
}

/// The service these tests use (it shadows `common::service`): TTLs up to 1 s, the
/// longest they ask for, so the quarantine after a restart or a failover lasts 1 s.
async fn service(url: &str) -> RedisLockService {
    service_with_max_ttl(url, std_ms(1_000)).await
}

fn report(test: &str, line: String) {
    eprintln!("[{test}] {line}");
}

// ---------------------------------------------------------------------------------
// Server restart
// ---------------------------------------------------------------------------------

fn restart_without_persistence() {
    let mut server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let storage = Storage::default();
        let mut a = spawn_term(service.clone(), "r", config(1_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());

        let killed = mono_now();
        server.restart();
        // A learns at its next renewal: the key is gone → NotOwner.
        let (lost_at, reason) = a.lost(std_ms(3_000)).await;
        assert_eq!(reason, LossReason::NotOwner);

        // The counter was lost with the data, but a grant's fence is at least Redis's
        // clock in µs: the new holder's fence is above A's, storage admits it, and a
        // late write from A (it passed its check before the restart) is refused.
        let mut b = spawn_term(service.clone(), "r", config(1_000));
        let (fence_b, _) = b.acquired(std_ms(2_000)).await;
        assert!(fence_b > fence_a, "{fence_b} after {fence_a}");
        assert!(try_write(&b, &storage).unwrap().is_ok());
        assert_eq!(
            storage.write(fence_a).unwrap_err().newest,
            fence_b,
            "the old holder's late write is stale"
        );
        storage.assert_no_stale_admitted();
        report(
            "restart_without_persistence",
            format!(
                "old holder's gate closed {} ms after the kill (its next renewal); the grant \
                 vanished at the kill; {fence_a}, then {fence_b} from Redis's clock",
                lost_at.saturating_duration_since(killed).as_millis()
            ),
        );
        assert_eq!(b.release().await, TermEnd::Released);
        assert_eq!(a.end().await, TermEnd::Lost(LossReason::NotOwner));
    });
}

fn restart_with_aof() {
    let mut server = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    });
    run_local(async {
        let service = service(&server.url()).await;
        let storage = Storage::default();
        let mut a = spawn_term(service.clone(), "aof", config(1_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());
        let _ = a
            .next_event("a renewal", std_ms(2_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;

        // kill -9 and start again at once: the AOF (fsync always) has key and counter.
        let killed = mono_now();
        server.restart();
        let restarted = mono_now();
        // The lease rides it out: the next renewal after the restart succeeds.
        let (renewed_at, _) = a
            .next_event("a renewal after the restart", std_ms(3_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        assert!(renewed_at > restarted);
        assert_eq!(a.count(|e| matches!(e, Event::Lost { .. })), 0);
        assert_eq!(a.gate.check(mono_now()), Ok(fence_a));
        report(
            "restart_with_aof",
            format!(
                "down {} ms; renewed {} ms after the restart; {} renewal attempts failed meanwhile",
                restarted.saturating_duration_since(killed).as_millis(),
                renewed_at.saturating_duration_since(restarted).as_millis(),
                a.count(|e| matches!(e, Event::RenewFailed { .. }))
            ),
        );
        assert_eq!(a.release().await, TermEnd::Released);

        // The counter survived: the next holder's fence is newer.
        let mut b = spawn_term(service.clone(), "aof", config(1_000));
        let (fence_b, _) = b.acquired(std_ms(2_000)).await;
        assert!(fence_b > fence_a, "{fence_b} after {fence_a}");
        assert!(try_write(&b, &storage).unwrap().is_ok());
        assert!(storage.write(fence_a).is_err());
        storage.assert_no_stale_admitted();
        assert_eq!(b.release().await, TermEnd::Released);
    });
}

fn outage_longer_than_ttl() {
    let mut server = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    });
    run_local(async {
        let service = service(&server.url()).await;
        let storage = Storage::default();
        let watcher = KeyWatcher::start(&server.url(), "out").await;
        let mut a = spawn_term(service.clone(), "out", config(600));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());
        let _ = a
            .next_event("a renewal", std_ms(2_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        // Let the watcher see the key after that renewal.
        let token = a.token();
        watcher.wait_covers(&a).await;

        server.kill();
        let (lost_at, reason) = a.lost(std_ms(3_000)).await;
        assert_eq!(reason, LossReason::Expired);
        let closed = a.gate_closed_at().unwrap();
        let expiry = watcher.expiry_lower_bound(&token).unwrap();
        assert!(
            closed <= expiry,
            "gate closed at {closed}, Redis expiry no earlier than {expiry}"
        );
        report(
            "outage_longer_than_ttl",
            format!(
                "gate closed ≥ {} ms before Redis's expiry (loss reported {} ms before it)",
                expiry.saturating_duration_since(closed).as_millis(),
                expiry.saturating_duration_since(lost_at).as_millis()
            ),
        );
        assert!(matches!(a.gate.check(mono_now()), Err(GateError::Lost(_))));

        // Back after the TTL: the AOF's absolute expiry has passed, the key is free,
        // the counter is intact.
        wait_for("Redis's expiry to pass", std_ms(3_000), || async {
            mono_now() > expiry
        })
        .await;
        server.restart();
        let mut b = spawn_term(service.clone(), "out", config(600));
        let (fence_b, _) = b.acquired(std_ms(3_000)).await;
        assert!(fence_b > fence_a);
        assert!(try_write(&b, &storage).unwrap().is_ok());
        assert!(
            storage.write(fence_a).is_err(),
            "the old holder's late write"
        );
        storage.assert_no_stale_admitted();
        assert_eq!(b.release().await, TermEnd::Released);
    });
}

// ---------------------------------------------------------------------------------
// Client paused past the TTL (SIGSTOP), in a child process
// ---------------------------------------------------------------------------------

/// The child: holds a lease and writes in a loop, printing what it does.
///
/// `checked <fence> <t>` when its gate allowed a write, then (after 30 ms of "work")
/// `write <fence> <checked t> <t>`; `refused <t> <error>` when the gate said no;
/// `deadline <t>` for every grant or renewal; `lost <reason> <t>`.
fn child_main(spec: &str) {
    let mut parts = spec.split('|');
    let (url, key, ttl) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().parse::<u64>().unwrap(),
    );
    run_local(async move {
        let service = service(&url).await;
        let holder = spawn_term(service, &key, config(ttl));
        println!("token {}", holder.token());
        let mut seen = 0;
        loop {
            let log = holder.log.borrow().clone();
            for (at, event) in &log[seen..] {
                match event {
                    Event::Acquired { deadline, .. } | Event::Renewed { deadline, .. } => {
                        println!("deadline {}", deadline.as_micros())
                    }
                    Event::Lost { reason, .. } => println!("lost {reason:?} {}", at.as_micros()),
                    _ => {}
                }
            }
            seen = log.len();
            let checked = mono_now();
            match holder.gate.check(checked) {
                Ok(fence) => {
                    println!("checked {} {}", fence.0, checked.as_micros());
                    tokio::time::sleep(std_ms(30)).await;
                    println!(
                        "write {} {} {}",
                        fence.0,
                        checked.as_micros(),
                        mono_now().as_micros()
                    );
                }
                Err(e) => {
                    println!("refused {} {e:?}", checked.as_micros());
                    tokio::time::sleep(std_ms(10)).await;
                }
            }
        }
    });
}

fn client_paused_with_sigstop() {
    let server = RedisServer::start();
    run_local(async {
        let ttl = 500;
        let storage = Storage::default();
        let watcher = KeyWatcher::start(&server.url(), "paused").await;
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, format!("{}|paused|{ttl}", server.url()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("re-exec the test binary as the child");
        let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_line = async || {
            tokio::time::timeout(std_ms(5_000), lines.next_line())
                .await
                .expect("the child keeps talking")
                .unwrap()
                .expect("the child is alive")
        };

        // Phase 1: the child holds the lease and writes; stop it right after a check.
        let mut token = String::new();
        let (mut deadline, mut writes, mut fence_a) = (0u64, 0, 0u64);
        let stopped_at = loop {
            let line = next_line().await;
            let words: Vec<&str> = line.split(' ').collect();
            match words[0] {
                "token" => token = words[1].to_owned(),
                "deadline" => deadline = words[1].parse().unwrap(),
                "write" => {
                    fence_a = words[1].parse().unwrap();
                    assert!(storage.write(Fence(fence_a)).is_ok());
                    writes += 1;
                }
                "checked" if writes >= 3 => {
                    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
                    break mono_now();
                }
                _ => {}
            }
        };

        // Phase 2: Redis expires the frozen child's key; another client acquires.
        watcher
            .wait_until("the frozen child's key to expire", std_ms(3_000), |s| {
                s.holder.as_deref() != Some(token.as_str())
            })
            .await;
        let service = service(&server.url()).await;
        let mut b = spawn_term(service, "paused", config(ttl));
        let (fence_b, _) = b.acquired(std_ms(2_000)).await;
        assert!(fence_b > Fence(fence_a));
        assert!(try_write(&b, &storage).unwrap().is_ok());
        // Frozen well past the TTL.
        wait_for("the pause to exceed 2 T", std_ms(3_000), || async {
            mono_now().saturating_duration_since(stopped_at) > ms(2 * ttl)
        })
        .await;
        nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
        let resumed = mono_now();

        // Phase 3: the child wakes. Its write that passed the check before the pause
        // reaches storage late and is rejected; its gate refuses everything after.
        let (mut late_rejected, mut refused_after, mut lost) = (0, 0, None);
        while lost.is_none() || refused_after == 0 {
            let line = next_line().await;
            let words: Vec<&str> = line.split(' ').collect();
            match words[0] {
                "write" => {
                    let checked: u64 = words[2].parse().unwrap();
                    assert!(
                        checked < stopped_at.as_micros(),
                        "the child's gate passed a check after waking: {line}"
                    );
                    let result = storage.write(Fence(words[1].parse().unwrap()));
                    assert!(result.is_err(), "late write admitted: {line}");
                    late_rejected += 1;
                }
                "checked" => panic!("the child's gate passed a check after waking: {line}"),
                "refused" if words[1].parse::<u64>().unwrap() >= resumed.as_micros() => {
                    assert!(
                        line.contains("DeadlinePassed") || line.contains("Lost"),
                        "{line}"
                    );
                    refused_after += 1;
                }
                "lost" => lost = Some(words[1].to_owned()),
                "deadline" => deadline = words[1].parse().unwrap(),
                _ => {}
            }
        }
        child.kill().await.unwrap();
        let expiry = watcher.expiry_lower_bound(&token).unwrap();
        assert!(
            deadline <= expiry.as_micros(),
            "child's gate deadline {deadline} µs after Redis's expiry {expiry}"
        );
        assert!(
            late_rejected >= 1,
            "the write in flight at the stop arrives late"
        );
        storage.assert_no_stale_admitted();
        report(
            "client_paused_with_sigstop",
            format!(
                "child's gate deadline {} ms before Redis's expiry; paused {} ms; late write \
                 rejected by the fence gate; child reported lost({})",
                expiry.as_micros().saturating_sub(deadline) / 1_000,
                resumed.saturating_duration_since(stopped_at).as_millis(),
                lost.unwrap()
            ),
        );
        assert_eq!(b.release().await, TermEnd::Released);
    });
}

// ---------------------------------------------------------------------------------
// Network stall (a proxy that stops forwarding)
// ---------------------------------------------------------------------------------

fn network_stall() {
    let server = RedisServer::start();
    run_local(async {
        let proxy = Proxy::start(server.port()).await;
        let through_proxy = service(&proxy_url(&proxy)).await;
        let direct = service(&server.url()).await;
        let storage = Storage::default();
        let watcher = KeyWatcher::start(&server.url(), "stall").await;
        let mut a = spawn_term(through_proxy.clone(), "stall", config(600));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());
        let _ = a
            .next_event("a renewal", std_ms(2_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;

        // A blip: stall until a renewal times out, then flow again.
        proxy.set_mode(ProxyMode::Stall);
        let (failed_at, _) = a
            .next_event("a renewal lost in the stall", std_ms(2_000), |e| {
                matches!(e, Event::RenewFailed { .. })
            })
            .await;
        proxy.set_mode(ProxyMode::Forward);
        let (renewed_at, _) = a
            .next_event("the retry after the blip", std_ms(2_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        assert_eq!(
            a.count(|e| matches!(e, Event::Lost { .. })),
            0,
            "a blip is not loss"
        );
        assert_eq!(a.gate.check(mono_now()), Ok(fence_a));
        report(
            "network_stall",
            format!(
                "blip: renewal failed, retried and confirmed {} ms later; still held",
                renewed_at.saturating_duration_since(failed_at).as_millis()
            ),
        );

        // A long stall: the budget runs out before Redis's TTL does.
        let token = a.token();
        watcher.wait_covers(&a).await;
        proxy.set_mode(ProxyMode::Stall);
        let (lost_at, reason) = a.lost(std_ms(3_000)).await;
        assert_eq!(reason, LossReason::Expired);
        let closed = a.gate_closed_at().unwrap();
        let expiry = watcher.expiry_lower_bound(&token).unwrap();
        assert!(
            closed <= expiry,
            "gate closed at {closed}, expiry ≥ {expiry}"
        );
        report(
            "network_stall",
            format!(
                "long stall: Expired; gate closed ≥ {} ms before Redis's expiry (loss reported \
                 {} ms before)",
                expiry.saturating_duration_since(closed).as_millis(),
                expiry.saturating_duration_since(lost_at).as_millis()
            ),
        );

        // Someone else takes over once Redis expires the key.
        watcher
            .wait_until("Redis to expire the key", std_ms(2_000), |s| {
                s.holder.is_none()
            })
            .await;
        let b_token = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let Acquired::Granted { fence: fence_b, .. } = direct
            .try_acquire("stall", b_token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("free after expiry")
        };
        assert!(fence_b > fence_a);
        assert!(storage.write(fence_b).is_ok());
        assert!(
            storage.write(fence_a).is_err(),
            "the stalled holder's late write"
        );

        // The stall ends: A's queued renewal and best-effort release reach Redis late
        // and must not touch B's grant.
        proxy.set_mode(ProxyMode::Forward);
        assert_eq!(a.end().await, TermEnd::Lost(LossReason::Expired));
        // One more request on the same (FIFO) connection: everything queued before it
        // has been executed by the time it answers.
        let a_token = a.owner.token(leasehold::Term(1));
        assert_eq!(
            through_proxy
                .try_renew("stall", a_token, fence_a, ms(600))
                .await
                .unwrap(),
            Renewed::NotOwner
        );
        let mut raw = raw(&server.url()).await;
        let holder = stored_token(&mut raw, "stall").await;
        assert_eq!(holder.as_deref(), Some(b_token.encode().as_str()));
        assert!(matches!(
            direct
                .try_renew("stall", b_token, fence_b, ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { .. }
        ));
        storage.assert_no_stale_admitted();
    });
}

// ---------------------------------------------------------------------------------
// The key deleted or overwritten from outside
// ---------------------------------------------------------------------------------

fn key_deleted_or_overwritten() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let storage = Storage::default();
        let config = config(600);

        // DEL: someone else can acquire before the holder notices.
        let mut a = spawn_term(service.clone(), "del", config);
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());
        let _: () = raw.del("{del}").await.unwrap();
        let deleted = mono_now();
        let b_token = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let Acquired::Granted { fence: fence_b, .. } = service
            .try_acquire("del", b_token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("free after DEL")
        };
        assert!(fence_b > fence_a);
        assert!(storage.write(fence_b).is_ok());
        // A's gate may still be open (it has not renewed yet); storage stops it.
        if let Some(result) = try_write(&a, &storage) {
            assert!(result.is_err(), "A's write after B's must be stale");
        }
        let (lost_at, reason) = a.lost(std_ms(2_000)).await;
        assert_eq!(reason, LossReason::NotOwner);
        let window = lost_at.saturating_duration_since(deleted);
        assert!(
            window
                <= config
                    .renew_interval()
                    .saturating_add(config.request_timeout()),
            "NotOwner by the next renewal: {window}"
        );
        report(
            "key_deleted_or_overwritten",
            format!("DEL: NotOwner {} ms after the delete", window.as_millis()),
        );
        assert_eq!(a.end().await, TermEnd::Lost(LossReason::NotOwner));
        let holder = stored_token(&mut raw, "del").await;
        assert_eq!(
            holder.as_deref(),
            Some(b_token.encode().as_str()),
            "B's grant untouched"
        );

        // SET by someone else (no TTL): NotOwner, and nothing of ours deletes it.
        let mut c = spawn_term(service.clone(), "set", config);
        c.acquired(std_ms(2_000)).await;
        let _: () = raw.set("{set}", "intruder").await.unwrap();
        let overwritten = mono_now();
        let (lost_at, reason) = c.lost(std_ms(2_000)).await;
        assert_eq!(reason, LossReason::NotOwner);
        assert!(matches!(
            c.gate.check(mono_now()),
            Err(GateError::Lost(LossReason::NotOwner))
        ));
        assert_eq!(c.end().await, TermEnd::Lost(LossReason::NotOwner));
        let holder: String = raw.get("{set}").await.unwrap();
        assert_eq!(holder, "intruder");
        report(
            "key_deleted_or_overwritten",
            format!(
                "SET: NotOwner {} ms after the overwrite",
                lost_at.saturating_duration_since(overwritten).as_millis()
            ),
        );
        storage.assert_no_stale_admitted();
    });
}

// ---------------------------------------------------------------------------------
// Primary → replica failover
// ---------------------------------------------------------------------------------

async fn promote(replica: &RedisServer) {
    let reply = replica.inline("REPLICAOF NO ONE").unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
}

/// Waits until `server` has `key` = `value` (replication caught up); for a lock key,
/// `value` is the owner token, the first line of the value.
async fn wait_replicated(server: &RedisServer, key: &str, value: &str) {
    let conn = raw(&server.url()).await;
    wait_for("replication", std_ms(5_000), || {
        let mut conn = conn.clone();
        let (key, value) = (key.to_owned(), value.to_owned());
        async move {
            let got: Option<String> = conn.get(key).await.unwrap();
            got.as_deref().map(token_of) == Some(value.as_str())
        }
    })
    .await;
}

fn failover_replicated() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    run_local(async {
        let proxy = Proxy::start(primary.port()).await;
        let service = service(&proxy_url(&proxy)).await;
        let storage = Storage::default();
        let mut a = spawn_term(service.clone(), "fo", config(1_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(try_write(&a, &storage).unwrap().is_ok());
        wait_replicated(&replica, "{fo}", &a.token()).await;
        wait_replicated(&replica, "{fo}:fence", &fence_a.0.to_string()).await;

        // Fail over: the primary dies, the replica is promoted, clients are pointed at it.
        let started = mono_now();
        primary.kill();
        promote(&replica).await;
        proxy.retarget(replica.port());
        proxy.cut();
        let reloads_before = service.script_reloads();
        let (first_renewal, _) = a
            .next_event("a renewal on the new primary", std_ms(3_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        let _ = a
            .next_event("another renewal", std_ms(3_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        assert_eq!(a.count(|e| matches!(e, Event::Lost { .. })), 0);
        assert_eq!(a.gate.check(mono_now()), Ok(fence_a));
        assert!(
            service.script_reloads() > reloads_before,
            "the new primary had no scripts: NOSCRIPT → reload"
        );
        report(
            "failover_replicated",
            format!(
                "lease kept across the failover; renewed on the new primary {} ms after the \
                 kill; scripts reloaded {} times",
                first_renewal.saturating_duration_since(started).as_millis(),
                service.script_reloads() - reloads_before
            ),
        );
        assert_eq!(a.release().await, TermEnd::Released);
        // The counter came along: the next fence is newer.
        let mut b = spawn_term(service.clone(), "fo", config(1_000));
        let (fence_b, _) = b.acquired(std_ms(2_000)).await;
        assert!(fence_b > fence_a);
        assert!(try_write(&b, &storage).unwrap().is_ok());
        storage.assert_no_stale_admitted();
        assert_eq!(b.release().await, TermEnd::Released);
    });
}

fn failover_lost_write() {
    let mut primary = RedisServer::start();
    run_local(async {
        // The replica replicates through a proxy, so the test can hold the stream back
        // (SIGSTOP would not: the kernel still buffers what the primary sends).
        let link = Proxy::start(primary.port()).await;
        let link_port = link.port();
        let replica = tokio::task::spawn_blocking(move || {
            RedisServer::start_with(RedisOptions {
                replica_of: Some(link_port),
                ..RedisOptions::default()
            })
        })
        .await
        .unwrap();
        let proxy = Proxy::start(primary.port()).await;
        let service = service(&proxy_url(&proxy)).await;
        let storage = Storage::default();
        // History that did replicate: one grant, released.
        let first = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let Acquired::Granted {
            fence: replicated, ..
        } = service
            .try_acquire("lw", first, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        service.try_release("lw", first).await.unwrap();
        wait_replicated(&replica, "{lw}:fence", &replicated.0.to_string()).await;

        // The replication link stalls; A's grant and its counter reach only the primary.
        link.set_mode(ProxyMode::Stall);
        let mut a = spawn_term(service.clone(), "lw", config(1_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        assert!(fence_a > replicated);
        assert!(try_write(&a, &storage).unwrap().is_ok());
        primary.kill();
        link.cut();
        promote(&replica).await;
        proxy.retarget(replica.port());
        proxy.cut();

        // The new primary never saw A's grant nor its counter. It is another Redis
        // process than the one that started the data set's epoch, so it grants no
        // free key until a quarantine (the longest TTL, 1 s here) has passed: no second
        // holder while A still passes its check.
        let direct = service_at(&replica).await;
        let b_token = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let asked = mono_now();
        let Acquired::Quarantined { remaining } = direct
            .try_acquire("lw", b_token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("the promoted replica grants at once")
        };
        assert!(remaining <= ms(1_000), "{remaining:?}");
        // A finds out at its next renewal: the key is gone.
        let (lost_at, reason) = a.lost(std_ms(3_000)).await;
        assert_eq!(reason, LossReason::NotOwner);
        let mut granted = None;
        while granted.is_none() {
            match direct
                .try_acquire("lw", b_token, &leasehold::Identity::EMPTY, ms(1_000))
                .await
                .unwrap()
            {
                Acquired::Granted { fence, .. } => granted = Some((fence, mono_now())),
                Acquired::Quarantined { .. } => tokio::time::sleep(std_ms(20)).await,
                other => panic!("{other:?}"),
            }
        }
        let (fence_b, granted_at) = granted.unwrap();
        assert!(granted_at >= lost_at, "B granted before A lost its lease");
        // The fence is at least the new primary's clock in µs, so it is above A's.
        assert!(fence_b > fence_a, "{fence_b} after {fence_a}");
        assert!(storage.write(fence_b).is_ok());
        report(
            "failover_lost_write",
            format!(
                "the promoted replica never saw A's grant: quarantined {} ms, granted {fence_b} \
                 {} ms after A lost (A held {fence_a})",
                granted_at.saturating_duration_since(asked).as_millis(),
                granted_at.saturating_duration_since(lost_at).as_millis()
            ),
        );
        direct.try_release("lw", b_token).await.unwrap();
        assert!(storage.write(fence_a).is_err(), "A's late write");
        storage.assert_no_stale_admitted();
    });
}

/// Replication-synchronous grants (`min_replicas(1)`): a renewal the replica did not
/// confirm in time does not count (an unknown outcome, retried within the budget).
fn unconfirmed_renewals_do_not_count() {
    let primary = RedisServer::start();
    run_local(async {
        // The replica replicates through a proxy, so the test can stall the stream.
        let link = Proxy::start(primary.port()).await;
        let link_port = link.port();
        let replica = tokio::task::spawn_blocking(move || {
            RedisServer::start_with(RedisOptions {
                replica_of: Some(link_port),
                ..RedisOptions::default()
            })
        })
        .await
        .unwrap();
        // Each WAIT is bounded by the request timeout: the lease's own (TTL/10).
        let service = replicated_service(&primary.url(), 1).await;
        let mut a = spawn_term(service.clone(), "mr", config(3_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        link.set_mode(ProxyMode::Stall);
        let (_, failed) = a
            .next_event("an unconfirmed renewal", std_ms(3_000), |e| {
                matches!(e, Event::RenewFailed { .. })
            })
            .await;
        assert!(
            matches!(
                failed,
                Event::RenewFailed {
                    reason: leasehold::Indeterminate::Service,
                    ..
                }
            ),
            "{failed:?}"
        );
        link.set_mode(ProxyMode::Forward);
        let _ = a
            .next_event("a confirmed renewal", std_ms(3_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        assert_eq!(a.gate.check(mono_now()), Ok(fence_a));
        assert_eq!(a.release().await, TermEnd::Released);
        drop(replica);
    });
}

/// The service the replication tests use: TTLs up to 3 s, `min_replicas`, and a 300 ms
/// request timeout (the lease's own, TTL/10) that bounds each `WAIT`.
async fn replicated_service(url: &str, replicas: u32) -> RedisLockService {
    RedisLockService::builder(url)
        .request_timeout(std_ms(300))
        .max_ttl(std_ms(3_000))
        .min_replicas(replicas)
        .connect()
        .await
        .unwrap()
}

/// A failover with `min_replicas(1)`, as Sentinel makes one: the primary dies, one
/// replica is promoted, the other follows it. Every grant and renewal the holder
/// counted is on the promoted replica, so the holder renews there (once the other
/// replica confirms again) and a contender is told it holds: no second holder, and
/// the lease survives.
fn failover_with_min_replicas() {
    let mut primary = RedisServer::start();
    let replica_of = |port: u16| {
        move || {
            RedisServer::start_with(RedisOptions {
                replica_of: Some(port),
                ..RedisOptions::default()
            })
        }
    };
    run_local(async {
        let port = primary.port();
        let next = tokio::task::spawn_blocking(replica_of(port)).await.unwrap();
        let other = tokio::task::spawn_blocking(replica_of(port)).await.unwrap();
        let proxy = Proxy::start(primary.port()).await;
        let service = replicated_service(&proxy_url(&proxy), 1).await;
        let mut a = spawn_term(service.clone(), "fo", config(3_000));
        let (fence_a, _) = a.acquired(std_ms(2_000)).await;
        let _ = a
            .next_event("a renewal", std_ms(3_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;

        let killed = mono_now();
        primary.kill();
        promote(&next).await;
        let reply = other
            .inline(&format!("REPLICAOF 127.0.0.1 {}", next.port()))
            .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
        proxy.retarget(next.port());
        proxy.cut();
        let direct = service_at(&next).await;
        let b_token = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        match direct
            .try_acquire("fo", b_token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        {
            Acquired::HeldByAnother(holder) => assert_eq!(holder.fence, fence_a),
            other => panic!("the promoted replica must know A's grant: {other:?}"),
        }
        let (renewed, _) = a
            .next_event("a renewal on the promoted replica", std_ms(4_000), |e| {
                matches!(e, Event::Renewed { .. })
            })
            .await;
        assert_eq!(a.count(|e| matches!(e, Event::Lost { .. })), 0);
        assert_eq!(a.gate.check(mono_now()), Ok(fence_a));
        report(
            "failover_with_min_replicas",
            format!(
                "the lease survived; renewed and confirmed on the promoted replica {} ms after \
                 the kill",
                renewed.saturating_duration_since(killed).as_millis()
            ),
        );
        assert_eq!(a.release().await, TermEnd::Released);
    });
}

/// `min_replicas` above the replicas connected: `connect` fails at once naming both
/// numbers; a lazily connected service's grants are unknown outcomes (never granted)
/// with the same explanation, within the request timeout.
fn min_replicas_above_the_replicas() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    run_local(async {
        let err = RedisLockService::builder(primary.url())
            .min_replicas(2)
            .connect()
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("min_replicas(2)") && text.contains("has 1 replica(s) connected"),
            "{text}"
        );
        let lazy = RedisLockService::builder(primary.url())
            .request_timeout(std_ms(200))
            .max_ttl(std_ms(1_000))
            .min_replicas(2)
            .connect_lazily()
            .await
            .unwrap();
        let token = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let started = mono_now();
        let err = lazy
            .try_acquire("few", token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                RedisLockError::TooFewReplicas {
                    wanted: 2,
                    confirmed: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.indeterminate(), Some(leasehold::Indeterminate::Service));
        assert!(mono_now().saturating_duration_since(started) < ms(1_000));
        drop(replica);
    });
}

async fn service_at(server: &RedisServer) -> RedisLockService {
    service(&server.url()).await
}

// ---------------------------------------------------------------------------------
// A lost acquire answer
// ---------------------------------------------------------------------------------

fn lost_acquire_answer() {
    let server = RedisServer::start();
    run_local(async {
        let proxy = Proxy::start(server.port()).await;
        let service = service(&proxy_url(&proxy)).await;
        let mut raw = raw(&server.url()).await;
        // The acquire goes out into a stalled network and times out at the lease…
        proxy.set_mode(ProxyMode::Stall);
        let mut a = spawn_term(service.clone(), "lost", config(600));
        let _ = a
            .next_event("the acquire to time out", std_ms(2_000), |e| {
                matches!(
                    e,
                    Event::AcquireFailed {
                        reason: leasehold::AcquireFailure::Indeterminate(
                            leasehold::Indeterminate::Timeout
                        ),
                        ..
                    }
                )
            })
            .await;
        // …then reaches Redis anyway, which grants it; that answer is discarded. The
        // retry presents the same token and is granted again with the same fence.
        proxy.set_mode(ProxyMode::Forward);
        let (fence, _) = a.acquired(std_ms(2_000)).await;
        let counter: String = raw.get("{lost}:fence").await.unwrap();
        assert_eq!(counter, fence.0.to_string(), "no fence spent on the retry");
        let holder = stored_token(&mut raw, "lost").await;
        assert_eq!(holder, Some(a.token()));
        assert_eq!(a.release().await, TermEnd::Released);
    });
}

// ---------------------------------------------------------------------------------
// Garbage
// ---------------------------------------------------------------------------------

fn garbage_in_redis() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;

        // A garbage fence counter, a lock key that is a hash, a lock value another
        // program wrote: a lease on any of them ends its acquire at once with the
        // final refusal (no retries, whatever the wait bound), and its gate never opens.
        let _: () = raw.set("{text}:fence", "abc").await.unwrap();
        let _: () = raw.hset("{h}", "f", "v").await.unwrap();
        let _: () = raw.set("{foreign}", "someone else's").await.unwrap();
        for name in ["text", "h", "foreign"] {
            let mut holder = spawn_term(service.clone(), name, config(300));
            let (_, event) = holder
                .next_event("the refused acquire", std_ms(2_000), |e| {
                    matches!(e, Event::AcquireFailed { .. })
                })
                .await;
            assert!(
                matches!(
                    event,
                    Event::AcquireFailed {
                        reason: leasehold::AcquireFailure::Refused(leasehold::Refusal::WrongType),
                        retry_at: None,
                        ..
                    }
                ),
                "{name}: {event:?}"
            );
            assert_eq!(
                holder.end().await,
                TermEnd::NotAcquired(leasehold::AcquireFailure::Refused(
                    leasehold::Refusal::WrongType
                )),
                "{name}"
            );
            assert_eq!(holder.gate.check(mono_now()), Err(GateError::NotHeld));
            assert_eq!(holder.count(|e| matches!(e, Event::Acquired { .. })), 0);
            report("garbage_in_redis", format!("{name}: {event:?}"));
        }
        let counter: bool = raw.exists("{h}:fence").await.unwrap();
        assert!(!counter, "no fence spent on a refused acquire");
        let foreign: String = raw.get("{foreign}").await.unwrap();
        assert_eq!(foreign, "someone else's", "left alone");
        let err = service
            .try_acquire(
                "text",
                leasehold_redis::random_owner()
                    .expect("an OS random source")
                    .token(leasehold::Term(1)),
                &leasehold::Identity::EMPTY,
                ms(1_000),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RedisLockError::Refused { .. }), "{err:?}");
    });
}

fn held_key_replaced_by_hash() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let watcher = KeyWatcher::start(&server.url(), "hh").await;
        let mut a = spawn_term(service.clone(), "hh", config(400));
        a.acquired(std_ms(2_000)).await;
        let token = a.token();
        watcher.wait_covers(&a).await;
        // Replace it atomically, keeping a TTL so it looks "held" by a hash.
        let _: () = redis::pipe()
            .atomic()
            .del("{hh}")
            .hset("{hh}", "f", "v")
            .pexpire("{hh}", 60_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        let replaced = mono_now();
        let (lost_at, reason) = a.lost(std_ms(2_000)).await;
        // WRONGTYPE is a final refusal: the term ends at the next renewal, never
        // counting an error as a renewal.
        assert_eq!(reason, LossReason::Refused);
        assert_eq!(a.count(|e| matches!(e, Event::RenewFailed { .. })), 0);
        let closed = a.gate_closed_at().unwrap();
        let expiry = watcher.expiry_lower_bound(&token).unwrap();
        assert!(
            closed <= expiry,
            "gate closed at {closed}, grant ran to {expiry}"
        );
        report(
            "held_key_replaced_by_hash",
            format!(
                "Lost(Refused) {} ms after the replacement",
                lost_at.saturating_duration_since(replaced).as_millis()
            ),
        );
        assert_eq!(a.end().await, TermEnd::Lost(LossReason::Refused));
    });
}

fn garbage_replies() {
    let server = RedisServer::start();
    run_local(async {
        let proxy = Proxy::start(server.port()).await;
        let service = service(&proxy_url(&proxy)).await;
        let t = leasehold_redis::random_owner()
            .expect("an OS random source")
            .token(leasehold::Term(1));
        let is_unknown = |e: &RedisLockError| {
            matches!(
                e,
                RedisLockError::Protocol(_) | RedisLockError::Service { .. }
            )
        };
        let cases: &[&[u8]] = &[
            b":7\r\n",
            b"+OK\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$5\r\nhello\r\n",
            b"*0\r\n",
            b"*2\r\n:1\r\n$1\r\n0\r\n",
            b"*2\r\n:1\r\n$2\r\n-5\r\n",
            b"*2\r\n:1\r\n$3\r\nabc\r\n",
            b"*2\r\n:9\r\n$1\r\n5\r\n",
            b"*2\r\n$1\r\n1\r\n$1\r\n5\r\n",
            b"*4\r\n:0\r\n$1\r\n5\r\n$2\r\nid\r\n:-2\r\n",
            b"*4\r\n:0\r\n$1\r\n5\r\n:3\r\n:100\r\n",
            b"-ERR injected\r\n",
        ];
        for garbage in cases {
            proxy.set_mode(ProxyMode::RewriteReplies {
                reply: garbage.to_vec(),
                frame: resp_frame_len,
            });
            let shown = String::from_utf8_lossy(garbage).replace("\r\n", " ");
            let acquire_err = service
                .try_acquire("gr", t, &leasehold::Identity::EMPTY, ms(1_000))
                .await
                .unwrap_err();
            assert!(
                is_unknown(&acquire_err),
                "acquire answered {shown}: {acquire_err:?}"
            );
            let err = service
                .try_renew("gr", t, Fence(1), ms(1_000))
                .await
                .unwrap_err();
            assert!(is_unknown(&err), "renew answered {shown}: {err:?}");
            let err = service.try_release("gr", t).await.unwrap_err();
            assert!(is_unknown(&err), "release answered {shown}: {err:?}");
            let err = service.try_holder("gr").await.unwrap_err();
            assert!(is_unknown(&err), "holder answered {shown}: {err:?}");
            report("garbage_replies", format!("{shown:<40} → {acquire_err}"));
        }
        // A well-formed renew answer (`:1`): a forger that speaks the protocol is
        // believed, as from any server.
        proxy.set_mode(ProxyMode::RewriteReplies {
            reply: b":1\r\n".to_vec(),
            frame: resp_frame_len,
        });
        assert_eq!(
            service
                .try_renew("gr", t, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { ttl: ms(1_000) }
        );

        // A lease behind the garbage never opens its gate.
        proxy.set_mode(ProxyMode::RewriteReplies {
            reply: b"*2\r\n:1\r\n$1\r\n0\r\n".to_vec(),
            frame: resp_frame_len,
        });
        let mut holder = spawn_term(service.clone(), "gl", config(300));
        for _ in 0..3 {
            let _ = holder
                .next_event("a failed acquire", std_ms(2_000), |e| {
                    matches!(
                        e,
                        Event::AcquireFailed {
                            reason: leasehold::AcquireFailure::Indeterminate(
                                leasehold::Indeterminate::Protocol
                            ),
                            ..
                        }
                    )
                })
                .await;
            assert_eq!(holder.gate.check(mono_now()), Err(GateError::NotHeld));
        }
        assert_eq!(holder.count(|e| matches!(e, Event::Acquired { .. })), 0);
        // (The real Redis did grant it: only the reply was rewritten. The key is left to
        // its TTL, as after any indeterminate acquire.)
        proxy.set_mode(ProxyMode::Forward);
        assert_eq!(holder.release().await, TermEnd::Released);
    });
}
