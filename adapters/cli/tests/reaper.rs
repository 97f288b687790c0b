//! A command never outlives its lease: `leasehold run` SIGKILLed or SIGSTOPped, with
//! the command's tree spread over a grandchild in its group, a `setsid` descendant and
//! a double-forked daemon; with the command's cgroup and without one.
//!
//! Each test prints what it measured (`cargo test -- --nocapture` shows it).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::{EtcdCluster, RedisServer};
use nix::sys::signal::Signal;

/// A command whose tree leaves its process group and its session: a grandchild in the
/// group, a `setsid` child, and a daemon whose parent exits at once (double fork).
/// Each writes its pid to `$D/<name>.pid`.
const SPREAD: &str = r#"echo $$ > "$D/cmd.pid"
sh -c 'echo $$ > "$D/grandchild.pid"; exec sleep 1000' &
setsid sh -c 'echo $$ > "$D/setsid.pid"; exec sleep 1000' &
sh -c 'sh -c "echo \$\$ > \"\$D/daemon.pid\"; exec sleep 1000" &'
while :; do sleep 0.02; done"#;

fn pid_in(dir: &Path, name: &str) -> i32 {
    wait_file(&dir.join(format!("{name}.pid")), Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap()
}

/// The run's private directories (`leasehold-…` in `$XDG_RUNTIME_DIR`, which the
/// tests point at their scratch directory).
fn private_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("leasehold-"))
        .collect()
}

/// `kill -9` of leasehold: 100 ms later nothing of the command's tree is alive, the
/// `setsid` child and the daemon included; the private directory and the cgroup are
/// gone.
fn sigkill_takes_the_whole_tree(cgroup: &str) {
    let server = RedisServer::start();
    let dir = scratch(&format!("cli-reaper-sigkill-{cgroup}"));
    let d = dir.path();
    let mut cmd = leasehold(&server.url(), d);
    cmd.env("D", d).args([
        "run", "--ttl", "2s", "--cgroup", cgroup, "k", "--", "sh", "-c", SPREAD,
    ]);
    let sup = Proc::spawn(cmd, d, "sup");
    let names = ["cmd", "grandchild", "setsid", "daemon"];
    let pids: Vec<i32> = names.iter().map(|n| pid_in(d, n)).collect();
    let (_, reaper, session) = stat(pids[0]).unwrap();
    // The tree really spread: a new session, and an orphan re-parented to the reaper
    // (its subreaper), not to init.
    wait_until(
        "the setsid child has its own session",
        Duration::from_secs(5),
        || stat(pids[2]).is_some_and(|(_, _, s)| s != session),
    );
    wait_until("the daemon's parent exited", Duration::from_secs(5), || {
        stat(pids[3]).is_some_and(|(_, ppid, _)| ppid == reaper)
    });
    assert_eq!(
        private_dirs(d).len(),
        1,
        "one private directory while it runs"
    );
    let cgroup_dir = match (cgroup, writable_cgroup2()) {
        ("auto", Some(mount)) => {
            let path = cgroup_of(pids[0]).unwrap();
            assert!(path.contains("/leasehold-"), "the command's cgroup: {path}");
            for &pid in &pids {
                assert_eq!(cgroup_of(pid).as_deref(), Some(path.as_str()));
            }
            Some(mount.join(path.trim_start_matches('/')))
        }
        ("auto", None) => {
            eprintln!("no writable cgroup2 here: the /proc fallback was used");
            None
        }
        _ => {
            let path = cgroup_of(pids[0]).unwrap();
            assert!(!path.contains("/leasehold-"), "--cgroup off: {path}");
            None
        }
    };

    let killed = Instant::now();
    sup.signal(Signal::SIGKILL);
    let dead = wait_all_dead(&pids, killed + Duration::from_millis(100)).unwrap_or_else(|alive| {
        let seen: Vec<String> = alive
            .iter()
            .map(|&p| format!("{p}: {:?}", stat(p)))
            .collect();
        panic!("alive 100 ms after leasehold was SIGKILLed (pid: (state, ppid, session)): {seen:?}")
    });
    let took = dead - killed;
    wait_until(
        "the private directory is removed",
        Duration::from_secs(1),
        || private_dirs(d).is_empty(),
    );
    if let Some(cgroup_dir) = &cgroup_dir {
        wait_until("the cgroup is removed", Duration::from_secs(1), || {
            !cgroup_dir.exists()
        });
    }
    eprintln!(
        "SIGKILL of leasehold (--cgroup {cgroup}{}): command, grandchild, setsid child and \
         double-forked daemon all dead {:.1} ms later",
        if cgroup_dir.is_some() {
            ", cgroup used"
        } else {
            ""
        },
        took.as_secs_f64() * 1e3
    );
}

#[test]
fn a_sigkilled_leasehold_takes_the_whole_tree_with_it_through_the_cgroup() {
    sigkill_takes_the_whole_tree("auto");
}

#[test]
fn a_sigkilled_leasehold_takes_the_whole_tree_with_it_without_a_cgroup() {
    sigkill_takes_the_whole_tree("off");
}

