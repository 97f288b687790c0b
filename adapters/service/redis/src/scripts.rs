//! The Lua scripts, and the parsing of what they answer.
//!
//! Every script validates everything it reads *before* it writes anything: a Redis
//! script that fails halfway keeps the writes it already made, so a garbage fence
//! counter must be refused before the lock key is set, never after.

use leasehold::{Duration, Fence};
use redis::Value;

use crate::error::{Op, ProtocolError};

/// `KEYS[1]` lock key, `KEYS[2]` fence counter; `ARGV[1]` owner token, `ARGV[2]` TTL in ms.
///
/// Answers `{1, fence, pttl}` for a new grant, `{2, fence, pttl}` when the token
/// already held the key (an earlier attempt whose answer was lost: re-granted with
/// its existing fence and a fresh TTL), `{0, pttl}` when someone else holds it.
/// The fence is returned as the counter's string (exact beyond Lua's 2^53).
pub const ACQUIRE: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  local fence = redis.call('GET', KEYS[2])
  if not fence or not string.match(fence, '^0*[1-9]%d*$') then
    return redis.error_reply('LEASEHOLD fence counter is missing or not a positive integer while the key is held')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, fence, redis.call('PTTL', KEYS[1])}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
local current = redis.call('GET', KEYS[2])
if current and not string.match(current, '^%d+$') then
  return redis.error_reply('LEASEHOLD fence counter is not a non-negative integer')
end
redis.call('INCR', KEYS[2])
local fence = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence, redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` lock key, `KEYS[2]` fence counter; `ARGV[1]` owner token, `ARGV[2]` TTL
/// in ms, `ARGV[3]` the holder's fence in decimal.
///
/// Answers `{1, pttl}` when extended, `{0}` when the token does not hold the key *with
/// that fence*. The counter is bumped only by grants of this key, so while the token's
/// own grant stands it still reads the holder's fence; any other value means a newer
/// grant (possibly to the same token: a late duplicate acquire after the key was
/// deleted) or an operator's `raise_fence`, and the old grant must not be extended.
pub const RENEW: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local fence = redis.call('GET', KEYS[2])
if not fence or (string.gsub(fence, '^0+', '')) ~= ARGV[3] then
  return {0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` lock key; `ARGV[1]` owner token. Answers 1 when deleted, 0 otherwise.
pub const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// `KEYS[1]` fence counter; `ARGV[1]` a decimal minimum. Raises the counter to at
/// least the minimum and answers the counter (as a string). Compares as decimal
/// strings, so it stays exact past 2^53.
pub const RAISE_FENCE: &str = r"
local function norm(s) local t = string.gsub(s, '^0+', '') if t == '' then return '0' end return t end
local current = redis.call('GET', KEYS[1])
if current and not string.match(current, '^%d+$') then
  return redis.error_reply('LEASEHOLD fence counter is not a non-negative integer')
end
local want = norm(ARGV[1])
if current then
  local have = norm(current)
  if string.len(have) > string.len(want) or (string.len(have) == string.len(want) and have >= want) then
    return have
  end
end
redis.call('SET', KEYS[1], want)
return want
";

/// What the acquire script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Granted {
        fence: Fence,
        ttl: Duration,
        regranted: bool,
    },
    HeldByAnother {
        remaining: Option<Duration>,
    },
}

pub(crate) fn parse_acquire(value: &Value) -> Result<AcquireReply, ProtocolError> {
    let op = Op::Acquire;
    let items = array(op, value)?;
    match (items.first().map(|v| int(op, v)).transpose()?, items.len()) {
        (Some(tag @ (1 | 2)), 3) => {
            let fence = fence(op, &items[1])?;
            let ttl = pttl(op, &items[2])?;
            Ok(AcquireReply::Granted {
                fence,
                ttl,
                regranted: tag == 2,
            })
        }
        (Some(0), 2) => {
            // -1 (no expiry: somebody set the key by hand) is still "held by another".
            let remaining = int(op, &items[1])?;
            Ok(AcquireReply::HeldByAnother {
                remaining: u64::try_from(remaining).ok().map(Duration::from_millis),
            })
        }
        _ => Err(ProtocolError::new(
            op,
            "an array [0|1|2, ...] of 2 or 3 items",
            value,
        )),
    }
}

