//! `leasehold run` against a real redis-server (and etcd): contention, `--no-wait`,
//! `--wait`, bad input, `status` and `raise-fence`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::{EtcdCluster, RedisOptions, RedisServer};

/// Each child writes `start`, three records 50 ms apart, and `end`, with its fence.
const WRITER: &str = r#". "$STORE_LIB"
store_write "$LEASEHOLD_FENCE" start || exit 9
for i in 1 2 3; do store_write "$LEASEHOLD_FENCE" "w$i" || exit 9; sleep 0.05; done
store_write "$LEASEHOLD_FENCE" end || exit 9"#;

/// Four `leasehold run` processes contend for one key; every record is admitted in
/// fence order and the children's run intervals never overlap.
fn contention(url: &str, name: &str) {
    let dir = scratch(name);
    let mut procs: Vec<Proc> = (0..4)
        .map(|i| {
            let mut cmd = leasehold(url, dir.path());
            cmd.args([
                "run", "--wait", "60s", "--ttl", "2s", "shared", "--", "sh", "-c", WRITER,
            ]);
            Proc::spawn(cmd, dir.path(), &format!("c{i}"))
        })
        .collect();
    for p in &mut procs {
        let status = p.wait(Duration::from_secs(60));
        assert_eq!(status.code(), Some(0), "stderr: {}", p.err());
    }
    let records = records(dir.path());
    assert_eq!(records.len(), 4 * 5, "{records:#?}");
    assert!(records.iter().all(|r| r.admitted), "{records:#?}");
    assert!(
        records.windows(2).all(|w| w[0].fence <= w[1].fence),
        "records in fence order: {records:#?}"
    );
    // One interval per fence: [start, end]; consecutive intervals must not overlap.
    let mut intervals: Vec<(u64, u128, u128)> = Vec::new();
    for chunk in records.chunks(5) {
        let fence = chunk[0].fence;
        assert!(chunk.iter().all(|r| r.fence == fence), "{chunk:#?}");
        assert_eq!(
            (chunk[0].what.as_str(), chunk[4].what.as_str()),
            ("start", "end")
        );
        intervals.push((fence, chunk[0].at_ns, chunk[4].at_ns));
    }
    let fences: std::collections::BTreeSet<u64> = intervals.iter().map(|i| i.0).collect();
    assert_eq!(fences.len(), 4, "four grants, four fences: {intervals:?}");
    let gaps: Vec<u128> = intervals
        .windows(2)
        .map(|w| {
            assert!(w[1].1 > w[0].2, "children overlapped: {w:?}");
            (w[1].1 - w[0].2) / 1_000
        })
        .collect();
    eprintln!(
        "{name}: gaps between one child's last write and the next child's first (µs): {gaps:?}"
    );
}

#[test]
fn four_contenders_on_redis_write_in_fence_order_and_never_overlap() {
    let server = RedisServer::start();
    contention(&server.url(), "cli-contend-redis");
}

#[test]
fn four_contenders_on_etcd_write_in_fence_order_and_never_overlap() {
    let etcd = EtcdCluster::single();
    let url = format!(
        "etcd+http://{}",
        etcd.endpoints().join(",").replace("http://", "")
    );
    contention(&url, "cli-contend-etcd");
}

/// A holder whose child runs until `dir/stop` exists; returns once the child runs.
fn hold(url: &str, dir: &std::path::Path, key: &str, identity: &str) -> Proc {
    let mut cmd = leasehold(url, dir);
    cmd.args([
        "run",
        "--ttl",
        "2s",
        "--identity",
        identity,
        key,
        "--",
        "sh",
        "-c",
    ])
    .arg(format!(
        "touch {d}/ready; while [ ! -e {d}/stop ]; do sleep 0.02; done",
        d = dir.display()
    ));
    let holder = Proc::spawn(cmd, dir, "holder");
    wait_exists(&dir.join("ready"), Duration::from_secs(10));
    holder
}

