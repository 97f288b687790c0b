//! `leasehold run --fair`: real `leasehold` processes wait in line. A holder, then
//! contenders started one after another (each seen in the service's queue before the
//! next starts) run their commands in that order; a queued contender killed with
//! SIGKILL is skipped within its TTL; `status` shows the line. `--fair` where the
//! service does not offer it is a usage error before anything connects.
//!
//! Each scenario is a function of the service URL and a way to read the key's queue,
//! so that another service is one more `#[test]`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::{EtcdCluster, RedisServer};

const KEY: &str = "fair";

/// Reads the identities waiting for a key, in order (`waiting()` of the service).
type Waiting<'a> = &'a dyn Fn(&str) -> Vec<String>;

/// The queue of a Redis, through `RedisLockService::waiting`.
fn redis_waiting(url: &str) -> impl Fn(&str) -> Vec<String> + '_ {
    move |key: &str| {
        blocking(async {
            let service = leasehold_redis::RedisLockService::builder(url)
                .connect()
                .await;
            names(service.unwrap().waiting(key).await.unwrap())
        })
    }
}

/// The queue of an etcd, through `EtcdLockService::waiting`.
fn etcd_waiting(endpoints: Vec<String>) -> impl Fn(&str) -> Vec<String> {
    move |key: &str| {
        blocking(async {
            let service = leasehold_etcd::EtcdLockService::connect(&endpoints).await;
            names(service.unwrap().waiting(key).await.unwrap())
        })
    }
}

/// Runs `future` to its end on a runtime of its own.
fn blocking<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// The identities of a queue, in order.
fn names(queue: Vec<leasehold::Identity>) -> Vec<String> {
    queue
        .iter()
        .map(|identity| identity.as_str().to_owned())
        .collect()
}

/// `leasehold run --fair --ttl TTL --identity ID KEY -- sh -c SCRIPT`.
fn fair_run(url: &str, dir: &Path, ttl: &str, identity: &str, script: &str) -> Proc {
    let mut cmd = leasehold(url, dir);
    cmd.env("DIR", dir).args([
        "run",
        "--fair",
        "--ttl",
        ttl,
        "--identity",
        identity,
        KEY,
        "--",
        "sh",
        "-c",
        script,
    ]);
    Proc::spawn(cmd, dir, identity)
}

