//! `leasehold run` when things go wrong, against a real redis-server: the service
//! stalls, leasehold is SIGKILLed, leasehold is SIGSTOPped, Ctrl-C. (The command's
//! whole tree under a SIGKILL or a pause: `reaper.rs`.)
//!
//! Each test prints what it measured (`cargo test -- --nocapture` shows it).

mod common;

use std::time::Duration;

use common::*;
use leasehold_test_support::{Proxy, RedisServer};
use nix::sys::signal::Signal;

/// The service's expiry of lock `key`, as Unix-epoch ms (`PEXPIRETIME`), if it is set.
fn expiry_ms(server: &RedisServer, key: &str) -> Option<u128> {
    let reply = server.inline(&format!("PEXPIRETIME {{{key}}}"))?;
    let value: i64 = reply.trim().strip_prefix(':')?.parse().ok()?;
    u128::try_from(value).ok().filter(|&v| v > 0)
}

/// The service stops answering (a proxy holds every byte) for longer than the TTL:
/// leasehold sends SIGTERM before its safe deadline, SIGKILLs the command (which
/// ignores SIGTERM) at the deadline, and the command is gone before Redis expires the
/// key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_service_stops_the_command_before_the_key_expires() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let dir = scratch("cli-stall");
    let d = dir.path().display().to_string();
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let mut cmd = leasehold(&url, dir.path());
    cmd.args([
        "run",
        "--ttl",
        "4s",
        "--kill-after",
        "800ms",
        "stall",
        "--",
        "sh",
        "-c",
    ])
    .arg(format!(
        r#"trap 'date +%s%3N >> {d}/term' TERM
echo $$ > {d}/pid
while :; do cat "$LEASEHOLD_DEADLINE_FILE" >> {d}/deadlines; sleep 0.02 & wait $!; done"#
    ));
    let mut sup = Proc::spawn(cmd, dir.path(), "sup");
    let pid: i32 = wait_file(&dir.path().join("pid"), Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    // Let one renewal through, so the deadline has moved at least once.
    let first = wait_file(&dir.path().join("deadlines"), Duration::from_secs(5));
    let first: u128 = first.lines().next().unwrap().parse().unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(dir.path().join("deadlines")).unwrap();
        if text
            .lines()
            .filter_map(|l| l.parse::<u128>().ok())
            .any(|v| v > first)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "no renewal moved the deadline"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    proxy.stall();
    let stalled_at = epoch_ms();
    let mut expiry = None;
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        expiry = expiry_ms(&server, "stall").or(expiry);
        assert!(
            std::time::Instant::now() < give_up,
            "the command outlived the stall"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let dead_at = epoch_ms();
    let expiry = expiry.expect("PEXPIRETIME read while the key was held");
    let status = sup.wait(Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(122),
        "lease lost, command stopped: {}",
        sup.err()
    );
    let err = sup.err();
    assert!(err.contains("was not renewed in time"), "{err}");
    // The message says when SIGKILL comes, and it comes then.
    let said: u128 = err
        .split("SIGKILL in ")
        .nth(1)
        .and_then(|rest| rest.split(" ms").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no SIGKILL delay in: {err}"));

    let term_at: u128 = std::fs::read_to_string(dir.path().join("term"))
        .expect("the command got SIGTERM")
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let deadline = std::fs::read_to_string(dir.path().join("deadlines"))
        .unwrap()
        .lines()
        .filter_map(|l| l.parse::<u128>().ok())
        .max()
        .unwrap();
    assert!(
        term_at < deadline,
        "SIGTERM at {term_at}, safe deadline {deadline}"
    );
    let killed_after = dead_at - term_at;
    assert!(
        killed_after.abs_diff(said) <= 30,
        "said SIGKILL in {said} ms, dead {killed_after} ms after SIGTERM"
    );
    assert!(
        dead_at <= deadline,
        "command seen dead at {dead_at}, safe deadline {deadline}"
    );
    assert!(
        dead_at <= expiry,
        "command seen dead at {dead_at}, Redis expiry {expiry}"
    );
    assert!(
        deadline <= expiry,
        "safe deadline {deadline} after the expiry {expiry}"
    );
    eprintln!(
        "stall (TTL 4 s, --kill-after 800ms): stalled at +0, SIGTERM at +{} ms ({} ms before \
         the safe deadline, \"SIGKILL in {said} ms\"), command seen dead at +{} ms, safe \
         deadline +{} ms, Redis expiry +{} ms: margins dead→safe deadline {} ms, dead→expiry \
         {} ms",
        term_at - stalled_at,
        deadline - term_at,
        dead_at - stalled_at,
        deadline - stalled_at,
        expiry - stalled_at,
        deadline - dead_at,
        expiry - dead_at,
    );
    proxy.resume();
}

/// A child that appends its pid and spins; a contender that records when its command
/// started (Unix-epoch ns) and logs its failed attempts.
fn holder_and_contender(
    url: &str,
    dir: &std::path::Path,
    ttl: &str,
    holder_script: &str,
) -> (Proc, i32, Proc) {
    let d = dir.display();
    let mut cmd = leasehold(url, dir);
    cmd.args(["run", "--ttl", ttl, "key", "--", "sh", "-c"])
        .arg(format!("echo $$ > {d}/a_pid; {holder_script}"));
    let holder = Proc::spawn(cmd, dir, "a");
    let pid: i32 = wait_file(&dir.join("a_pid"), Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    let mut cmd = leasehold(url, dir);
    cmd.args([
        "-vv", "run", "--ttl", ttl, "--wait", "30s", "key", "--", "sh", "-c",
    ])
    .arg(format!("date +%s%N > {d}/b_start"));
    let contender = Proc::spawn(cmd, dir, "b");
    wait_contains(
        &contender.stderr,
        "acquire attempt failed",
        Duration::from_secs(10),
    );
    (holder, pid, contender)
}

/// leasehold SIGKILLed: the parent-death signal kills its command at once, and the
/// waiting contender gets the key when the TTL runs out (plus one retry).
#[test]
fn a_sigkilled_leasehold_takes_its_command_with_it() {
    let server = RedisServer::start();
    let dir = scratch("cli-sigkill");
    let (a, child, mut b) = holder_and_contender(
        &server.url(),
        dir.path(),
        "2s",
        "while :; do sleep 0.02; done",
    );
    let killed_at = epoch_ns();
    a.signal(Signal::SIGKILL);
    let dead_ms = wait_dead(child, Duration::from_secs(1));
    let b_start: u128 = wait_file(&dir.path().join("b_start"), Duration::from_secs(5))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        b.err()
    );
    let dead_after = dead_ms.saturating_sub(killed_at / 1_000_000);
    let granted_after = (b_start - killed_at) / 1_000_000;
    // TTL 2 s, retry interval 100 ms jittered to at most 150 ms, and the spawn of the
    // contender's command.
    assert!(
        granted_after <= 2_000 + 150 + 150,
        "granted {granted_after} ms after the kill"
    );
    assert!(
        granted_after >= 1_000,
        "nobody released: the TTL had to run out"
    );
    eprintln!(
        "SIGKILL: the command was dead {dead_after} ms after leasehold; the contender's command \
         started {granted_after} ms after the kill (TTL 2000 ms + one retry <= 150 ms)"
    );
    drop(a);
}

/// leasehold SIGSTOPped, and its command exits 0 while it is stopped, before the
/// deadline (the reaper reports the exit into the pipe); leasehold stays stopped past
/// the TTL. At SIGCONT the command's exit and the lapse wake it together. The code
/// says "ran and exited while the lease was held" only if that is true, so leasehold
/// exits 122, in whichever order it sees the two.
#[test]
fn a_command_that_exits_while_leasehold_is_stopped_past_the_ttl_is_reported_lost() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = scratch("cli-sigstop-exit");
    let d = dir.path().display().to_string();
    let mut cmd = leasehold(&url, dir.path());
    cmd.args(["run", "--ttl", "1s", "key", "--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {d}/a_pid; while [ ! -f {d}/go ]; do sleep 0.02; done; exit 0"
        ));
    let mut a = Proc::spawn(cmd, dir.path(), "a");
    let child: i32 = wait_file(&dir.path().join("a_pid"), Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    a.signal(Signal::SIGSTOP);
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_dead(child, Duration::from_secs(5));
    // Past the TTL: Redis has expired the key (the lease's deadline came before).
    let started = std::time::Instant::now();
    while server.inline("EXISTS {key}").as_deref() != Some(":0\r\n") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the key never expired"
        );
        std::thread::sleep(Duration::from_millis(20)); // polling Redis, not a race
    }
    a.signal(Signal::SIGCONT);
    let status = a.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(122), "{}", a.err());
    assert!(
        a.err().contains("lapsed while the command ran"),
        "{}",
        a.err()
    );
}

