//! A device holds a lease on a real Redis: the bare-metal firmware of
//! `examples/firmware` (feature `redis`), running in QEMU, speaks RESP2 through this
//! crate over its UART0, which QEMU connects to a `redis-server` this test starts.
//!
//! Not part of `cargo test`: it needs the firmware's ELF files, which only the
//! firmware's own workspace builds. `scripts/firmware-redis.sh` builds them (Cortex-M4F
//! and Cortex-M0) and runs
//!
//! ```text
//! cargo test -p leasehold-resp --test firmware_on_redis -- MACHINE=ELF...
//! ```
//!
//! Each `MACHINE=ELF` runs in parallel against its own Redis. The test FAILS when an
//! ELF or `qemu-system-arm` is missing, or when it is given nothing to run: it never
//! passes without having run the firmware.
//!
//! For each: wait (bounded) for the firmware to acquire the key and renew it once;
//! `SIGSTOP` Redis until past the key's TTL; `SIGCONT`; then check that
//!
//! * (a) the firmware's gate closed **before** Redis's expiry of the key. Redis's own
//!   clock says when it expires: a `MONITOR` connection gives the time Redis
//!   processed the last `PEXPIRE` (or `SET … PX`) of the key, expiry = that + the
//!   milliseconds. The gate's closing is the host time at which the firmware's
//!   `gate_closed` line (semihosting, QEMU's stdout, a pipe) was read: reading it
//!   late only shrinks the margin. Both are wall-clock times of this machine. The
//!   margin is printed;
//! * (b) a second client, on the host, then acquires the key with a newer fence;
//! * the firmware reported the loss, admitted no stale write, and exited cleanly.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use embedded_io_adapters::tokio_1::FromTokio;
use leasehold::{AcquireOutcome, Fence, Identity, Owner, Term};
use leasehold_resp::RespLockService;
use leasehold_test_support::{binary, RedisServer};
use leasehold_tokio::LeaseClock;

/// The firmware's key (`examples/firmware/src/main.rs`), as Redis stores it.
const KEY: &str = "pump-7";
const REDIS_KEY: &str = "{pump-7}";
/// The firmware's TTL.
const TTL: Duration = Duration::from_secs(3);
/// Bounds on what should take well under a second.
const BOOT_AND_ACQUIRE: Duration = Duration::from_secs(15);
const STEP: Duration = Duration::from_secs(5);

fn main() {
    let runs: Vec<(String, PathBuf)> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .map(|arg| match arg.split_once('=') {
            Some((machine, elf)) => (machine.to_owned(), PathBuf::from(elf)),
            None => panic!("expected MACHINE=ELF, got {arg:?}"),
        })
        .collect();
    assert!(
        !runs.is_empty(),
        "nothing to run: pass MACHINE=ELF (scripts/firmware-redis.sh does)"
    );
    let qemu = binary("qemu-system-arm", "qemu-system-arm").unwrap_or_else(|e| panic!("{e}"));
    for (_, elf) in &runs {
        assert!(elf.is_file(), "no firmware ELF at {}", elf.display());
    }
    let handles: Vec<_> = runs
        .into_iter()
        .map(|(machine, elf)| {
            let qemu = qemu.clone();
            thread::spawn(move || run(&qemu, &machine, &elf))
        })
        .collect();
    let mut failed = false;
    for handle in handles {
        failed |= handle.join().is_err();
    }
    assert!(!failed, "a firmware run failed (see above)");
    println!("firmware_on_redis: ok");
}

/// Host wall-clock time, in microseconds since the epoch (Redis's `MONITOR` clock).
fn wall_micros() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970");
    i64::try_from(since.as_micros()).expect("fits")
}

/// A line and the host wall-clock time it was read at.
struct Line {
    at: i64,
    text: String,
}

/// Forwards each line of `from` with the time it was read.
fn lines(from: impl std::io::Read + Send + 'static) -> Receiver<Line> {
    let (send, receive) = channel();
    thread::spawn(move || {
        for text in BufReader::new(from).lines().map_while(Result::ok) {
            if send
                .send(Line {
                    at: wall_micros(),
                    text,
                })
                .is_err()
            {
                return;
            }
        }
    });
    receive
}

/// QEMU, killed and reaped when dropped (a failed check never leaves it running).
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The firmware's lines, and every line read so far.
struct Firmware {
    lines: Receiver<Line>,
    seen: Vec<Line>,
    name: String,
}

impl Firmware {
    /// The first line, read so far or within `limit`, that starts with `prefix`;
    /// panics with the firmware's output.
    fn wait_for(&mut self, prefix: &str, limit: Duration) -> (i64, String) {
        let give_up = Instant::now() + limit;
        loop {
            if let Some(line) = self.seen.iter().find(|l| l.text.starts_with(prefix)) {
                return (line.at, line.text.clone());
            }
            let left = give_up.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    println!("[{}] {}", self.name, line.text);
                    self.seen.push(line);
                }
                Err(e) => {
                    let text: Vec<&str> = self.seen.iter().map(|l| l.text.as_str()).collect();
                    panic!(
                        "[{}] no `{prefix}` line within {limit:?} ({e}); the firmware \
                         printed:\n{}",
                        self.name,
                        text.join("\n")
                    )
                }
            }
        }
    }
}

