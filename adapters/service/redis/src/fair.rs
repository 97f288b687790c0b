//! First-in, first-out waiting ([`RedisLockService::with_fair`](crate::RedisLockService::with_fair)):
//! the fair acquire script, the queue read, and the parsing of their answers.
//!
//! These scripts live here, not in `leasehold-resp`: the firmware does not queue (its
//! flash has no room for them). The fair acquire runs [`ACQUIRE`](crate::lua::ACQUIRE)
//! itself, unchanged, as a local function: the grant, the fence and the quarantine
//! have one source.
//!
//! The queue of lock `name` is three keys in `{name}`'s slot ([`QueueKeys`](crate::QueueKeys)):
//! `{name}:queue`, a sorted set (member: the owner token, score: its arrival number),
//! `{name}:waiters`, a hash (owner token → `<deadline ms>\n<identity>`, the deadline on
//! Redis's clock), and `{name}:arrivals`, the arrival counter. Each write gives all
//! three the same `PEXPIRE`, at least the TTL just asked, so an abandoned queue
//! vanishes.

use std::sync::LazyLock;

use leasehold::{Duration, Holder, Identity};
use redis::Value;

use crate::error::{Op, ProtocolError};
use crate::scripts::{parse_acquire, AcquireReply};

/// The fair acquire. `KEYS[1..3]` and `ARGV[1..4]` as [`ACQUIRE`](crate::lua::ACQUIRE)
/// takes them (lock key, fence counter, epoch marker; token, TTL in ms, identity,
/// quarantine in ms), then `KEYS[4]` `{name}:queue`, `KEYS[5]` `{name}:waiters`,
/// `KEYS[6]` `{name}:arrivals`.
///
/// It reads and checks the queue first (wrong types make Redis answer `WRONGTYPE`, a
/// queue whose keys disagree or hold what this script never writes makes it answer
/// `LEASEHOLD bad queue`, both before anything is written), then:
///
/// * the key is held (by anyone), or free and the queue has no live place, or free
///   and this token's place is the first live one: `ACQUIRE` runs and answers as it
///   does (`{1, fence}`, `{2, fence}`, `{0, fence, identity, pttl}`, `{3, ms}`);
/// * otherwise (free, another contender's turn) the quarantine comes first, as in
///   `ACQUIRE`: an epoch marker that is missing or another process's makes `ACQUIRE`
///   run (it can only start the epoch and answer `{3, ms}`: it grants no key then), a
///   quarantine under way answers `{3, ms left}`; past it, `{4, identity, ms}`, the
///   identity in the first live place and how long that place lasts.
///
/// Then the places ahead of the first live one whose deadline passed are removed; a
/// grant (`1` or `2`) removes this token's place; any other answer keeps it (or adds
/// it at the back, with the next arrival number, when it had none or its deadline
/// had passed) with the deadline now + TTL asked. Times are Redis's (`TIME`).
pub static FAIR_ACQUIRE: LazyLock<String> =
    LazyLock::new(|| ["local function a()\n", crate::scripts::ACQUIRE, FAIR_QUEUE].concat());

/// SHA1 of [`FAIR_ACQUIRE`], lowercase hex: what `EVALSHA` names it by.
pub const FAIR_ACQUIRE_SHA: &str = "13feb1a2b93a53cc45da28c42ec222a0e74f3336";

