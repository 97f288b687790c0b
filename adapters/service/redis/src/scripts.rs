//! The Lua scripts (from `leasehold-resp`, their one source), and the parsing of
//! what they answer.
//!
//! The lock key `{name}` holds `<token>\n<fence>\n<identity>`: the owner token (ASCII),
//! the grant's fence (decimal, no leading zeros) and the holder's identity (printable
//! text, possibly empty). One `GET` of the lock key therefore tells a script who holds
//! the key, with which fence and as whom, so renew and release never read the fence
//! counter `{name}:fence`.
//!
//! Every script validates everything it reads *before* it writes anything: a Redis
//! script that fails halfway keeps the writes it already made, so a garbage fence
//! counter must be refused before the lock key is set, never after. A value in the
//! lock key that is not in the format above (written by another program) makes
//! acquire and holder fail with a `LEASEHOLD` error reply, and makes renew and release
//! answer "not the owner"; a lock key that is not a string makes Redis itself answer
//! `WRONGTYPE`.

use leasehold::{Duration, Fence, Holder, Identity, OwnerToken};
use redis::{RedisWrite, ToRedisArgs, Value};

use leasehold_storage::FencedWrite;

use crate::error::{Op, ProtocolError};
use crate::keys::write_arg;

/// The scripts themselves live in `leasehold-resp` (no_std), the one source both
/// services load: the same text, so the same SHA1.
pub use leasehold_resp::scripts::{
    ACQUIRE, EPOCH_KEY, FENCED_WRITE, HOLDER, NEW_EPOCH, RAISE_FENCE, RELEASE, RENEW,
};

/// The start of the lock value that renew and release compare: `<token>\n<fence>\n`
/// (renew: this grant only), or `<token>\n` (release: this owner's term, whatever
/// the fence). Written straight into the command, without a string of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ValuePrefix {
    pub(crate) token: OwnerToken,
    pub(crate) fence: Option<Fence>,
}

impl ToRedisArgs for ValuePrefix {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Bytes, not `as_str`, which would check the 40 ASCII bytes for UTF-8 on
        // every renewal.
        let token = self.token.encode();
        match self.fence {
            Some(fence) => write_arg(
                out,
                &[
                    token.as_bytes(),
                    b"\n",
                    itoa::Buffer::new().format(fence.0).as_bytes(),
                    b"\n",
                ],
            ),
            None => write_arg(out, &[token.as_bytes(), b"\n"]),
        }
    }
}

/// What the acquire script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Granted {
        fence: Fence,
        regranted: bool,
    },
    HeldByAnother(Holder),
    /// The data set is in quarantine for this long.
    Quarantined(Duration),
}

pub(crate) fn parse_acquire(value: &Value) -> Result<AcquireReply, ProtocolError> {
    let op = Op::Acquire;
    let items = array(op, value)?;
    match (items.first().map(|v| int(op, v)).transpose()?, items) {
        (Some(tag @ (1 | 2)), [_, fence_value]) => Ok(AcquireReply::Granted {
            fence: fence(op, fence_value)?,
            regranted: tag == 2,
        }),
        (Some(0), [_, rest @ ..]) if rest.len() == 3 => {
            Ok(AcquireReply::HeldByAnother(holder(op, rest)?))
        }
        (Some(3), [_, ms]) => match int(op, ms)? {
            ms @ 1.. => Ok(AcquireReply::Quarantined(Duration::from_millis(
                ms.unsigned_abs(),
            ))),
            _ => Err(ProtocolError::new(op, "a positive quarantine in ms", value)),
        },
        _ => Err(ProtocolError::new(
            op,
            "[1|2, fence], [0, fence, identity, pttl] or [3, ms]",
            value,
        )),
    }
}

pub(crate) fn parse_holder(value: &Value) -> Result<Option<Holder>, ProtocolError> {
    let op = Op::Holder;
    let items = array(op, value)?;
    match (items.first().map(|v| int(op, v)).transpose()?, items) {
        (Some(0), [_]) => Ok(None),
        (Some(1), [_, rest @ ..]) if rest.len() == 3 => Ok(Some(holder(op, rest)?)),
        _ => Err(ProtocolError::new(
            op,
            "[0] or [1, fence, identity, pttl]",
            value,
        )),
    }
}

/// The answer of renew and release: 1 (done) or 0 (not the owner).
pub(crate) fn parse_flag(op: Op, value: &Value) -> Result<bool, ProtocolError> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(ProtocolError::new(op, "the integer 0 or 1", value)),
    }
}