/// The holder's command: it and a `setsid` descendant each append `EPOCH_NS` to
/// `$D/a.writes` every 10 ms.
const WRITER: &str = r#"echo $$ > "$D/a.pid"
setsid sh -c 'echo $$ > "$D/a_setsid.pid"; while :; do date +%s%N >> "$D/a.writes"; sleep 0.01; done' &
while :; do date +%s%N >> "$D/a.writes"; sleep 0.01; done"#;

/// leasehold SIGSTOPped for twice the TTL (2 s) while its command writes every 10 ms,
/// a contender waiting for the key: the holder's tree is stopped at its safe deadline
/// by the reaper alone, and every write of it comes before the contender's first.
/// With `--on-stall freeze` the tree is frozen, not killed, until leasehold resumes,
/// finds the lease lost, and kills it (exit 122).
fn pause(url: &str, name: &str, extra: &[&str]) {
    let dir = scratch(name);
    let d = dir.path();
    let freeze = extra.contains(&"freeze");
    let mut cmd = leasehold(url, d);
    cmd.env("D", d)
        .args(["run", "--ttl", "2s"])
        .args(extra)
        .args(["key", "--", "sh", "-c", WRITER]);
    let mut a = Proc::spawn(cmd, d, "a");
    let a_pids = [pid_in(d, "a"), pid_in(d, "a_setsid")];
    wait_file(&d.join("a.writes"), Duration::from_secs(5));
    let mut cmd = leasehold(url, d);
    cmd.env("D", d).args([
        "-vv", "run", "--ttl", "2s", "--wait", "30s", "key", "--", "sh", "-c",
        r#"date +%s%N > "$D/b.first"; for i in 1 2 3 4 5 6 7 8 9 10; do date +%s%N >> "$D/b.writes"; sleep 0.01; done"#,
    ]);
    let mut b = Proc::spawn(cmd, d, "b");
    wait_contains(&b.stderr, "acquire attempt failed", Duration::from_secs(10));

    let stopped = Instant::now();
    let stopped_ns = epoch_ns();
    a.signal(Signal::SIGSTOP);
    let b_first: u128 = wait_file(&d.join("b.first"), Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        b.err()
    );
    // The pause lasts twice the TTL: its length is the scenario, not a wait for an event.
    if let Some(rest) = Duration::from_secs(4).checked_sub(stopped.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes_before_resume = std::fs::read_to_string(d.join("a.writes")).unwrap();
    if freeze {
        for &pid in &a_pids {
            assert!(
                alive(pid),
                "--on-stall freeze: the tree is frozen, not killed"
            );
        }
    } else {
        for &pid in &a_pids {
            assert!(!alive(pid), "the reaper killed the tree at the deadline");
        }
    }
    a.signal(Signal::SIGCONT);
    assert_eq!(
        a.wait(Duration::from_secs(5)).code(),
        Some(122),
        "{}",
        a.err()
    );
    assert!(
        a.err()
            .contains("leasehold was stalled past the safe deadline"),
        "{}",
        a.err()
    );
    wait_all_dead(&a_pids, Instant::now() + Duration::from_secs(1)).unwrap();

    let a_writes: Vec<u128> = std::fs::read_to_string(d.join("a.writes"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let last_a = *a_writes.iter().max().unwrap();
    let b_writes: Vec<u128> = std::fs::read_to_string(d.join("b.writes"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(
        last_a < b_first,
        "the holder's tree wrote at {last_a}, after the contender's first write at {b_first}"
    );
    if freeze {
        assert_eq!(
            std::fs::read_to_string(d.join("a.writes")).unwrap(),
            writes_before_resume,
            "the frozen tree wrote nothing, and was killed without running again"
        );
    }
    let ms = |ns: u128| ns as f64 / 1e6;
    eprintln!(
        "{name}: leasehold stopped at +0; its tree wrote until +{:.1} ms ({} writes after the \
         stop), then was {}; the contender's first write at +{:.1} ms: gap {:.1} ms; its last \
         at +{:.1} ms; leasehold resumed at +4000 ms and exited 122",
        ms(last_a.saturating_sub(stopped_ns)),
        a_writes.iter().filter(|&&w| w > stopped_ns).count(),
        if freeze { "frozen" } else { "killed" },
        ms(b_first - stopped_ns),
        ms(b_first - last_a),
        ms(b_writes.iter().max().unwrap() - stopped_ns),
    );
}

#[test]
fn a_sigstopped_leasehold_s_command_is_killed_before_the_next_holder_runs_on_redis() {
    let server = RedisServer::start();
    pause(&server.url(), "cli-pause-kill-redis", &[]);
}

#[test]
fn a_sigstopped_leasehold_s_command_is_killed_before_the_next_holder_runs_on_etcd() {
    let etcd = EtcdCluster::single();
    pause(&etcd_url(&etcd), "cli-pause-kill-etcd", &[]);
}

/// Frozen by SIGSTOP to every process (no cgroup).
#[test]
fn a_sigstopped_leasehold_s_command_is_frozen_before_the_next_holder_runs_on_redis() {
    let server = RedisServer::start();
    pause(
        &server.url(),
        "cli-pause-freeze-redis",
        &["--on-stall", "freeze", "--cgroup", "off"],
    );
}

/// Frozen through the cgroup (where the machine has one).
#[test]
fn a_sigstopped_leasehold_s_command_is_frozen_before_the_next_holder_runs_on_etcd() {
    let etcd = EtcdCluster::single();
    pause(
        &etcd_url(&etcd),
        "cli-pause-freeze-etcd",
        &["--on-stall", "freeze"],
    );
}

/// A cgroup that cannot be made (its parent does not exist): `-v` says why once, the
/// command runs outside any leasehold cgroup, and its tree is still killed with it.
#[test]
fn without_a_cgroup_the_tree_is_found_through_proc() {
    let server = RedisServer::start();
    let dir = scratch("cli-no-cgroup");
    let d = dir.path();
    let mut cmd = leasehold(&server.url(), d);
    cmd.env("D", d)
        .env("LEASEHOLD_CGROUP_ROOT", "/nonexistent/cgroup")
        .args(["-vv", "run", "--ttl", "2s", "k", "--", "sh", "-c", SPREAD]);
    let sup = Proc::spawn(cmd, d, "sup");
    let pids: Vec<i32> = ["cmd", "grandchild", "setsid", "daemon"]
        .iter()
        .map(|n| pid_in(d, n))
        .collect();
    let err = sup.err();
    assert_eq!(
        err.matches("no cgroup for the command (cannot make /nonexistent/cgroup/leasehold-")
            .count(),
        1,
        "{err}"
    );
    let path = cgroup_of(pids[0]).unwrap();
    assert!(!path.contains("/leasehold-"), "{path}");
    let killed = Instant::now();
    sup.signal(Signal::SIGKILL);
    let dead = wait_all_dead(&pids, killed + Duration::from_millis(100))
        .unwrap_or_else(|alive| panic!("alive 100 ms after the SIGKILL: {alive:?}"));
    eprintln!(
        "no cgroup (LEASEHOLD_CGROUP_ROOT unusable): the tree was dead {:.1} ms after the \
         SIGKILL",
        (dead - killed).as_secs_f64() * 1e3
    );
}

/// A command that ignores SIGINT: the first Ctrl-C is passed on, the second too, and
/// SIGKILL follows `--kill-after` later (the lease is released, not held for as long
/// as the command ignores signals).
#[test]
fn a_second_signal_is_passed_on_and_sigkill_follows_after_the_grace() {
    let server = RedisServer::start();
    let dir = scratch("cli-second-signal");
    let d = dir.path();
    let mut cmd = leasehold(&server.url(), d);
    cmd.env("D", d).args([
        "run",
        "--ttl",
        "4s",
        "--kill-after",
        "500ms",
        "k",
        "--",
        "sh",
        "-c",
        r#"trap 'date +%s%N >> "$D/int"' INT; echo $$ > "$D/cmd.pid"
while :; do sleep 0.02 & wait $!; done"#,
    ]);
    let mut sup = Proc::spawn(cmd, d, "sup");
    let pid = pid_in(d, "cmd");
    let int = d.join("int");
    sup.signal(Signal::SIGINT);
    wait_until(
        "the first SIGINT reaches the command",
        Duration::from_secs(5),
        || std::fs::read_to_string(&int).is_ok_and(|t| t.lines().count() == 1),
    );
    assert!(alive(pid), "the command ignores SIGINT");
    let second = Instant::now();
    sup.signal(Signal::SIGINT);
    wait_until(
        "the second SIGINT reaches the command",
        Duration::from_secs(5),
        || std::fs::read_to_string(&int).is_ok_and(|t| t.lines().count() == 2),
    );
    let dead = wait_all_dead(&[pid], second + Duration::from_secs(3))
        .unwrap_or_else(|_| panic!("the command outlived the second SIGINT: {}", sup.err()));
    let after = dead - second;
    assert_eq!(
        sup.wait(Duration::from_secs(5)).code(),
        Some(128 + 9),
        "{}",
        sup.err()
    );
    assert!(
        sup.err()
            .contains("SIGINT again: passed on to the command; SIGKILL in 500 ms"),
        "{}",
        sup.err()
    );
    assert!(
        after >= Duration::from_millis(450) && after < Duration::from_millis(1_500),
        "SIGKILL {after:?} after the second SIGINT, --kill-after 500ms"
    );
    let out = output({
        let mut c = leasehold(&server.url(), d);
        c.args(["status", "k"]);
        c
    });
    assert_eq!(
        out.status.code(),
        Some(1),
        "released: {}",
        text(&out.stdout)
    );
    eprintln!(
        "second SIGINT: the command (ignoring SIGINT) was killed {:.0} ms later \
         (--kill-after 500ms), leasehold exited 137 and the key was released",
        after.as_secs_f64() * 1e3
    );
}