fn no_wait_and_wait_on_a_held_key(url: &str, name: &str) {
    let dir = scratch(name);
    let mut holder = hold(url, dir.path(), "busy", "holder-A");

    let started = Instant::now();
    let mut cmd = leasehold(url, dir.path());
    cmd.args(["run", "--no-wait", "busy", "--", "true"]);
    let out = output(cmd);
    let took = started.elapsed();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is busy") && err.contains("holder-A"), "{err}");
    assert!(!err.contains("ERROR"), "no log noise without -v: {err}");
    assert!(took < Duration::from_secs(1), "--no-wait took {took:?}");
    eprintln!(
        "{name}: --no-wait answered busy in {took:?}: {}",
        err.trim()
    );

    let mut cmd = leasehold(url, dir.path());
    cmd.args(["run", "-n", "-E", "75", "busy", "--", "true"]);
    assert_eq!(output(cmd).status.code(), Some(75), "-E sets the busy code");

    let started = Instant::now();
    let mut cmd = leasehold(url, dir.path());
    cmd.args(["run", "--ttl", "2s", "--wait", "1s", "busy", "--", "true"]);
    let out = output(cmd);
    let took = started.elapsed();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("timed out after 1s"), "{err}");
    // The last attempt is the last one that starts before the bound: with --ttl 2s
    // attempts are about 100 ms apart (jittered).
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(3),
        "--wait 1s took {took:?}"
    );
    eprintln!("{name}: --wait 1s gave up after {took:?}");

    // On a terminal (script(1) gives it one) the wait shows who holds the key.
    let on_a_tty = |quiet: &str| {
        let mut cmd = std::process::Command::new("script");
        cmd.arg("-qec")
            .arg(format!(
                "{} {quiet} --service '{url}' run --ttl 2s --wait 1500ms busy -- true",
                env!("CARGO_BIN_EXE_leasehold")
            ))
            .arg("/dev/null")
            .env("XDG_RUNTIME_DIR", dir.path());
        let out = output(cmd);
        (out.status.code(), text(&out.stdout))
    };
    let (code, shown) = on_a_tty("");
    assert_eq!(code, Some(124), "{shown}");
    assert!(
        shown.contains("waiting for \"busy\": held by holder-A (fence ")
            && shown.contains(" s left"),
        "{shown}"
    );
    let (code, shown) = on_a_tty("--quiet");
    assert_eq!(code, Some(124), "{shown}");
    assert!(
        !shown.contains(" s left"),
        "no progress line with --quiet: {shown}"
    );

    std::fs::write(dir.path().join("stop"), "").unwrap();
    assert_eq!(
        holder.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        holder.err()
    );
}

#[test]
fn no_wait_is_busy_at_once_and_wait_times_out_on_redis() {
    let server = RedisServer::start();
    no_wait_and_wait_on_a_held_key(&server.url(), "cli-busy-redis");
}

#[test]
fn no_wait_is_busy_at_once_and_wait_times_out_on_etcd() {
    let etcd = EtcdCluster::single();
    let url = format!(
        "etcd+http://{}",
        etcd.endpoints().join(",").replace("http://", "")
    );
    no_wait_and_wait_on_a_held_key(&url, "cli-busy-etcd");
}

/// Runs leasehold with `args` and returns (exit code, stderr).
fn run(url: &str, dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = leasehold(url, dir);
    cmd.args(args);
    let out = output(cmd);
    (out.status.code(), text(&out.stderr))
}

