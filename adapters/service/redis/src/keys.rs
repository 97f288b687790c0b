//! Key names: `{name}` and `{name}:fence` for a lock, `{name}:data` and
//! `{name}:data:fence` for fenced storage; one hash tag each, one cluster slot.

use std::io::Write;

use leasehold::KeyError;
use redis::{RedisWrite, ToRedisArgs};

/// The two Redis keys of lock `name`: the lock itself, `{name}`, holding
/// `<owner token>\n<fence>\n<identity>` with a TTL, and its fence counter,
/// `{name}:fence`, without a TTL.
///
/// Both keys carry the hash tag `{name}`, so Redis Cluster puts them in the same
/// slot and one script can touch both.
///
/// ```
/// let keys = leasehold_redis::Keys::new("orders").unwrap();
/// assert_eq!(keys.lock, "{orders}");
/// assert_eq!(keys.fence, "{orders}:fence");
/// assert!(leasehold_redis::Keys::new("a{b}").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Keys {
    /// `{name}`: holds the grant, expires with the lease.
    pub lock: String,
    /// `{name}:fence`: the fence counter, never expires.
    pub fence: String,
}

impl Keys {
    /// The keys of lock `name`, if `name` follows the key rules
    /// ([`leasehold::check_key`]): 1 to 256 bytes, no control characters, no braces
    /// (a brace would move the hash tag, and the two keys could land in different
    /// slots).
    pub fn new(name: &str) -> Result<Keys, KeyError> {
        leasehold::check_key(name)?;
        Ok(Keys {
            lock: lock_key(name).concat(),
            fence: fence_key(name).concat(),
        })
    }

    /// The Redis Cluster slot both keys live in (feature `cluster`).
    ///
    /// ```
    /// let keys = leasehold_redis::Keys::new("orders").unwrap();
    /// assert_eq!(keys.slot(), 105); // redis-cli CLUSTER KEYSLOT "{orders}"
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn slot(&self) -> u16 {
        slot_of(self.lock.as_bytes())
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (between the first `{`
/// and the next `}`, if not empty) or of the whole key, modulo 16,384.
#[cfg(feature = "cluster")]
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let close = rest.iter().position(|&b| b == b'}')?;
            rest.get(..close).filter(|tag| !tag.is_empty())
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % 16_384
}

/// The two Redis keys of fenced resource `name` (see
/// [`RedisLockService::fenced_write`](crate::RedisLockService::fenced_write)): the
/// data, `{name}:data`, and the newest fence admitted for it, `{name}:data:fence`.
///
/// One hash tag, so one slot: the script that compares the fence and writes the data
/// touches both. The names differ from a lock's keys, so a lock and the resource it
/// protects may share a name.
///
/// ```
/// let keys = leasehold_redis::FencedKeys::new("orders").unwrap();
/// assert_eq!(keys.data, "{orders}:data");
/// assert_eq!(keys.fence, "{orders}:data:fence");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FencedKeys {
    /// `{name}:data`: the value, as written.
    pub data: String,
    /// `{name}:data:fence`: the newest fence admitted, decimal.
    pub fence: String,
}

impl FencedKeys {
    /// The keys of fenced resource `name`, if `name` follows the key rules
    /// ([`leasehold::check_key`]), as for a lock.
    pub fn new(name: &str) -> Result<FencedKeys, KeyError> {
        leasehold::check_key(name)?;
        Ok(FencedKeys {
            data: format!("{{{name}}}:data"),
            fence: format!("{{{name}}}:data:fence"),
        })
    }
}

/// The queue of lock `name` on a fair service
/// ([`RedisLockService::with_fair`](crate::RedisLockService::with_fair)): who waits,
/// in which order, until when. Three keys with the lock's hash tag, so in its slot;
/// each expires once no place in it is live. Names that no lock and no fenced
/// resource uses.
///
/// ```
/// let keys = leasehold_redis::QueueKeys::new("orders").unwrap();
/// assert_eq!(keys.queue, "{orders}:queue");
/// assert_eq!(keys.waiters, "{orders}:waiters");
/// assert_eq!(keys.arrivals, "{orders}:arrivals");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueKeys {
    /// `{name}:queue`: a sorted set, member an owner token, score its arrival number.
    pub queue: String,
    /// `{name}:waiters`: a hash, owner token → `<deadline ms>\n<identity>` (the
    /// deadline on Redis's clock).
    pub waiters: String,
    /// `{name}:arrivals`: the arrival counter.
    pub arrivals: String,
}

impl QueueKeys {
    /// The queue keys of lock `name`, if `name` follows the key rules
    /// ([`leasehold::check_key`]), as for a lock.
    pub fn new(name: &str) -> Result<QueueKeys, KeyError> {
        leasehold::check_key(name)?;
        let [queue, waiters, arrivals] =
            QUEUE_SUFFIXES.map(|suffix| ["{", name, "}", suffix].concat());
        Ok(QueueKeys {
            queue,
            waiters,
            arrivals,
        })
    }
}

/// Where a lock's epoch marker lives (see [`lua::ACQUIRE`](crate::lua::ACQUIRE)): one
/// for the whole data set on a standalone Redis, one per slot on a cluster (a script
/// touches only keys of its lock's slot, and each slot is lost or kept with the node
/// that serves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpochScope {
    /// [`EPOCH_KEY`](crate::scripts::EPOCH_KEY), as `leasehold-resp` uses it.
    DataSet,
    /// `{leasehold-N}:epoch`, `N` the smallest number whose tag is in the lock's slot.
    #[cfg(feature = "cluster")]
    Slot,
}