/// The queue part of [`FAIR_ACQUIRE`], after `ACQUIRE` as the body of `a()`.
const FAIR_QUEUE: &str = r"
end
local R,M,Q,W,t=redis.call,string.match,KEYS[4],KEYS[5],ARGV[1]
local B={err='LEASEHOLD bad queue'}
local v=R('GET',KEYS[1])
local T=R('TIME')
local n=T[1]*1000+math.floor(T[2]/1000)
local c=R('GET',KEYS[6])
if c and (#c>15 or not M(c,'^[1-9]%d*$')) then return B end
if R('ZCARD',Q)~=R('HLEN',W) then return B end
local l=R('ZRANGE',Q,-1,-1,'WITHSCORES')[2]
if l and (not M(l,'^[1-9]%d*$') or not c or tonumber(l)>tonumber(c)) then return B end
local function P(m)
local d,i=M(R('HGET',W,m) or '','^([1-9]%d*)\n([^\n]*)$')
return tonumber(d),i
end
local o,od=R('ZSCORE',Q,t)
if o then
od=P(t)
if not od then return B end
end
local x,h,hd,hi,k={},nil,nil,nil,0
if not v then
while true do
local m=R('ZRANGE',Q,k,k)[1]
if not m then break end
local d,i=P(m)
if not d then return B end
if d>n then h,hd,hi=m,d,i break end
x[#x+1]=m
k=k+1
end
end
local r
if v or not h or h==t then
r=a()
if r.err then return r end
else
local I=M(R('INFO','server'),'run_id:(%x+)') or ''
local e=R('GET',KEYS[3])
local q=e and M(e,'^'..I..' (%d+)$')
if not q then
r=a()
if r.err then return r end
elseif q-n>0 then
r={3,q-n}
else
r={4,hi,hd-n}
end
end
for _,m in ipairs(x) do
R('ZREM',Q,m)
R('HDEL',W,m)
end
if r[1]==1 or r[1]==2 then
if o then
R('ZREM',Q,t)
R('HDEL',W,t)
end
return r
end
if not o or od<=n then
R('ZADD',Q,R('INCR',KEYS[6]),t)
end
R('HSET',W,t,(n+ARGV[2])..'\n'..ARGV[3])
local p=math.max(R('PTTL',Q),tonumber(ARGV[2]))
R('PEXPIRE',Q,p)
R('PEXPIRE',W,p)
R('PEXPIRE',KEYS[6],p)
return r";

/// The queue of a lock as [`waiting`](crate::RedisLockService::waiting) reads it:
/// `KEYS[1]` `{name}:queue`, `KEYS[2]` `{name}:waiters` (`KEYS[3]`, the arrival
/// counter, is not read). Answers the identities of the
/// live places (deadline after Redis's `TIME`), in arrival order. Writes nothing.
/// Error `LEASEHOLD bad queue` when the keys disagree or hold what
/// [`FAIR_ACQUIRE`] never writes.
pub const WAITING: &str = r"local R,M=redis.call,string.match
local T=R('TIME')
local n=T[1]*1000+math.floor(T[2]/1000)
local z=R('ZRANGE',KEYS[1],0,-1)
if #z~=R('HLEN',KEYS[2]) then return {err='LEASEHOLD bad queue'} end
local o={}
for _,m in ipairs(z) do
local d,i=M(R('HGET',KEYS[2],m) or '','^([1-9]%d*)\n([^\n]*)$')
if not d then return {err='LEASEHOLD bad queue'} end
if tonumber(d)>n then o[#o+1]=i end
end
return o";

/// SHA1 of [`WAITING`].
pub const WAITING_SHA: &str = "69e89ea91ebc3763574ffa07f2951464e3805d13";

/// What the fair acquire answered: [`parse_acquire`]'s answers, or `[4, identity, ms]`
/// (another contender's turn: [`Holder::turn_of`]).
pub(crate) fn parse_fair_acquire(value: &Value) -> Result<AcquireReply, ProtocolError> {
    let op = Op::Acquire;
    match value {
        Value::Array(items) if items.first() == Some(&Value::Int(4)) => match items.as_slice() {
            [_, Value::BulkString(identity), Value::Int(ms @ 1..)] => {
                Ok(AcquireReply::HeldByAnother(Holder::turn_of(
                    Identity::lossy_utf8(identity),
                    Duration::from_millis(ms.unsigned_abs()),
                )))
            }
            _ => Err(ProtocolError::new(
                op,
                "[4, identity, a positive ms] for another contender's turn",
                value,
            )),
        },
        _ => parse_acquire(value),
    }
}

/// The identities [`WAITING`] answered, in order.
pub(crate) fn parse_waiting(value: &Value) -> Result<Vec<Identity>, ProtocolError> {
    let garbage = || ProtocolError::new(Op::Waiting, "an array of identities", value);
    match value {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::BulkString(bytes) => Ok(Identity::lossy_utf8(bytes)),
                _ => Err(garbage()),
            })
            .collect(),
        _ => Err(garbage()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::Fence;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// As `leasehold-resp` checks its scripts': a change of a script without its SHA
    /// fails here, never a request.
    #[test]
    fn each_fair_sha_is_the_sha1_of_its_script() {
        for (name, script, sha) in [
            ("FAIR_ACQUIRE", FAIR_ACQUIRE.as_str(), FAIR_ACQUIRE_SHA),
            ("WAITING", WAITING, WAITING_SHA),
        ] {
            let actual = redis::Script::new(script).get_hash().to_owned();
            assert_eq!(actual, sha, "stale SHA: {name}_SHA = {actual:?}");
        }
    }

    /// The fair acquire runs the one `ACQUIRE`, whole, as a function.
    #[test]
    fn the_fair_acquire_runs_the_acquire_script_unchanged() {
        assert!(FAIR_ACQUIRE.starts_with("local function a()\n"));
        assert!(FAIR_ACQUIRE.contains(crate::scripts::ACQUIRE));
    }

    #[test]
    fn fair_acquire_replies() {
        let turn = Value::Array(vec![Value::Int(4), bulk("host-2"), Value::Int(900)]);
        assert_eq!(
            parse_fair_acquire(&turn),
            Ok(AcquireReply::HeldByAnother(Holder::turn_of(
                Identity::new("host-2").unwrap(),
                Duration::from_millis(900)
            )))
        );
        let granted = Value::Array(vec![Value::Int(1), bulk("7")]);
        assert_eq!(
            parse_fair_acquire(&granted),
            Ok(AcquireReply::Granted {
                fence: Fence(7),
                regranted: false
            })
        );
    }

    #[test]
    fn fair_acquire_garbage_is_a_protocol_error_never_a_grant() {
        for garbage in [
            Value::Array(vec![Value::Int(4)]),
            Value::Array(vec![Value::Int(4), bulk("id")]),
            Value::Array(vec![Value::Int(4), bulk("id"), Value::Int(0)]),
            Value::Array(vec![Value::Int(4), bulk("id"), Value::Int(-5)]),
            Value::Array(vec![Value::Int(4), Value::Int(1), Value::Int(5)]),
            Value::Array(vec![Value::Int(4), bulk("id"), bulk("5")]),
            Value::Array(vec![
                Value::Int(4),
                bulk("id"),
                Value::Int(5),
                Value::Int(5),
            ]),
            Value::Array(vec![Value::Int(5), bulk("id"), Value::Int(5)]),
            Value::Array(vec![Value::Int(1), bulk("0")]),
            Value::Nil,
        ] {
            let err = parse_fair_acquire(&garbage).unwrap_err();
            assert_eq!(err.op, Op::Acquire, "{garbage:?}");
        }
    }

    #[test]
    fn waiting_replies() {
        let queue = Value::Array(vec![bulk("a"), bulk(""), bulk("c")]);
        assert_eq!(
            parse_waiting(&queue),
            Ok(vec![
                Identity::new("a").unwrap(),
                Identity::EMPTY,
                Identity::new("c").unwrap()
            ])
        );
        assert_eq!(parse_waiting(&Value::Array(vec![])), Ok(vec![]));
        for garbage in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![bulk("a"), Value::Nil]),
        ] {
            let err = parse_waiting(&garbage).unwrap_err();
            assert_eq!(err.op, Op::Waiting, "{garbage:?}");
        }
    }
}