/// How a wait is given up.
#[derive(Clone, Copy, PartialEq)]
enum GiveUp {
    Signal,
    WaitBound,
}

/// A wait given up while an attempt's grant is in doubt (a proxy turns every reply
/// into garbage, so the grants Redis makes never reach leasehold), by a signal or by
/// `--wait` running out: leasehold exits (143 or 125), and the release it owes that
/// grant reaches Redis before it exits, instead of the key staying held by nobody for
/// a TTL. (The wait bound was safe before: the acquire ends after the core's own
/// release. The signal was not: the runtime ended before the driver sent it.)
async fn give_up_with_a_grant_in_doubt(how: GiveUp) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let dir = scratch("cli-give-up-release");
    let d = dir.path().display().to_string();
    let mut cmd = leasehold(&server.url(), dir.path());
    cmd.args(["run", "key", "--", "sh", "-c"]).arg(format!(
        "echo $$ > {d}/a_pid; while [ ! -f {d}/go ]; do sleep 0.02; done"
    ));
    let mut a = Proc::spawn(cmd, dir.path(), "a");
    wait_file(&dir.path().join("a_pid"), Duration::from_secs(10));
    let mut cmd = leasehold(&format!("redis://127.0.0.1:{}", proxy.port()), dir.path());
    cmd.args(["-vv", "run", "--ttl", "30s"]);
    if how == GiveUp::WaitBound {
        cmd.args(["--wait", "5s"]);
    }
    cmd.args(["key", "--", "true"]);
    let mut b = Proc::spawn(cmd, dir.path(), "b");
    wait_contains(&b.stderr, "acquire attempt failed", Duration::from_secs(10));
    proxy.set_mode(leasehold_test_support::ProxyMode::RewriteReplies {
        reply: b"+OK\r\n".to_vec(),
        frame: leasehold_test_support::redis::resp_frame_len,
    });
    // The holder lets go; B's next attempts are granted, their answers garbage.
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(
        a.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        a.err()
    );
    let code = match how {
        GiveUp::Signal => {
            // B waits without a bound: signal it once Redis shows its grant.
            let started = std::time::Instant::now();
            while server
                .inline("PTTL {key}")
                .is_none_or(|pttl| pttl.starts_with(":-"))
            {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "B was never granted"
                );
                std::thread::sleep(Duration::from_millis(20)); // polling Redis, not a race
            }
            b.signal(Signal::SIGTERM);
            128 + 15
        }
        GiveUp::WaitBound => 125,
    };
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(code),
        "{}",
        b.err()
    );
    if how == GiveUp::WaitBound {
        // An attempt reached Redis while the key was free (Redis granted it) and its
        // answer came back as garbage.
        assert!(b.err().contains("unintelligible answer"), "{}", b.err());
    }
    assert_eq!(
        server.inline("EXISTS {key}").as_deref(),
        Some(":0\r\n"),
        "B's grant was left for its 30 s TTL: {}",
        b.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_by_a_signal_with_a_grant_in_doubt_releases_it_before_exiting() {
    give_up_with_a_grant_in_doubt(GiveUp::Signal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_bound_run_out_with_a_grant_in_doubt_releases_it_before_exiting() {
    give_up_with_a_grant_in_doubt(GiveUp::WaitBound).await;
}

/// Ctrl-C: leasehold passes SIGINT to the command, the command exits, the lease is
/// released, and the waiting contender is granted within a retry interval, not a TTL.
#[test]
fn ctrl_c_reaches_the_command_and_the_release_lets_the_next_one_in_at_once() {
    let server = RedisServer::start();
    let dir = scratch("cli-sigint");
    let d = dir.path().display().to_string();
    let (mut a, child, mut b) = holder_and_contender(
        &server.url(),
        dir.path(),
        "4s",
        &format!(r#"trap 'date +%s%N > {d}/a_int; exit 130' INT; while :; do sleep 0.02; done"#),
    );
    a.signal(Signal::SIGINT);
    let int_at: u128 = wait_file(&dir.path().join("a_int"), Duration::from_secs(5))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        a.wait(Duration::from_secs(5)).code(),
        Some(130),
        "{}",
        a.err()
    );
    wait_dead(child, Duration::from_secs(1));
    let b_start: u128 = wait_file(&dir.path().join("b_start"), Duration::from_secs(5))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        b.err()
    );
    let granted_after = (b_start - int_at) / 1_000_000;
    // Retry interval 200 ms (TTL 4 s / 20), jittered to at most 300 ms.
    assert!(
        granted_after < 1_000,
        "granted {granted_after} ms after the command's exit"
    );
    eprintln!(
        "SIGINT: the command trapped it and exited 130; the contender's command started \
         {granted_after} ms later (TTL 4000 ms, retry interval 200 ms jittered 100-300 ms)"
    );
}

/// SIGTERM while waiting: leasehold stops waiting at once (128 + 15) and never runs
/// the command; the holder is not disturbed.
#[test]
fn a_signal_while_waiting_gives_up_without_running_the_command() {
    let server = RedisServer::start();
    let dir = scratch("cli-wait-signal");
    let (a, _child, mut b) = holder_and_contender(
        &server.url(),
        dir.path(),
        "2s",
        "while :; do sleep 0.02; done",
    );
    let started = std::time::Instant::now();
    b.signal(Signal::SIGTERM);
    assert_eq!(
        b.wait(Duration::from_secs(2)).code(),
        Some(128 + 15),
        "{}",
        b.err()
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(b.err().contains("SIGTERM while waiting"), "{}", b.err());
    assert!(
        !dir.path().join("b_start").exists(),
        "the command never ran"
    );
    let mut status = leasehold(&server.url(), dir.path());
    status.args(["status", "key"]);
    let out = output(status);
    assert!(
        text(&out.stdout).contains("is held by"),
        "{}",
        text(&out.stdout)
    );
    eprintln!("SIGTERM while waiting: exited 143 after {took:?}");
    drop(a);
}