/// The epoch marker in `slot`: `{leasehold-N}:epoch` with the smallest `N` whose hash
/// tag falls in `slot`.
#[cfg(feature = "cluster")]
pub(crate) fn slot_epoch_key(slot: u16) -> String {
    let n = slot_epoch_numbers()
        .get(usize::from(slot))
        .copied()
        .unwrap_or_default();
    format!("{{leasehold-{n}}}:epoch")
}

/// For each slot, the smallest `N` such that `leasehold-N` hashes to it: found in one
/// pass over `N` (about 170,000 tags until every slot has one), once per process.
#[cfg(feature = "cluster")]
fn slot_epoch_numbers() -> &'static [u32] {
    static NUMBERS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    NUMBERS.get_or_init(|| {
        let mut numbers = vec![u32::MAX; 16_384];
        let mut left = numbers.len();
        let mut tag = String::new();
        for n in 0u32.. {
            use std::fmt::Write as _;
            tag.clear();
            let _ = write!(tag, "leasehold-{n}");
            let slot = usize::from(slot_of(tag.as_bytes()));
            if let Some(first @ &mut u32::MAX) = numbers.get_mut(slot) {
                *first = n;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        numbers
    })
}

/// The lock key of `name`, `{name}`, written straight into a command: a request
/// builds no key string of its own (the renew path runs once per lease per T/3).
/// The caller has checked `name` ([`leasehold::check_key`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockKey<'a>(pub(crate) &'a str);

/// The fence-counter key of `name`, `{name}:fence`, like [`LockKey`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct FenceKey<'a>(pub(crate) &'a str);

/// One queue key of `name`, `{name}` and a suffix of [`QUEUE_SUFFIXES`], written
/// straight into a command like [`LockKey`] (the fair acquire,
/// [`RedisLockService::with_fair`](crate::RedisLockService::with_fair)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueKey<'a>(&'a str, &'static str);

/// The three queue keys of `name`, `{name}:queue`, `{name}:waiters` and
/// `{name}:arrivals`, in the order the fair scripts take them: three arguments (a
/// tuple of them counts as three; a value writing three would count as one).
pub(crate) fn queue_keys(name: &str) -> (QueueKey<'_>, QueueKey<'_>, QueueKey<'_>) {
    let [queue, waiters, arrivals] = QUEUE_SUFFIXES.map(|suffix| QueueKey(name, suffix));
    (queue, waiters, arrivals)
}

/// The suffixes of the queue keys, in the order the fair scripts take them (the one
/// definition of their names).
const QUEUE_SUFFIXES: [&str; 3] = [":queue", ":waiters", ":arrivals"];

/// `{name}`, in pieces (the one definition of the lock key).
fn lock_key(name: &str) -> [&str; 3] {
    ["{", name, "}"]
}

/// `{name}:fence`, in pieces (the one definition of the fence key).
fn fence_key(name: &str) -> [&str; 4] {
    ["{", name, "}", ":fence"]
}

impl ToRedisArgs for LockKey<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        write_arg(out, &lock_key(self.0).map(str::as_bytes));
    }
}

impl ToRedisArgs for FenceKey<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        write_arg(out, &fence_key(self.0).map(str::as_bytes));
    }
}

impl ToRedisArgs for QueueKey<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        write_arg(out, &["{", self.0, "}", self.1].map(str::as_bytes));
    }
}

/// Writes `pieces` as ONE argument of the command, straight into its buffer (no
/// `core::fmt`, no string of its own).
pub(crate) fn write_arg<W: ?Sized + RedisWrite>(out: &mut W, pieces: &[&[u8]]) {
    let mut arg = out.writer_for_next_arg();
    for piece in pieces {
        // Into an in-memory command buffer: a write cannot fail.
        let _ = arg.write_all(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys written into a command are the keys `Keys` names, one argument each.
    /// Every slot has a marker in it, named by the smallest number that lands there.
    #[cfg(feature = "cluster")]
    #[test]
    fn each_slot_has_its_own_epoch_marker() {
        for slot in [0, 1, 105, 8_191, 16_383] {
            let key = slot_epoch_key(slot);
            assert_eq!(slot_of(key.as_bytes()), slot, "{key}");
            assert!(
                key.starts_with("{leasehold-") && key.ends_with("}:epoch"),
                "{key}"
            );
        }
        assert_eq!(slot_of(b"{leasehold}:epoch"), slot_of(b"{leasehold}"));
    }

    #[test]
    fn keys_written_into_a_command_are_one_argument_each() {
        let keys = Keys::new("orders").unwrap();
        let (mut written, mut expected) = (redis::Cmd::new(), redis::Cmd::new());
        written.arg((LockKey("orders"), FenceKey("orders")));
        expected.arg(&keys.lock).arg(&keys.fence);
        assert_eq!(written.get_packed_command(), expected.get_packed_command());
        assert_eq!((LockKey("a"), FenceKey("a")).num_of_args(), 2);
        let queue = QueueKeys::new("orders").unwrap();
        let (mut written, mut expected) = (redis::Cmd::new(), redis::Cmd::new());
        written.arg(queue_keys("orders"));
        expected
            .arg(&queue.queue)
            .arg(&queue.waiters)
            .arg(&queue.arrivals);
        assert_eq!(written.get_packed_command(), expected.get_packed_command());
        assert_eq!(queue_keys("a").num_of_args(), 3);
    }
}
