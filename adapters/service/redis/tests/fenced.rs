//! Fenced storage in Redis (`fenced_write` / `fenced_read`) against a real
//! `redis-server`: the guard, exact fences past 2^53, garbage refused before any
//! write, and concurrent writers checked against Redis's own order of execution
//! (`MONITOR`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::*;
use leasehold::Fence;
use leasehold_redis::{FencedKeys, FencedWrite, RedisLockError};
use leasehold_test_support::{check_fenced_history, Answer, FencePlan};
use redis::AsyncCommands;

const TWO_TO_53: u64 = 1 << 53;

#[tokio::test]
async fn equal_and_newer_fences_are_admitted_and_an_older_one_is_stale_with_the_newest() {
    let server = RedisServer::start();
    let service = service(&server.url()).await;
    let mut raw = raw(&server.url()).await;

    assert_eq!(service.fenced_read("orders").await.unwrap(), None);
    let write =
        |fence: u64, value: &'static [u8]| service.fenced_write("orders", Fence(fence), value);
    assert_eq!(write(5, b"a").await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"b").await.unwrap(),
        FencedWrite::Written,
        "the same holder writes again with an equal fence (a `<` guard fails here)"
    );
    assert_eq!(write(7, b"c").await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"late").await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(5),
            newest: Fence(7)
        },
        "a paused holder's write is refused (a missing guard fails here)"
    );
    let stored = service.fenced_read("orders").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"c"[..], Fence(7))
    );

    // What Redis holds: the value and, beside it in the same slot, the newest fence.
    let keys = FencedKeys::new("orders").unwrap();
    let data: Vec<u8> = raw.get(&keys.data).await.unwrap();
    let fence: String = raw.get(&keys.fence).await.unwrap();
    assert_eq!((data.as_slice(), fence.as_str()), (&b"c"[..], "7"));
    // Redis Cluster computes the slot (only a cluster-enabled node answers KEYSLOT).
    let cluster = RedisServer::start_with(RedisOptions {
        cluster: true,
        ..RedisOptions::default()
    });
    let mut on_cluster = common::raw(&cluster.url()).await;
    let slot = |key: &str| redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone();
    let (a, b): (i64, i64) = (
        slot(&keys.data).query_async(&mut on_cluster).await.unwrap(),
        slot(&keys.fence)
            .query_async(&mut on_cluster)
            .await
            .unwrap(),
    );
    assert_eq!(a, b, "one hash tag, one slot");
    // A lock of the same name keeps its own keys.
    assert_ne!(
        keys.fence,
        leasehold_redis::Keys::new("orders").unwrap().fence
    );

    // Binary values travel as they are.
    let binary = [0u8, 0xff, b'\n', 0x80];
    assert_eq!(
        service
            .fenced_write("bin", Fence(1), &binary)
            .await
            .unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        service.fenced_read("bin").await.unwrap().unwrap().value,
        binary
    );
}

/// Lua numbers are doubles: 2^53 + 1 reads as 2^53. The script compares decimal
/// strings, so neighbours past 2^53 and at the top of `u64` stay apart.
#[tokio::test]
async fn fences_past_2_53_and_up_to_u64_max_compare_exactly() {
    let server = RedisServer::start();
    let service = service(&server.url()).await;
    let write = |fence: u64| service.fenced_write("big", Fence(fence), b"v");
    assert_eq!(write(TWO_TO_53 + 1).await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(TWO_TO_53).await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(TWO_TO_53),
            newest: Fence(TWO_TO_53 + 1)
        },
        "a numeric compare in Lua would admit this"
    );
    assert_eq!(
        write(999).await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(999),
            newest: Fence(TWO_TO_53 + 1)
        },
        "shorter is older"
    );
    assert_eq!(write(u64::MAX - 1).await.unwrap(), FencedWrite::Written);
    assert_eq!(write(u64::MAX).await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(u64::MAX - 1).await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(u64::MAX - 1),
            newest: Fence(u64::MAX)
        }
    );
    assert_eq!(write(u64::MAX).await.unwrap(), FencedWrite::Written);
    assert_eq!(
        service.fenced_read("big").await.unwrap().unwrap().fence,
        Fence(u64::MAX)
    );
}

