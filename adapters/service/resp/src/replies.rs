//! What each script answers, read from a parsed reply. Anything else is
//! [`ProtocolError::Unexpected`]: never a grant.

use leasehold::{Duration, Fence, Holder, Identity};

use crate::error::{Error, ProtocolError};
use crate::resp::{fence_digits, Items, Reply, Scalar};

/// What the acquire script answered: a grant's fence, who holds the key, or how long
/// the data set's quarantine lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted(Fence),
    HeldByAnother(Holder),
    Quarantined(Duration),
}

const UNEXPECTED: Error = Error::Protocol(ProtocolError::Unexpected);

/// `{1, fence}` / `{2, fence}` (granted, or granted again to the same token),
/// `{0, fence, identity, pttl}` or `{3, ms}` (quarantine).
pub(crate) fn acquire(reply: Reply<'_>) -> Result<Acquired, Error> {
    let Reply::Array(mut items) = reply else {
        return Err(UNEXPECTED);
    };
    match (items.len(), items.next()) {
        (2, Some(Scalar::Int(1 | 2))) => Ok(Acquired::Granted(fence(items.next())?)),
        (4, Some(Scalar::Int(0))) => Ok(Acquired::HeldByAnother(holder(items)?)),
        (2, Some(Scalar::Int(3))) => match items.next() {
            Some(Scalar::Int(ms)) if ms > 0 => Ok(Acquired::Quarantined(Duration::from_millis(
                ms.unsigned_abs(),
            ))),
            _ => Err(UNEXPECTED),
        },
        _ => Err(UNEXPECTED),
    }
}

/// `{0}` (free) or `{1, fence, identity, pttl}`.
pub(crate) fn holder_query(reply: Reply<'_>) -> Result<Option<Holder>, Error> {
    let Reply::Array(mut items) = reply else {
        return Err(UNEXPECTED);
    };
    match (items.len(), items.next()) {
        (1, Some(Scalar::Int(0))) => Ok(None),
        (4, Some(Scalar::Int(1))) => holder(items).map(Some),
        _ => Err(UNEXPECTED),
    }
}

/// Renew and release: 1 (done) or 0 (not the owner).
pub(crate) fn flag(reply: Reply<'_>) -> Result<bool, Error> {
    match reply {
        Reply::Scalar(Scalar::Int(1)) => Ok(true),
        Reply::Scalar(Scalar::Int(0)) => Ok(false),
        _ => Err(UNEXPECTED),
    }
}

/// `fence, identity, pttl` of a held key: the last three items.
fn holder(mut items: Items<'_>) -> Result<Holder, Error> {
    let fence = fence(items.next())?;
    let (Some(Scalar::Bulk(Some(identity))), Some(Scalar::Int(pttl))) =
        (items.next(), items.next())
    else {
        return Err(UNEXPECTED);
    };
    let remaining = match pttl {
        // No expiry (someone ran PERSIST on it): held until deleted.
        -1 => Duration::MAX,
        ms if ms >= 0 => Duration::from_millis(ms.unsigned_abs()),
        _ => return Err(UNEXPECTED),
    };
    Ok(Holder {
        identity: Identity::lossy_utf8(identity),
        fence,
        remaining,
    })
}

/// A fence travels as a decimal bulk string: exact beyond Lua's 2^53.
fn fence(item: Option<Scalar<'_>>) -> Result<Fence, Error> {
    match item {
        Some(Scalar::Bulk(Some(digits))) => fence_digits(digits).map(Fence).ok_or(UNEXPECTED),
        _ => Err(UNEXPECTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::parse;

    fn reply(bytes: &[u8]) -> Reply<'_> {
        parse(bytes).unwrap().0
    }

    #[test]
    fn acquire_answers() {
        assert_eq!(
            acquire(reply(b"*2\r\n:1\r\n$20\r\n18446744073709551615\r\n")),
            Ok(Acquired::Granted(Fence(u64::MAX)))
        );
        assert_eq!(
            acquire(reply(b"*4\r\n:0\r\n$1\r\n3\r\n$6\r\nhost-1\r\n:-1\r\n")),
            Ok(Acquired::HeldByAnother(Holder {
                identity: Identity::new("host-1").unwrap(),
                fence: Fence(3),
                remaining: Duration::MAX,
            }))
        );
        assert_eq!(
            acquire(reply(b"*2\r\n:3\r\n:1500\r\n")),
            Ok(Acquired::Quarantined(Duration::from_millis(1_500)))
        );
        for garbage in [
            &b"+OK\r\n"[..],
            b"$-1\r\n",
            b":1\r\n",
            b"*0\r\n",
            b"*2\r\n:1\r\n$1\r\n0\r\n",
            b"*2\r\n:1\r\n$2\r\n-3\r\n",
            b"*2\r\n:1\r\n$20\r\n18446744073709551616\r\n",
            b"*3\r\n:1\r\n$1\r\n5\r\n:300\r\n",
            b"*1\r\n:1\r\n",
            b"*2\r\n:3\r\n$1\r\n5\r\n",
            b"*2\r\n:3\r\n:0\r\n",
            b"*2\r\n:3\r\n:-5\r\n",
            b"*3\r\n:3\r\n:5\r\n:5\r\n",
            b"*2\r\n$1\r\n1\r\n$1\r\n5\r\n",
            b"*2\r\n:1\r\n:5\r\n",
            b"*4\r\n:0\r\n$1\r\n5\r\n$2\r\nid\r\n:-2\r\n",
            b"*4\r\n:0\r\n$1\r\n5\r\n:1\r\n:10\r\n",
        ] {
            assert_eq!(acquire(reply(garbage)), Err(UNEXPECTED), "{garbage:?}");
        }
    }

    #[test]
    fn holder_and_flag_answers() {
        assert_eq!(holder_query(reply(b"*1\r\n:0\r\n")), Ok(None));
        assert_eq!(
            holder_query(reply(b"*4\r\n:1\r\n$1\r\n9\r\n$0\r\n\r\n:250\r\n")),
            Ok(Some(Holder {
                identity: Identity::EMPTY,
                fence: Fence(9),
                remaining: Duration::from_millis(250),
            }))
        );
        assert_eq!(
            holder_query(reply(b"*2\r\n:0\r\n$1\r\n9\r\n")),
            Err(UNEXPECTED)
        );
        assert_eq!(flag(reply(b":1\r\n")), Ok(true));
        assert_eq!(flag(reply(b":0\r\n")), Ok(false));
        for garbage in [&b":2\r\n"[..], b"+OK\r\n", b"*1\r\n:1\r\n", b"$1\r\n1\r\n"] {
            assert_eq!(flag(reply(garbage)), Err(UNEXPECTED), "{garbage:?}");
        }
    }

    #[test]
    fn identities_read_back_lossily() {
        let held = |identity: &[u8]| {
            let mut reply =
                std::format!("*4\r\n:0\r\n$1\r\n3\r\n${}\r\n", identity.len()).into_bytes();
            reply.extend_from_slice(identity);
            reply.extend_from_slice(b"\r\n:10\r\n");
            match acquire(parse(&reply).unwrap().0) {
                Ok(Acquired::HeldByAnother(holder)) => holder.identity,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(held(b"ok\xffno").as_str(), "ok");
        assert_eq!(held("h\u{e9}".as_bytes()).as_str(), "h\u{e9}");
    }
}