#[test]
fn bad_input_gets_clear_messages_and_distinct_codes() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = scratch("cli-bad-input");
    let d = dir.path();

    let (code, err) = run(&url, d, &["run", "k", "--", "no-such-command-xyz"]);
    assert_eq!(code, Some(127), "{err}");
    assert!(
        err.contains("no-such-command-xyz: command not found"),
        "{err}"
    );

    let not_exec = d.join("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let (code, err) = run(&url, d, &["run", "k", "--", not_exec.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{err}");
    assert!(err.contains("cannot execute"), "{err}");

    let (code, err) = run("http://127.0.0.1:1", d, &["run", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("unusable service URL `http://127.0.0.1:1`"),
        "{err}"
    );

    let (code, err) = run("redis://127.0.0.1:notaport", d, &["run", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("invalid port number"), "{err}");

    // A TTL the quarantine after a loss of state would not cover.
    let started = Instant::now();
    let (code, err) = run(&url, d, &["run", "--ttl", "40s", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("--ttl 40s is above --max-ttl 30s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let (code, err) = run("etcd+http://127.0.0.1", d, &["status", "k"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("has no port"), "{err}");

    // --no-wait does not wait for a Redis that is down either (`run` without it does:
    // `a_redis_down_at_start_is_waited_for_within_wait`).
    let nobody = format!("redis://127.0.0.1:{}", leasehold_test_support::free_port());
    let started = Instant::now();
    let (code, err) = run(&nobody, d, &["run", "--no-wait", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("is redis-server running"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let (code, err) = run(&nobody, d, &["status", "k"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("is redis-server running"), "{err}");

    let no_etcd = format!(
        "etcd+http://127.0.0.1:{}",
        leasehold_test_support::free_port()
    );
    let started = Instant::now();
    let (code, err) = run(
        &no_etcd,
        d,
        &["run", "--ttl", "2s", "--no-wait", "k", "--", "true"],
    );
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("did not answer"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let (code, err) = run(&url, d, &["run", "a{b}", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("invalid key"), "{err}");

    let (code, err) = run(&url, d, &["run", "--ttl", "ten", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("write it like 10s"), "{err}");

    // Too short to renew within the shortest request bound: refused up front.
    for ttl in ["1ms", "100ms"] {
        let started = Instant::now();
        let (code, err) = run(&url, d, &["run", "--ttl", ttl, "k", "--", "true"]);
        assert_eq!(code, Some(125), "{err}");
        assert!(
            err.contains(&format!("--ttl {ttl} is too short"))
                && err.contains("use --ttl 211ms or more"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    let (code, err) = run(&url, d, &["run", "--ttl", "211ms", "k", "--", "true"]);
    assert_eq!(code, Some(0), "the shortest TTL it names works: {err}");

    let (code, err) = run(
        &url,
        d,
        &[
            "run",
            "--ttl",
            "2s",
            "--kill-after",
            "1s",
            "k",
            "--",
            "true",
        ],
    );
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("more than a quarter of --ttl"), "{err}");

    let (code, err) = run(&url, d, &["run", "k", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(code, Some(128 + 15), "killed by SIGTERM: 143; {err}");
    let (code, _) = run(&url, d, &["run", "k", "--", "sh", "-c", "exit 42"]);
    assert_eq!(code, Some(42), "the command's own status");

    let secured = RedisServer::start_with(RedisOptions {
        password: Some("right".into()),
        ..RedisOptions::default()
    });
    let wrong = format!("redis://:wrong@127.0.0.1:{}", secured.port());
    let (code, err) = run(&wrong, d, &["run", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("authentication failed: check the password"),
        "{err}"
    );
    assert!(!err.contains("wrong@"), "the password is not shown: {err}");
    let none = format!("redis://127.0.0.1:{}", secured.port());
    let (code, err) = run(&none, d, &["run", "k", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    let (code, err) = run(&secured.url(), d, &["run", "k", "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn status_shows_the_holder_and_raise_fence_moves_the_next_fence() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = scratch("cli-status");
    let d = dir.path();

    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["status", "st", "--json"]);
        c
    });
    assert_eq!(text(&out.stdout).trim(), r#"{"key":"st","held":false}"#);
    assert_eq!(out.status.code(), Some(1), "free: 1");
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["status", "st"]);
        c
    });
    assert_eq!(text(&out.stdout).trim(), r#""st" is free"#);
    assert_eq!(out.status.code(), Some(1), "free: 1");

    let mut holder = hold(&url, d, "st", "holder-\"A\"");
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["status", "st", "--json"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "held: 0");
    let json = text(&out.stdout);
    let prefix = r#"{"key":"st","held":true,"holder":"holder-\"A\"","fence":"#;
    assert!(json.starts_with(prefix), "{json}");
    // A new key's first fence is Redis's clock in µs.
    let fence: u64 = json[prefix.len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(fence > 1_700_000_000_000_000, "{json}");
    assert!(json.contains(r#","remaining_ms":"#), "{json}");
    let remaining: u64 = json
        .trim()
        .trim_end_matches('}')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining > 0 && remaining <= 2_000, "{json}");
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["status", "st"]);
        c
    });
    let human = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "held: 0");
    assert!(
        human.starts_with(&format!("\"st\" is held by holder-\"A\" (fence {fence}), ")),
        "{human}"
    );
    std::fs::write(d.join("stop"), "").unwrap();
    assert_eq!(holder.wait(Duration::from_secs(10)).code(), Some(0));

    // Raised past the clock, the counter decides the next fence.
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["raise-fence", "st", "10000000000000000"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = output({
        let mut c = leasehold(&url, d);
        c.args([
            "run",
            "st",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE $LEASEHOLD_KEY",
        ]);
        c
    });
    assert_eq!(text(&out.stdout).trim(), "10000000000000001 st");

    let etcd = EtcdCluster::single();
    let etcd_url = format!(
        "etcd+http://{}",
        etcd.endpoints().join(",").replace("http://", "")
    );
    let out = output({
        let mut c = leasehold(&etcd_url, d);
        c.args(["raise-fence", "st", "10000000000000000"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = output({
        let mut c = leasehold(&etcd_url, d);
        c.args(["run", "st", "--", "sh", "-c", "echo $LEASEHOLD_FENCE"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "10000000000000001", "etcd too");
}

/// Redis is down when `run` starts: it says so once and waits (within `--wait`), and
/// runs the command once Redis is up.
#[test]
fn a_redis_down_at_start_is_waited_for_within_wait() {
    let mut server = RedisServer::start();
    server.kill();
    let dir = scratch("cli-redis-down");
    let d = dir.path();
    let mut cmd = leasehold(&server.url(), d);
    // The Redis that comes up has no data: its first grant waits out the quarantine
    // (`--max-ttl`, the longest TTL its clients ask for).
    cmd.args([
        "-vv",
        "run",
        "--ttl",
        "2s",
        "--max-ttl",
        "2s",
        "--wait",
        "20s",
        "k",
        "--",
        "sh",
        "-c",
    ])
    .arg(format!("echo $LEASEHOLD_FENCE > {}/ran", d.display()));
    let mut a = Proc::spawn(cmd, d, "a");
    wait_contains(
        &a.stderr,
        "is redis-server running",
        Duration::from_secs(10),
    );
    wait_contains(&a.stderr, "acquire attempt failed", Duration::from_secs(10));
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "still waiting: {}",
        a.err()
    );
    let restarted = Instant::now();
    server.restart();
    assert_eq!(
        a.wait(Duration::from_secs(15)).code(),
        Some(0),
        "{}",
        a.err()
    );
    assert!(
        wait_file(&d.join("ran"), Duration::from_secs(1))
            .trim()
            .parse::<u64>()
            .is_ok(),
        "the command ran under a fence"
    );
    eprintln!(
        "Redis down at start: leasehold waited, and ran the command {:?} after Redis came up",
        restarted.elapsed()
    );
    // A bounded wait gives up with the outage named: 125.
    server.kill();
    let started = Instant::now();
    let (code, err) = run(
        &server.url(),
        d,
        &["run", "--ttl", "2s", "--wait", "1s", "k", "--", "true"],
    );
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("is redis-server running") && err.contains("did not answer"),
        "{err}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// Output to a closed pipe (`leasehold … 2>&1 | head -c0`) or a closed stderr never
/// panics (101): each command ends with its own code.
#[test]
fn a_closed_or_broken_output_never_panics() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = scratch("cli-closed-stderr");
    let d = dir.path();
    let cases: [(&[&str], i32); 6] = [
        (&["status", "k"], 1),
        (&["status", "k", "--json"], 1),
        (&["run", "a{b}", "--", "true"], 125),
        (&["-v", "run", "k", "--", "true"], 0),
        (&["--nope"], 125),
        (&["run", "--help"], 0),
    ];
    for (args, code) in cases {
        // Both streams into a pipe whose reader is gone: every write fails (EPIPE).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = leasehold(&url, d);
        cmd.args(args)
            .stdout(writer.try_clone().unwrap())
            .stderr(writer);
        let status = cmd.status().unwrap();
        assert_eq!(status.code(), Some(code), "{args:?} into a broken pipe");
        // stderr closed altogether.
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(r#"exec "$0" "$@" 2>&-"#)
            .arg(env!("CARGO_BIN_EXE_leasehold"))
            .args(["--service", &url])
            .args(args)
            .env("XDG_RUNTIME_DIR", d)
            .stdin(std::process::Stdio::null());
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(code), "{args:?} with stderr closed");
    }
}

/// `run --help` shows where CMD goes and the exit codes; `status --help` its codes.
#[test]
fn run_help_shows_the_double_dash_and_the_exit_codes() {
    let out = output({
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
        c.args(["run", "--help"]);
        c
    });
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        help.contains("Usage: leasehold run [OPTIONS] KEY -- CMD [ARGS]..."),
        "{help}"
    );
    for needle in [
        "Exit codes:",
        "122 lease lost",
        "124 --wait ran out",
        "--on-stall",
        "--cgroup",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    let out = output({
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
        c.args(["status", "--help"]);
        c
    });
    assert!(text(&out.stdout).contains("0 KEY is held; 1 KEY is free"));
}

/// The etcd client's own warnings (leasehold-etcd, tonic, h2) are not shown without
/// `-v`: leasehold says what went wrong in one line; `-v` shows them.
#[test]
fn etcd_client_logs_are_quiet_by_default() {
    let dir = scratch("cli-etcd-quiet");
    let d = dir.path();
    let no_etcd = format!(
        "etcd+http://127.0.0.1:{}",
        leasehold_test_support::free_port()
    );
    for args in [
        &["run", "--ttl", "2s", "--no-wait", "k", "--", "true"][..],
        &["status", "k"],
    ] {
        let (code, err) = run(&no_etcd, d, args);
        assert_eq!(code, Some(125), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("leasehold: ") && !err.contains("WARN"),
            "{err}"
        );
        let mut verbose = vec!["-v"];
        verbose.extend_from_slice(args);
        let (_, err) = run(&no_etcd, d, &verbose);
        assert!(
            err.contains("WARN"),
            "-v shows the client's warnings: {err}"
        );
    }
    let etcd = EtcdCluster::single();
    let (code, err) = run(
        &etcd_url(&etcd),
        d,
        &["run", "--ttl", "2s", "k", "--", "true"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err, "", "a run that goes well says nothing");
}

/// A PostgreSQL lease table made and marked new through the library (a fresh data
/// set would otherwise wait out its first quarantine); the URL.
fn postgres_marked_new(server: &leasehold_test_support::PostgresServer) -> String {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let service = leasehold_postgres::PostgresLockService::builder(&url)
                .create_tables(true)
                .connect()
                .await
                .unwrap();
            service.mark_data_set_new().await.unwrap();
        });
    url
}

#[test]
fn four_contenders_on_postgres_write_in_fence_order_and_never_overlap() {
    let server = leasehold_test_support::PostgresServer::start();
    contention(&postgres_marked_new(&server), "cli-contend-postgres");
}

/// `postgres://` and `postgresql://` URLs: `status` (free, then held), `raise-fence`,
/// and `run` on a database whose tables `run` creates itself, where the first grant
/// waits out one `--max-ttl` quarantine (a new lease table cannot tell a new
/// deployment from one that lost its grants).
#[test]
fn postgres_status_raise_fence_and_a_first_run_that_creates_the_tables() {
    let server = leasehold_test_support::PostgresServer::start();
    let dir = scratch("cli-postgres");
    let d = dir.path();
    let fresh = format!("postgresql://postgres@127.0.0.1:{}/postgres", server.port());
    let (code, err) = run(&fresh, d, &["status", "k"]);
    assert_eq!(code, Some(125), "no tables yet: {err}");
    assert!(
        err.contains("create_tables") || err.contains("migration"),
        "{err}"
    );
    let started = Instant::now();
    let mut first = leasehold(&fresh, d);
    first.args(["--max-ttl", "1s", "run", "--ttl", "1s", "k", "--", "true"]);
    let out = output(first);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the first grant waited out the quarantine: {:?}",
        started.elapsed()
    );

    let url = postgres_marked_new(&server);
    let (code, _) = run(&url, d, &["status", "st"]);
    assert_eq!(code, Some(1), "free: 1");
    let mut holder = hold(&url, d, "st", "holder-A");
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["status", "st"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "held: 0");
    assert!(
        text(&out.stdout).starts_with("\"st\" is held by holder-A (fence "),
        "{}",
        text(&out.stdout)
    );
    std::fs::write(d.join("stop"), "").unwrap();
    assert_eq!(holder.wait(Duration::from_secs(10)).code(), Some(0));
    let (code, err) = run(&url, d, &["raise-fence", "st", "10000000000000000"]);
    assert_eq!(code, Some(0), "{err}");
    let out = output({
        let mut c = leasehold(&url, d);
        c.args(["run", "st", "--", "sh", "-c", "echo $LEASEHOLD_FENCE"]);
        c
    });
    assert_eq!(
        text(&out.stdout).trim(),
        "10000000000000001",
        "{}",
        text(&out.stderr)
    );
}