pub(crate) fn parse_raise_fence(value: &Value) -> Result<Fence, ProtocolError> {
    let op = Op::RaiseFence;
    text(value)
        .and_then(|s| s.parse::<u64>().ok())
        .map(Fence)
        .ok_or_else(|| ProtocolError::new(op, "the fence counter as a decimal string", value))
}

/// What the fenced-write script answered for `presented`: `[1, presented]` (written)
/// or `[0, newest]` with `newest` newer than `presented` (stale).
pub(crate) fn parse_fenced_write(
    presented: Fence,
    value: &Value,
) -> Result<FencedWrite, ProtocolError> {
    let op = Op::FencedWrite;
    let expected = "[1, the presented fence] or [0, a newer fence]";
    let items = array(op, value)?;
    let (tag, fence_text) = match items {
        [tag, fence_value] => (int(op, tag)?, text(fence_value)),
        _ => return Err(ProtocolError::new(op, expected, value)),
    };
    let fence = fence_text.and_then(|s| s.parse::<u64>().ok()).map(Fence);
    match (tag, fence) {
        (1, Some(fence)) if fence == presented => Ok(FencedWrite::Written),
        (0, Some(newest)) if newest > presented => Ok(FencedWrite::Stale { presented, newest }),
        _ => Err(ProtocolError::new(op, expected, value)),
    }
}

/// `[fence, identity, pttl]` of a held key.
fn holder(op: Op, items: &[Value]) -> Result<Holder, ProtocolError> {
    let [fence_value, identity_value, pttl_value] = items else {
        return Err(ProtocolError::new(
            op,
            "fence, identity, pttl",
            &Value::Array(items.to_vec()),
        ));
    };
    let identity = match identity_value {
        Value::BulkString(bytes) => Identity::lossy(&String::from_utf8_lossy(bytes)),
        other => return Err(ProtocolError::new(op, "the identity as a string", other)),
    };
    let remaining = match int(op, pttl_value)? {
        // No expiry (someone ran PERSIST on it): held until deleted.
        -1 => Duration::MAX,
        ms if ms >= 0 => Duration::from_millis(ms.unsigned_abs()),
        _ => {
            return Err(ProtocolError::new(
                op,
                "a remaining TTL in ms (or -1)",
                pttl_value,
            ))
        }
    };
    Ok(Holder {
        identity,
        fence: fence(op, fence_value)?,
        remaining,
    })
}

fn array(op: Op, value: &Value) -> Result<&[Value], ProtocolError> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(ProtocolError::new(op, "an array", value)),
    }
}