#[tokio::test]
async fn a_bad_name_is_refused_before_sending_and_a_garbage_fence_before_any_write() {
    let server = RedisServer::start();
    let service = service(&server.url()).await;
    let mut raw = raw(&server.url()).await;

    for bad in ["", "a{b}"] {
        let err = service.fenced_write(bad, Fence(1), b"v").await.unwrap_err();
        assert!(matches!(err, RedisLockError::InvalidKey { .. }), "{err:?}");
    }

    let keys = FencedKeys::new("g").unwrap();
    let _: () = raw.set(&keys.fence, "not-a-fence").await.unwrap();
    let err = service.fenced_write("g", Fence(9), b"v").await.unwrap_err();
    assert!(matches!(err, RedisLockError::Refused { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(shown.contains("fenced write"), "{shown}");
    assert!(
        shown.contains("fence key holds something that is not a fence"),
        "{shown}"
    );
    let data: Option<Vec<u8>> = raw.get(&keys.data).await.unwrap();
    assert_eq!(data, None, "nothing was written");
    let err = service.fenced_read("g").await.unwrap_err();
    assert!(matches!(err, RedisLockError::Protocol(_)), "{err:?}");
}

/// A connection that has sent `MONITOR`: every command Redis executes, in the order
/// it executes them, including the ones a script runs.
struct Monitor {
    lines: BufReader<TcpStream>,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(std_ms(30_000))).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut lines = BufReader::new(stream);
        let mut ok = String::new();
        lines.read_line(&mut ok).unwrap();
        assert_eq!(ok, "+OK\r\n");
        Monitor { lines }
    }

    /// The value of every `SET key …` Redis executed, in order, until the `ECHO
    /// end` (sent after the writers finished).
    fn sets_until(mut self, key: &str, end: &str) -> Vec<String> {
        let set = format!("\"SET\" \"{key}\" \"");
        let end = format!("\"ECHO\" \"{end}\"");
        let mut values = Vec::new();
        loop {
            let mut line = String::new();
            let n = self
                .lines
                .read_line(&mut line)
                .expect("MONITOR within 30 s");
            assert!(n > 0, "MONITOR connection closed");
            if line.contains(&end) {
                return values;
            }
            if let Some(at) = line.find(&set) {
                let rest = &line[at + set.len()..];
                values.push(rest.trim_end().trim_end_matches('"').to_owned());
            }
        }
    }
}

/// Writers on their own connections, interleaved fresh, repeated and older fences on
/// one resource; `MONITOR` records the order in which Redis ran the scripts' `SET`s
/// of the newest fence: it must never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_stale_and_fresh_writers_never_admit_an_older_fence_after_a_newer_one() {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let server = RedisServer::start();
    let keys = FencedKeys::new("k").unwrap();
    let monitor = Monitor::start(server.port());
    let fence_key = keys.fence.clone();
    let observed = std::thread::spawn(move || monitor.sets_until(&fence_key, "fenced-writes-done"));

    let plan = Arc::new(FencePlan::new());
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let service = service(&server.url()).await;
        let plan = Arc::clone(&plan);
        writers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut previous = None;
            for i in 0..WRITES {
                let fence = plan.fence(writer, i, previous);
                previous = Some(fence);
                let value = format!("{}:{writer}:{i}", fence.0);
                let stale = match service.fenced_write("k", fence, value.as_bytes()).await {
                    Ok(FencedWrite::Written) => None,
                    Ok(FencedWrite::Stale { presented, newest }) => {
                        assert_eq!(presented, fence);
                        Some(newest)
                    }
                    Err(e) => panic!("writer {writer}: {e}"),
                };
                answers.push(Answer { fence, stale });
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for writer in writers {
        answers.extend(writer.await.unwrap());
    }
    let mut raw = raw(&server.url()).await;
    let _: String = redis::cmd("ECHO")
        .arg("fenced-writes-done")
        .query_async(&mut raw)
        .await
        .unwrap();
    let admitted: Vec<Fence> = observed
        .join()
        .unwrap()
        .iter()
        .map(|v| {
            Fence(
                v.parse()
                    .unwrap_or_else(|_| panic!("a fence in MONITOR: {v}")),
            )
        })
        .collect();

    let counts = check_fenced_history(&admitted, &answers);
    println!("redis, {WRITERS} writers x {WRITES}: {counts:?}");
    let last = *admitted.last().unwrap();
    let stored = service(&server.url())
        .await
        .fenced_read("k")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.fence, last);
    let value = String::from_utf8(stored.value).unwrap();
    assert!(
        value.starts_with(&format!("{}:", last.0)),
        "the value travels with its fence: {value} under {last}"
    );
}