/// `key=value` from a firmware line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// From one `MONITOR` line, the expiry it sets on the firmware's key, in Redis's wall
/// clock (µs): a `PEXPIRE key ms`, or the `SET key value PX ms` of a grant.
fn expiry_set(line: &str) -> Option<i64> {
    let (stamp, rest) = line.strip_prefix('+')?.split_once(' ')?;
    let (secs, micros) = stamp.split_once('.')?;
    let at = secs.parse::<i64>().ok()? * 1_000_000 + micros.parse::<i64>().ok()?;
    let sets = rest.contains(&format!("\"PEXPIRE\" \"{REDIS_KEY}\" "))
        || (rest.contains(&format!("\"SET\" \"{REDIS_KEY}\" ")) && rest.contains("\"PX\" "));
    if !sets {
        return None;
    }
    let ms = rest.trim_end().strip_suffix('"')?.rsplit('"').next()?;
    Some(at + ms.parse::<i64>().ok()? * 1_000)
}

fn run(qemu: &Path, machine: &str, elf: &Path) {
    let name = format!(
        "{machine} {}",
        elf.file_name().unwrap_or_default().to_string_lossy()
    );
    let server = RedisServer::start();

    // Redis's own account of every command, with its timestamps.
    let mut monitor = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    monitor.write_all(b"MONITOR\r\n").expect("MONITOR");
    let monitor = lines(monitor);

    let mut child = Command::new(qemu)
        .args(["-M", machine, "-display", "none", "-monitor", "none"])
        // UART0 is the first serial port; `reconnect=1` re-dials if Redis drops it.
        .arg("-serial")
        .arg(format!("tcp:127.0.0.1:{},reconnect=1", server.port()))
        .args(["-semihosting-config", "enable=on,target=native", "-kernel"])
        .arg(elf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", qemu.display()));
    let stdout = child.stdout.take().expect("piped");
    let mut qemu = Qemu(child);
    let mut firmware = Firmware {
        lines: lines(stdout),
        seen: Vec::new(),
        name: name.clone(),
    };

    let (acquired_at, acquired) = firmware.wait_for("event=acquired", BOOT_AND_ACQUIRE);
    let fence: u64 = field(&acquired, "fence").parse().expect("a fence");
    firmware.wait_for("event=renewed", STEP);

    // Redis goes silent past the TTL. Any renewal it processed happened before the
    // stop, so the key expires by `stopped + TTL` on Redis's clock; and the gate must
    // have closed before that.
    server.pause();
    let stopped = wall_micros();
    let (closed, closed_line) = firmware.wait_for("gate_closed", TTL + STEP);
    let firmware_ms = field(&closed_line, "t_ms").parse::<i64>().expect("ms")
        - field(&acquired, "t_ms").parse::<i64>().expect("ms");
    println!(
        "[{name}] clock: {firmware_ms} ms on the firmware's clock took {} ms on the host's",
        (closed - acquired_at) / 1_000
    );
    let past_ttl = stopped + TTL.as_micros() as i64 + 200_000 - wall_micros();
    // Waiting out a real TTL on a real server.
    thread::sleep(Duration::from_micros(u64::try_from(past_ttl).unwrap_or(0)));
    server.resume();

    // Every MONITOR line up to the resume: Redis sends them in order, so once the
    // marker's line is in, all earlier ones are.
    let marker = format!("leasehold-marker-{}", std::process::id());
    assert!(server.inline(&format!("ECHO {marker}")).is_some());
    let mut expiry = None;
    let give_up = Instant::now() + STEP;
    loop {
        let line = monitor
            .recv_timeout(give_up.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("[{name}] MONITOR ended before the marker: {e}"));
        if line.text.contains(&marker) {
            break;
        }
        if let Some(at) = expiry_set(&line.text) {
            expiry = Some(at);
        }
    }
    let expiry = expiry.unwrap_or_else(|| panic!("[{name}] MONITOR saw no expiry set"));
    let margin_ms = (expiry - closed) as f64 / 1_000.0;
    println!(
        "[{name}] gate closed {margin_ms:.1} ms before Redis expired the key \
         (TTL {} ms; margin = Redis's last expiry set + TTL - host time the \
         gate_closed line was read)",
        TTL.as_millis()
    );
    assert!(
        closed > stopped,
        "[{name}] the gate closed before Redis was stopped"
    );
    assert!(
        closed < expiry,
        "[{name}] the gate closed {:.1} ms AFTER Redis's expiry",
        -margin_ms
    );

    // (b) Someone else gets the key, with a newer fence.
    let port = server.port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let outcome = runtime.block_on(async {
        let clock = LeaseClock::start();
        let service: RespLockService<'_, _, _> = RespLockService::new(
            move || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map(FromTokio::new)
            },
            clock,
        );
        let identity = Identity::new("host").expect("valid");
        let token = Owner(*b"host-contender-1").token(Term(1));
        service
            .try_acquire(KEY, token, &identity, leasehold::Duration::from_secs(3))
            .await
    });
    match outcome {
        Ok(AcquireOutcome::Granted { fence: newer, .. }) => assert!(
            newer > Fence(fence),
            "[{name}] the host got fence {newer:?}, not newer than the firmware's {fence}"
        ),
        other => panic!("[{name}] the host could not take the key over: {other:?}"),
    }

    // The firmware saw the loss, reports, and exits.
    firmware.wait_for("event=lost", STEP);
    let (_, report) = firmware.wait_for("acquired=", STEP);
    assert_eq!(field(&report, "acquired"), "1", "[{name}]");
    assert_eq!(field(&report, "lost"), "1", "[{name}]");
    let (_, writes) = firmware.wait_for("writes_admitted=", STEP);
    assert_eq!(field(&writes, "writes_stale"), "0", "[{name}]");
    assert_ne!(field(&writes, "writes_admitted"), "0", "[{name}]");
    let give_up = Instant::now() + STEP;
    let status = loop {
        if let Some(status) = qemu.0.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < give_up, "[{name}] QEMU did not exit");
        thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "[{name}] QEMU exited with {status}");
    println!("[{name}] ok: fence {fence} lost to the host's newer fence");
}
