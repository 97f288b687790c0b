//! Key names: `{name}` and `{name}:fence` for a lock, `{name}:data` and
//! `{name}:data:fence` for fenced storage; one hash tag each, one cluster slot.

use leasehold::KeyError;

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
            lock: format!("{{{name}}}"),
            fence: format!("{{{name}}}:fence"),
        })
    }
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