pub(crate) fn parse_renew(value: &Value) -> Result<Option<Duration>, ProtocolError> {
    let op = Op::Renew;
    let items = array(op, value)?;
    match (items.first().map(|v| int(op, v)).transpose()?, items.len()) {
        (Some(1), 2) => Ok(Some(pttl(op, &items[1])?)),
        (Some(0), 1) => Ok(None),
        _ => Err(ProtocolError::new(op, "[1, pttl] or [0]", value)),
    }
}

pub(crate) fn parse_release(value: &Value) -> Result<bool, ProtocolError> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(ProtocolError::new(Op::Release, "the integer 0 or 1", value)),
    }
}

pub(crate) fn parse_raise_fence(value: &Value) -> Result<Fence, ProtocolError> {
    let op = Op::RaiseFence;
    match value {
        Value::BulkString(_) | Value::SimpleString(_) => {
            let raw = text(value).unwrap_or_default();
            raw.parse::<u64>()
                .map(Fence)
                .map_err(|_| ProtocolError::new(op, "a fence counter that fits in u64", value))
        }
        _ => Err(ProtocolError::new(
            op,
            "the fence counter as a string",
            value,
        )),
    }
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

/// A granted TTL: a positive number of milliseconds.
fn pttl(op: Op, value: &Value) -> Result<Duration, ProtocolError> {
    match value {
        Value::Int(ms) if *ms > 0 => Ok(Duration::from_millis(ms.unsigned_abs())),
        _ => Err(ProtocolError::new(
            op,
            "a positive TTL in milliseconds",
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

    #[test]
    fn acquire_replies() {
        let granted = Value::Array(vec![Value::Int(1), bulk("7"), Value::Int(300)]);
        assert_eq!(
            parse_acquire(&granted),
            Ok(AcquireReply::Granted {
                fence: Fence(7),
                ttl: Duration::from_millis(300),
                regranted: false
            })
        );
        let held = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            parse_acquire(&held),
            Ok(AcquireReply::HeldByAnother { remaining: None })
        );
        let huge = Value::Array(vec![
            Value::Int(2),
            bulk("18446744073709551615"),
            Value::Int(1),
        ]);
        assert!(matches!(
            parse_acquire(&huge),
            Ok(AcquireReply::Granted {
                fence: Fence(u64::MAX),
                regranted: true,
                ..
            })
        ));
    }

    #[test]
    fn acquire_garbage_is_a_protocol_error_never_a_grant() {
        let garbage = [
            Value::Okay,
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), bulk("0"), Value::Int(300)]),
            Value::Array(vec![Value::Int(1), bulk("-3"), Value::Int(300)]),
            Value::Array(vec![Value::Int(1), bulk("x"), Value::Int(300)]),
            Value::Array(vec![
                Value::Int(1),
                bulk("18446744073709551616"),
                Value::Int(1),
            ]),
            Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(-2)]),
            Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(0)]),
            Value::Array(vec![Value::Int(1), bulk("5")]),
            Value::Array(vec![Value::Int(3), bulk("5"), Value::Int(10)]),
            Value::Array(vec![bulk("1"), bulk("5"), Value::Int(10)]),
            Value::Array(vec![Value::Int(0)]),
            Value::Double(1.0),
        ];
        for value in garbage {
            let err = parse_acquire(&value).unwrap_err();
            assert_eq!(err.op, Op::Acquire);
        }
    }

    #[test]
    fn renew_and_release_replies() {
        assert_eq!(
            parse_renew(&Value::Array(vec![Value::Int(1), Value::Int(250)])),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(parse_renew(&Value::Array(vec![Value::Int(0)])), Ok(None));
        for garbage in [
            Value::Int(0),
            Value::Int(1),
            Value::Okay,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Int(10)]),
        ] {
            assert!(parse_renew(&garbage).is_err(), "{garbage:?}");
        }
        assert_eq!(parse_release(&Value::Int(1)), Ok(true));
        assert_eq!(parse_release(&Value::Int(0)), Ok(false));
        assert!(parse_release(&Value::Int(2)).is_err());
        assert!(parse_release(&Value::Okay).is_err());
    }
}
