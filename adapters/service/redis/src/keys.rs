//! Key names: `{name}` and `{name}:fence`, one hash tag, one cluster slot.

/// The two Redis keys of lock `name`: the lock itself, `{name}`, holding the owner
/// token with a TTL, and its fence counter, `{name}:fence`, without a TTL.
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
    /// `{name}`: holds the owner token, expires with the lease.
    pub lock: String,
    /// `{name}:fence`: the fence counter, never expires.
    pub fence: String,
}

impl Keys {
    /// The keys of lock `name`.
    ///
    /// `name` must be non-empty and free of `{` and `}`: an empty tag or a brace
    /// inside it would change which part of the key Redis Cluster hashes, and the
    /// two keys could land in different slots.
    pub fn new(name: &str) -> Result<Keys, &'static str> {
        if name.is_empty() {
            return Err("the lock name must not be empty");
        }
        if name.contains(['{', '}']) {
            return Err(
                "the lock name must not contain '{' or '}' (it becomes the cluster hash tag)",
            );
        }
        Ok(Keys {
            lock: format!("{{{name}}}"),
            fence: format!("{{{name}}}:fence"),
        })
    }
}
