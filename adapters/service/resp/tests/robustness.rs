//! Parser robustness: arbitrary bytes and arbitrary splits of valid replies, through
//! the whole service (factory, buffers, `NOSCRIPT` handling, reply checks). No input
//! panics, and a grant comes only from the byte-exact grant reply.

//!
//! The parser's own cases (every prefix of a reply is incomplete, and so on) are unit
//! tests beside it in `src/resp.rs`.

use core::convert::Infallible;

use leasehold::{AcquireOutcome, Duration, Identity, Instant, Owner, RenewOutcome, Term};
use leasehold_driver::Clock;
use leasehold_resp::RespLockService;
use proptest::prelude::*;

/// A clock whose deadlines never come: a scripted stream never stalls.
struct Frozen;

impl Clock for Frozen {
    fn now(&self) -> Instant {
        Instant::ZERO
    }
    fn sleep_until(&self, _: Instant) -> impl core::future::Future<Output = ()> {
        core::future::pending()
    }
}

/// A stream that answers `data`, handing it out in pieces of the given sizes (the
/// last size repeats), then end-of-stream; it swallows whatever is written.
#[derive(Clone)]
struct Scripted {
    data: Vec<u8>,
    pieces: Vec<usize>,
    at: usize,
    read: usize,
}

impl embedded_io_async::ErrorType for Scripted {
    type Error = Infallible;
}

impl embedded_io_async::Read for Scripted {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let piece = self
            .pieces
            .get(self.read)
            .or(self.pieces.last())
            .copied()
            .unwrap_or(1)
            .max(1);
        self.read += 1;
        let rest = self.data.get(self.at..).unwrap_or(&[]);
        let n = piece.min(rest.len()).min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

impl embedded_io_async::Write for Scripted {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        Ok(buf.len())
    }

    async fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

fn token() -> leasehold::OwnerToken {
    Owner([7; 16]).token(Term(1))
}

/// The service's answer to acquire when the stream answers `data` in `pieces`.
fn acquire_through<const R: usize>(data: &[u8], pieces: &[usize]) -> AcquireOutcome {
    let stream = Scripted {
        data: data.to_vec(),
        pieces: pieces.to_vec(),
        at: 0,
        read: 0,
    };
    let service: RespLockService<'_, _, _, R, 16> = RespLockService::new(
        move || core::future::ready(Ok::<_, Infallible>(stream.clone())),
        Frozen,
    );
    futures::executor::block_on(leasehold_driver::LocalLockService::acquire(
        &service,
        "k",
        token(),
        &Identity::EMPTY,
        Duration::from_millis(300),
    ))
}

fn renew_through(data: &[u8], pieces: &[usize]) -> RenewOutcome {
    let stream = Scripted {
        data: data.to_vec(),
        pieces: pieces.to_vec(),
        at: 0,
        read: 0,
    };
    let service: RespLockService<'_, _, _> = RespLockService::new(
        move || core::future::ready(Ok::<_, Infallible>(stream.clone())),
        Frozen,
    );
    futures::executor::block_on(leasehold_driver::LocalLockService::renew(
        &service,
        "k",
        token(),
        leasehold::Fence(1),
        Duration::from_millis(300),
    ))
}

/// Whether `data` starts with exactly the grant reply `{1|2, fence}`: `*2`, `:1` or
/// `:2`, then the fence as a bulk string of decimal digits without a leading zero
/// (what follows it may arrive after the service has read the grant).
fn is_exact_grant(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    (1..=2).any(|tag| {
        text.strip_prefix(&format!("*2\r\n:{tag}\r\n$"))
            .and_then(|rest| rest.split_once("\r\n"))
            .and_then(|(len, rest)| Some((len.parse::<usize>().ok()?, rest)))
            .is_some_and(|(len, rest)| {
                let digits = rest.get(..len).unwrap_or("");
                rest.get(len..).is_some_and(|end| end.starts_with("\r\n"))
                    && !digits.starts_with('0')
                    && digits.parse::<u64>().is_ok()
            })
    })
}

/// A reply a script gives, as Redis writes it.
fn valid_reply() -> impl Strategy<Value = Vec<u8>> {
    let fence = 1u64..;
    prop_oneof![
        (1u8..=2, fence.clone()).prop_map(|(tag, f)| {
            let f = f.to_string();
            format!("*2\r\n:{tag}\r\n${}\r\n{f}\r\n", f.len()).into_bytes()
        }),
        (fence, "[a-z0-9:-]{0,64}", -1i64..100_000).prop_map(|(f, id, pttl)| {
            let f = f.to_string();
            format!(
                "*4\r\n:0\r\n${}\r\n{f}\r\n${}\r\n{id}\r\n:{pttl}\r\n",
                f.len(),
                id.len()
            )
            .into_bytes()
        }),
        Just(b":1\r\n".to_vec()),
        Just(b":0\r\n".to_vec()),
        Just(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n".to_vec()),
        Just(b"-LOADING Redis is loading the dataset in memory\r\n".to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic_and_never_grant(
        data in proptest::collection::vec(any::<u8>(), 0..300),
        pieces in proptest::collection::vec(1usize..40, 1..8),
    ) {
        for outcome in [acquire_through::<256>(&data, &pieces), acquire_through::<8>(&data, &pieces)] {
            if let AcquireOutcome::Granted { .. } = outcome {
                prop_assert!(is_exact_grant(&data), "granted from {data:?}");
            }
        }
        let renewed = matches!(renew_through(&data, &pieces), RenewOutcome::Renewed { .. });
        prop_assert!(!renewed || data == b":1\r\n", "renewed from {data:?}");
    }

    #[test]
    fn garbage_around_a_grant_is_never_a_grant(
        reply in valid_reply(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        pieces in proptest::collection::vec(1usize..40, 1..8),
    ) {
        let mut data = reply.clone();
        let i = at.index(data.len() + 1);
        data.insert(i, byte);
        if let AcquireOutcome::Granted { .. } = acquire_through::<256>(&data, &pieces) {
            prop_assert!(is_exact_grant(&data), "granted from {data:?}");
        }
        let mut cut = reply;
        cut.truncate(i.min(cut.len().saturating_sub(1)));
        let granted = matches!(acquire_through::<256>(&cut, &pieces), AcquireOutcome::Granted { .. });
        prop_assert!(!granted, "granted from the cut reply {:?}", cut);
    }

    #[test]
    fn any_split_of_a_valid_reply_reads_as_the_whole(
        reply in valid_reply(),
        pieces in proptest::collection::vec(1usize..40, 1..8),
    ) {
        let whole = acquire_through::<256>(&reply, &[reply.len()]);
        prop_assert_eq!(acquire_through::<256>(&reply, &pieces), whole);
        prop_assert_eq!(acquire_through::<256>(&reply, &[1]), whole);
    }
}

#[test]
fn a_reply_longer_than_the_buffer_is_a_protocol_error_not_a_grant() {
    let grant = b"*2\r\n:1\r\n$20\r\n18446744073709551615\r\n";
    assert_eq!(
        acquire_through::<8>(grant, &[3]),
        AcquireOutcome::Indeterminate(leasehold::Indeterminate::Protocol)
    );
    assert!(matches!(
        acquire_through::<64>(grant, &[3]),
        AcquireOutcome::Granted {
            fence: leasehold::Fence(u64::MAX),
            ..
        }
    ));
    let trailing = [grant.to_vec(), b":1\r\n".to_vec()].concat();
    assert_eq!(
        acquire_through::<64>(&trailing, &[100]),
        AcquireOutcome::Indeterminate(leasehold::Indeterminate::Protocol)
    );
}