/// The holder: notes that it runs, then holds the key until `$DIR/<go>` exists.
fn holder_script(go: &str) -> String {
    format!(r#"echo holder >> "$DIR/order"; while [ ! -e "$DIR/{go}" ]; do sleep 0.01; done"#)
}

/// Starts `identity` and waits until it is last in the queue.
fn queue(
    url: &str,
    dir: &Path,
    waiting: Waiting<'_>,
    ttl: &str,
    identity: &str,
    script: &str,
) -> Proc {
    let proc = fair_run(url, dir, ttl, identity, script);
    wait_until(
        &format!("{identity} queued"),
        Duration::from_secs(10),
        || waiting(KEY).last().map(String::as_str) == Some(identity),
    );
    proc
}

/// A holder, then `n` contenders queued one after another: once the holder lets go,
/// each runs its command in the order it queued.
fn contenders_run_in_the_order_they_queued(url: &str, waiting: Waiting<'_>, n: usize) {
    let dir = scratch("fair-order");
    let order = dir.path().join("order");
    let mut holder = fair_run(url, dir.path(), "2s", "holder", &holder_script("go"));
    wait_contains(&order, "holder", Duration::from_secs(10));
    let mut contenders: Vec<Proc> = (0..n)
        .map(|i| {
            let name = format!("c{i}");
            let script = format!(r#"echo {i} >> "$DIR/order""#);
            queue(url, dir.path(), waiting, "2s", &name, &script)
        })
        .collect();
    let expected: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    assert_eq!(waiting(KEY), expected);
    // `status` shows the line, in order, as text and as JSON.
    let quoted: Vec<String> = expected.iter().map(|c| format!("\"{c}\"")).collect();
    let mut cmd = leasehold(url, dir.path());
    cmd.args(["status", KEY]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!("waiting in line: {}", quoted.join(", "))),
        "{shown}"
    );
    let mut cmd = leasehold(url, dir.path());
    cmd.args(["status", "--json", KEY]);
    let shown = text(&output(cmd).stdout);
    assert!(
        shown.contains(&format!("\"waiting\":[{}]}}", quoted.join(","))),
        "{shown}"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(
        holder.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        holder.err()
    );
    for c in &mut contenders {
        let status = c.wait(Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "stderr: {}", c.err());
    }
    let ran = std::fs::read_to_string(&order).unwrap();
    let expected: Vec<String> = std::iter::once("holder".to_owned())
        .chain((0..n).map(|i| i.to_string()))
        .collect();
    assert_eq!(ran.lines().collect::<Vec<_>>(), expected);
}

/// A holder, then `a` (TTL 1 s) and `b` (3 s) queued; `a` is killed with SIGKILL, then the
/// holder lets go: `b` runs, within `a`'s TTL after the kill (and not before `a`'s
/// place ended, one retry interval before the kill at the earliest), and `a` never.
fn a_killed_contender_is_skipped_within_its_ttl(url: &str, waiting: Waiting<'_>) {
    const A_TTL: Duration = Duration::from_secs(1);
    let dir = scratch("fair-kill");
    let order = dir.path().join("order");
    let mut holder = fair_run(url, dir.path(), "10s", "holder", &holder_script("go"));
    wait_contains(&order, "holder", Duration::from_secs(10));
    let a = queue(
        url,
        dir.path(),
        waiting,
        "1s",
        "a",
        r#"echo a >> "$DIR/order""#,
    );
    let b_script = r#"echo "b $(date +%s%3N)" >> "$DIR/order""#;
    let mut b = queue(url, dir.path(), waiting, "3s", "b", b_script);
    a.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = epoch_ms();
    wait_dead(a.pid(), Duration::from_secs(5));
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(
        holder.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        holder.err()
    );
    let started = Instant::now();
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        b.err()
    );
    let ran = std::fs::read_to_string(&order).unwrap();
    let lines: Vec<&str> = ran.lines().collect();
    assert_eq!(lines.len(), 2, "{ran}");
    assert_eq!(lines[0], "holder");
    let b_ran: u128 = lines[1].strip_prefix("b ").unwrap().parse().unwrap();
    let after_kill = b_ran.saturating_sub(killed);
    println!(
        "b ran {after_kill} ms after a was killed (a's TTL {} ms; b waited {:?} after the \
         holder exited)",
        A_TTL.as_millis(),
        started.elapsed()
    );
    // a's last attempt was at most one retry interval (TTL/20, jittered) before the
    // kill, and its place lasts its TTL from there.
    assert!(
        after_kill >= A_TTL.as_millis() * 9 / 10,
        "b ran {after_kill} ms after the kill, while a's place was live"
    );
    // b asks every 150 ms (its TTL/20, jittered) and starts its command at once.
    assert!(
        after_kill <= A_TTL.as_millis() + 1_000,
        "b ran only {after_kill} ms after the kill"
    );
}

#[test]
fn redis_contenders_run_in_the_order_they_queued() {
    let server = RedisServer::start();
    let url = server.url();
    contenders_run_in_the_order_they_queued(&url, &redis_waiting(&url), 8);
}

#[test]
fn redis_a_killed_contender_is_skipped_within_its_ttl() {
    let server = RedisServer::start();
    let url = server.url();
    a_killed_contender_is_skipped_within_its_ttl(&url, &redis_waiting(&url));
}

#[test]
fn etcd_contenders_run_in_the_order_they_queued() {
    let cluster = EtcdCluster::single();
    let url = etcd_url(&cluster);
    contenders_run_in_the_order_they_queued(&url, &etcd_waiting(cluster.endpoints()), 8);
}

#[test]
fn etcd_a_killed_contender_is_skipped_within_its_ttl() {
    let cluster = EtcdCluster::single();
    let url = etcd_url(&cluster);
    a_killed_contender_is_skipped_within_its_ttl(&url, &etcd_waiting(cluster.endpoints()));
}

/// On PostgreSQL, `--fair` fails at start, before connecting (nothing listens on this
/// port), with exit 125.
#[test]
fn fair_where_it_is_not_offered_is_a_usage_error_at_start() {
    let dir = scratch("fair-usage");
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    let mut cmd = leasehold(url, dir.path());
    cmd.args(["run", "--fair", "k", "--", "true"]);
    let out = output(cmd);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("--fair is offered on Redis and etcd, not on PostgreSQL"),
        "{err}"
    );
}