fn int(op: Op, value: &Value) -> Result<i64, ProtocolError> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(ProtocolError::new(op, "an integer", value)),
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => core::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A fence: a decimal string of a positive integer that fits in `u64`.
fn fence(op: Op, value: &Value) -> Result<Fence, ProtocolError> {
    match text(value).and_then(|s| s.parse::<u64>().ok()) {
        Some(n) if n > 0 => Ok(Fence(n)),
        _ => Err(ProtocolError::new(
            op,
            "a positive fence (decimal string)",
            value,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// Renew compares `<token>\n<fence>\n`, release `<token>\n`: the start of the value
    /// the acquire script stores, byte for byte, written as one command argument.
    #[test]
    fn value_prefixes_are_the_start_of_the_stored_value() {
        let token = leasehold::Owner([7; 16]).token(leasehold::Term(3));
        let encoded = token.encode();
        let (mut written, mut expected) = (redis::Cmd::new(), redis::Cmd::new());
        for fence in [0, 7, 42, 1_000, u64::MAX] {
            written.arg(ValuePrefix {
                token,
                fence: Some(Fence(fence)),
            });
            expected.arg(format!("{}\n{fence}\n", encoded.as_str()));
        }
        written.arg(ValuePrefix { token, fence: None });
        expected.arg(format!("{}\n", encoded.as_str()));
        assert_eq!(written.get_packed_command(), expected.get_packed_command());
    }

    #[test]
    fn acquire_replies() {
        let granted = Value::Array(vec![Value::Int(1), bulk("7")]);
        assert_eq!(
            parse_acquire(&granted),
            Ok(AcquireReply::Granted {
                fence: Fence(7),
                regranted: false
            })
        );
        let held = Value::Array(vec![
            Value::Int(0),
            bulk("3"),
            bulk("host-1"),
            Value::Int(-1),
        ]);
        assert_eq!(
            parse_acquire(&held),
            Ok(AcquireReply::HeldByAnother(Holder {
                identity: Identity::new("host-1").unwrap(),
                fence: Fence(3),
                remaining: Duration::MAX,
            }))
        );
        let quarantined = Value::Array(vec![Value::Int(3), Value::Int(1_500)]);
        assert_eq!(
            parse_acquire(&quarantined),
            Ok(AcquireReply::Quarantined(Duration::from_millis(1_500)))
        );
        let huge = Value::Array(vec![Value::Int(2), bulk("18446744073709551615")]);
        assert_eq!(
            parse_acquire(&huge),
            Ok(AcquireReply::Granted {
                fence: Fence(u64::MAX),
                regranted: true
            })
        );
    }

    #[test]
    fn acquire_garbage_is_a_protocol_error_never_a_grant() {
        let garbage = [
            Value::Okay,
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), bulk("0")]),
            Value::Array(vec![Value::Int(1), bulk("-3")]),
            Value::Array(vec![Value::Int(1), bulk("x")]),
            Value::Array(vec![Value::Int(1), bulk("18446744073709551616")]),
            Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(300)]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(3), bulk("5")]),
            Value::Array(vec![Value::Int(3), Value::Int(0)]),
            Value::Array(vec![Value::Int(3), Value::Int(-1)]),
            Value::Array(vec![Value::Int(3), Value::Int(5), Value::Int(5)]),
            Value::Array(vec![bulk("1"), bulk("5")]),
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Int(0), bulk("5"), bulk("id"), Value::Int(-2)]),
            Value::Array(vec![
                Value::Int(0),
                bulk("5"),
                Value::Int(1),
                Value::Int(10),
            ]),
            Value::Double(1.0),
        ];
        for value in garbage {
            let err = parse_acquire(&value).unwrap_err();
            assert_eq!(err.op, Op::Acquire, "{value:?}");
        }
    }

    #[test]
    fn holder_replies() {
        assert_eq!(parse_holder(&Value::Array(vec![Value::Int(0)])), Ok(None));
        let held = Value::Array(vec![Value::Int(1), bulk("9"), bulk(""), Value::Int(250)]);
        assert_eq!(
            parse_holder(&held),
            Ok(Some(Holder {
                identity: Identity::EMPTY,
                fence: Fence(9),
                remaining: Duration::from_millis(250),
            }))
        );
        for garbage in [
            Value::Int(0),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(0), bulk("9")]),
            Value::Array(vec![Value::Int(1), bulk("0"), bulk(""), Value::Int(1)]),
        ] {
            assert!(parse_holder(&garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn fenced_write_replies_are_checked_against_the_presented_fence() {
        let written = Value::Array(vec![Value::Int(1), bulk("18446744073709551615")]);
        assert_eq!(
            parse_fenced_write(Fence(u64::MAX), &written),
            Ok(FencedWrite::Written)
        );
        let stale = Value::Array(vec![Value::Int(0), bulk("9")]);
        assert_eq!(
            parse_fenced_write(Fence(7), &stale),
            Ok(FencedWrite::Stale {
                presented: Fence(7),
                newest: Fence(9)
            })
        );
        for garbage in [
            Value::Array(vec![Value::Int(1), bulk("8")]),
            Value::Array(vec![Value::Int(0), bulk("7")]),
            Value::Array(vec![Value::Int(0), bulk("5")]),
            Value::Array(vec![Value::Int(0), bulk("18446744073709551616")]),
            Value::Array(vec![Value::Int(2), bulk("7")]),
            Value::Array(vec![Value::Int(1)]),
            Value::Int(1),
        ] {
            let err = parse_fenced_write(Fence(7), &garbage).unwrap_err();
            assert_eq!(err.op, Op::FencedWrite, "{garbage:?}");
        }
    }

    #[test]
    fn flag_replies() {
        assert_eq!(parse_flag(Op::Renew, &Value::Int(1)), Ok(true));
        assert_eq!(parse_flag(Op::Release, &Value::Int(0)), Ok(false));
        for garbage in [
            Value::Int(2),
            Value::Okay,
            Value::Array(vec![Value::Int(1)]),
        ] {
            assert!(parse_flag(Op::Renew, &garbage).is_err(), "{garbage:?}");
        }
    }
}
