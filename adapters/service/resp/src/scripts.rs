//! The Lua scripts, the one source of them: `leasehold-redis` loads these same texts.
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
//!
//! Each script has its SHA1 next to it (the name `EVALSHA` calls it by), as hex: a
//! test checks every one against the script's text, so a change of a script without
//! its SHA fails the build's tests, never a request.
//!
//! The four scripts a lease sends ([`ACQUIRE`], [`RENEW`], [`RELEASE`], [`HOLDER`]) are
//! written compactly (one statement a line, no indentation, one-letter locals): their
//! text sits in a microcontroller's flash, kept there to load them again after
//! `NOSCRIPT`.

use core::num::NonZeroU16;

use leasehold::Duration;

/// The Lua pattern of a lock value: captures token, fence and identity. A macro, so
/// that the one pattern is spliced into each script's source at compile time.
macro_rules! lock_value_pattern {
    () => {
        r"'^([^\n]+)\n([1-9]%d*)\n([^\n]*)$'"
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` fence counter, `KEYS[3]` the data set's epoch marker
/// ([`EPOCH_KEY`]); `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` the holder's
/// identity, `ARGV[4]` the quarantine in ms (the longest TTL any client of this Redis
/// asks for).
///
/// Answers `{1, fence}` for a new grant (the counter raised, then `SET` of the lock
/// key with `PX`), `{2, fence}` when the token already held the key (an earlier
/// attempt whose answer was lost: same fence, expiry reset with `PEXPIRE`),
/// `{0, fence, identity, pttl}` when another token holds it, and `{3, ms}` while the
/// data set is in quarantine: nothing is granted for `ms` more. Fences travel as
/// decimal strings, exact beyond Lua's 2^53.
///
/// **Quarantine.** A Redis that lost grants which are still alive — restarted without
/// persistence or from an older snapshot or a lossy AOF, a replica promoted before the
/// latest grants reached it, a data set flushed — must grant no free key until every
/// grant it may have forgotten has expired, or a second client would hold a key whose
/// first holder still believes in it. The marker `KEYS[3]` holds `<run_id> <end>`: the
/// `run_id` of the Redis process that last started an epoch (`INFO server`: every
/// start of a process, and every replica, has its own) and when that epoch's
/// quarantine ends (ms on Redis's clock, `TIME`). A grant of a free key first reads
/// it: missing (a new or emptied data set), written by another process (a restart, a
/// promoted replica) or unreadable, it starts a new epoch whose quarantine ends
/// `ARGV[4]` ms from now, and answers `{3, ARGV[4]}`; until the end, `{3, ms left}`.
/// A key held by a live grant needs no quarantine (its holder renews it, or it
/// expires), so renewals, re-grants to the same token and "held by another" answers
/// never read the marker.
///
/// A new grant's fence is the larger of the counter + 1 (`INCR`) and Redis's clock in
/// µs since the Unix epoch (`TIME`, about 1.8 × 10^15 in 2027): a Redis that lost the
/// counter still hands out fences above every earlier one, as long as its wall clock
/// has not gone back by more than the time since that grant. The counter decides
/// while it is ahead of the clock, so fences strictly increase whatever the clock
/// does. A write may follow `TIME` and `INFO` because Redis replicates a script's
/// effects, not the script (the default since Redis 5, the only way since 7; Redis 4
/// and older are not supported). Errors (short: the text sits in a microcontroller's
/// flash, and the clients explain the code): `LEASEHOLD` (the lock key or the counter
/// holds a value leasehold did not write), `LEASEHOLD_EXHAUSTED` (the counter is at
/// 2^63 - 1, where `INCR` stops).
pub const ACQUIRE: &str = concat!(
    r"local R,M=redis.call,string.match
local v=R('GET',KEYS[1])
if v then
local t,f,i=M(v,",
    lock_value_pattern!(),
    r")
if not t then
return {err='LEASEHOLD not a lease value'}
end
if t==ARGV[1] then
R('PEXPIRE',KEYS[1],ARGV[2])
return {2,f}
end
return {0,f,i,R('PTTL',KEYS[1])}
end
local c=R('GET',KEYS[2])
if c and c~='0' and not M(c,'^[1-9]%d*$') then
return {err='LEASEHOLD bad fence counter'}
end
local t=R('TIME')
local n=t[1]*1000+math.floor(t[2]/1000)
local r=M(R('INFO','server'),'run_id:(%x+)') or ''
local e=R('GET',KEYS[3])
local q=e and M(e,'^'..r..' (%d+)$')
if not q then
q=n+ARGV[4]
R('SET',KEYS[3],r..' '..q)
end
if q-n>0 then
return {3,q-n}
end
local m=t[1]..string.sub('00000'..t[2],-6)
if not c or #c<#m or (#c==#m and c<m) then
R('SET',KEYS[2],m)
elseif #c>19 or (#c==19 and c>='9223372036854775807') then
return {err='LEASEHOLD_EXHAUSTED fence counter at 2^63-1'}
else
R('INCR',KEYS[2])
end
local f=R('GET',KEYS[2])
R('SET',KEYS[1],ARGV[1]..'\n'..f..'\n'..ARGV[3],'PX',ARGV[2])
return {1,f}"
);

/// `KEYS[1]` an epoch marker. Marks the data set as new: writes `<run_id> 0`, an epoch
/// of this Redis process whose quarantine is over, so the next grant is immediate.
/// For a data set that never held a grant (a new deployment); after a loss of state
/// it would let a second holder in. Answers `OK`.
pub const NEW_EPOCH: &str = r"return redis.call('SET',KEYS[1],(string.match(redis.call('INFO','server'),'run_id:(%x+)') or '')..' 0')";

/// The epoch marker of a standalone Redis: one key for the whole data set (see
/// [`ACQUIRE`]). No lock's keys are named `{…}:epoch`, so it is never one of them. (On Redis Cluster, `leasehold-redis` keeps one
/// marker per slot, in the slot of the lock it guards.)
pub const EPOCH_KEY: &str = "{leasehold}:epoch";

/// `KEYS[1]` lock key; `ARGV[1]` `<token>\n<fence>\n` (the start of the value of the
/// grant being renewed), `ARGV[2]` TTL in ms.
///
/// Answers 1 after `PEXPIRE` when the lock key's value starts with `ARGV[1]` (this
/// token, this fence), 0 otherwise: expired, deleted, taken, overwritten, or a newer
/// grant to the same token (a late duplicate acquire after the key was deleted
/// re-creates it with a new fence). Never creates the key.
pub const RENEW: &str = r"local v=redis.call('GET',KEYS[1])
if v and string.sub(v,1,#ARGV[1])==ARGV[1] then
redis.call('PEXPIRE',KEYS[1],ARGV[2])
return 1
end
return 0";

/// `KEYS[1]` lock key; `ARGV[1]` `<token>\n`. Answers 1 after `DEL` when the lock key
/// is held by that token (whatever the fence), 0 otherwise.
pub const RELEASE: &str = r"local v=redis.call('GET',KEYS[1])
if v and string.sub(v,1,#ARGV[1])==ARGV[1] then
redis.call('DEL',KEYS[1])
return 1
end
return 0";

/// `KEYS[1]` lock key. Answers `{0}` when free, `{1, fence, identity, pttl}` when
/// held. Writes nothing. Error `LEASEHOLD` when the key holds a value leasehold did
/// not write.
pub const HOLDER: &str = concat!(
    r"local v=redis.call('GET',KEYS[1])
if not v then
return {0}
end
local t,f,i=string.match(v,",
    lock_value_pattern!(),
    r")
if not t then
return {err='LEASEHOLD not a lease value'}
end
return {1,f,i,redis.call('PTTL',KEYS[1])}"
);

/// `KEYS[1]` fence counter; `ARGV[1]` a decimal minimum (no leading zeros). Raises the
/// counter to at least the minimum and answers the counter (as a string). Compares
/// as decimal strings, so it stays exact past 2^53. It never touches the lock key: a
/// grant that is held keeps its fence; the *next* grant's fence is above the counter.
pub const RAISE_FENCE: &str = r"
local current = redis.call('GET', KEYS[1])
if current and current ~= '0' and not string.match(current, '^[1-9]%d*$') then
  return redis.error_reply('LEASEHOLD the fence counter is not a non-negative integer')
end
local want = ARGV[1]
if current then
  if string.len(current) > string.len(want) or (string.len(current) == string.len(want) and current >= want) then
    return current
  end
end
redis.call('SET', KEYS[1], want)
return want
";

/// Fenced storage in Redis: a write admitted only with a fence at least as new as
/// the newest admitted for the resource, atomically with the write (the
/// [`FenceGate`](leasehold::FenceGate) rule, inside Redis).
///
/// `KEYS[1]` the data key, `KEYS[2]` the newest admitted fence (both with the same
/// hash tag, so one slot); `ARGV[1]` the presented fence (decimal, no leading zeros),
/// `ARGV[2]` the value. When `ARGV[1]` is at least the newest fence (or none was
/// admitted yet): `SET` of the value, then of the fence, and answers `{1, fence}`;
/// an equal fence is admitted (the same holder writes again). Otherwise writes
/// nothing and answers `{0, newest}`. Fences are compared as decimal strings (by
/// length, then lexically), so they stay exact past Lua's 2^53. Error `LEASEHOLD`
/// when the presented fence or the stored newest fence is not a non-negative
/// integer, before anything is written.
pub const FENCED_WRITE: &str = r"
local presented = ARGV[1]
if presented ~= '0' and not string.match(presented, '^[1-9]%d*$') then
  return redis.error_reply('LEASEHOLD the presented fence is not a non-negative integer')
end
local newest = redis.call('GET', KEYS[2])
if newest then
  if newest ~= '0' and not string.match(newest, '^[1-9]%d*$') then
    return redis.error_reply('LEASEHOLD the newest-fence key is not a non-negative integer')
  end
  local have, want = string.len(newest), string.len(presented)
  if have > want or (have == want and newest > presented) then
    return {0, newest}
  end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], presented)
return {1, presented}
";

/// The Lua pattern of a lock value that [`ACQUIRE`] and [`HOLDER`] share, as spliced
/// into both.
pub const LOCK_VALUE_PATTERN: &str = lock_value_pattern!();

/// A script's source and SHA1, as a request sends them.
pub(crate) type Script = (&'static str, &'static str);
/// [`ACQUIRE`] and its SHA1.
pub(crate) const ACQUIRE_PAIR: Script = (ACQUIRE, ACQUIRE_SHA);
/// [`RENEW`] and its SHA1.
pub(crate) const RENEW_PAIR: Script = (RENEW, RENEW_SHA);
/// [`RELEASE`] and its SHA1.
pub(crate) const RELEASE_PAIR: Script = (RELEASE, RELEASE_SHA);
/// [`HOLDER`] and its SHA1.
pub(crate) const HOLDER_PAIR: Script = (HOLDER, HOLDER_SHA);

/// SHA1 of [`ACQUIRE`], lowercase hex: what `EVALSHA` names it by.
pub const ACQUIRE_SHA: &str = "c4fb2f2c5c310b0aced964166eb30636c1cb0bf7";
/// SHA1 of [`RENEW`].
pub const RENEW_SHA: &str = "50643318fe78c93e1b31fd505c872444956857d2";
/// SHA1 of [`RELEASE`].
pub const RELEASE_SHA: &str = "66900672967693bebb44013a62adfe6af188f83b";
/// SHA1 of [`HOLDER`].
pub const HOLDER_SHA: &str = "9b09ee8c626a6a55053577a27045e32b6a7ca042";
/// SHA1 of [`RAISE_FENCE`].
pub const RAISE_FENCE_SHA: &str = "0b0aa065ef72ede5bc6c2c7c39824e8078d61a8c";
/// SHA1 of [`FENCED_WRITE`].
pub const FENCED_WRITE_SHA: &str = "158c43cccf4137d8a4d36be8541122d3d5b313b7";

/// A TTL as `PX`/`PEXPIRE` take it: whole milliseconds, rounded up (a renewal never
/// applies less than asked), at least 1 (Redis refuses 0); also the TTL applied. The
/// one place of this rule for `leasehold-resp` and `leasehold-redis`.
pub fn ttl_ms(ttl: Duration) -> (u64, Duration) {
    const THOUSAND: NonZeroU16 = match NonZeroU16::new(1_000) {
        Some(thousand) => thousand,
        None => NonZeroU16::MIN,
    };
    let (ms, micros) = leasehold::div_rem_u16(ttl.as_micros(), THOUSAND);
    // `ms <= u64::MAX / 1_000`: adding one cannot overflow.
    let ms = ms.wrapping_add(u64::from(micros != 0)).max(1);
    (ms, Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds_and_never_below_one() {
        assert_eq!(ttl_ms(Duration::from_millis(300)).0, 300);
        assert_eq!(
            ttl_ms(Duration::from_micros(300_001)).1,
            Duration::from_millis(301)
        );
        assert_eq!(ttl_ms(Duration::ZERO).1, Duration::from_millis(1));
        assert_eq!(ttl_ms(Duration::MAX).0, u64::MAX / 1_000 + 1);
    }
    use std::string::ToString;
    use std::vec::Vec;
    use std::{assert, format};

    #[test]
    fn each_sha_is_the_sha1_of_its_script() {
        let mut wrong = Vec::new();
        for (name, script, sha) in [
            ("ACQUIRE", ACQUIRE, ACQUIRE_SHA),
            ("RENEW", RENEW, RENEW_SHA),
            ("RELEASE", RELEASE, RELEASE_SHA),
            ("HOLDER", HOLDER, HOLDER_SHA),
            ("RAISE_FENCE", RAISE_FENCE, RAISE_FENCE_SHA),
            ("FENCED_WRITE", FENCED_WRITE, FENCED_WRITE_SHA),
        ] {
            let actual = sha1_smol::Sha1::from(script).digest().to_string();
            if actual != sha {
                wrong.push(format!("{name}_SHA = {actual:?}"));
            }
        }
        assert!(wrong.is_empty(), "stale SHAs:\n{}", wrong.join("\n"));
    }

    #[test]
    fn the_value_pattern_is_spliced_into_both_scripts() {
        for script in [ACQUIRE, HOLDER] {
            assert!(script.contains(LOCK_VALUE_PATTERN), "{script}");
        }
    }
}
