//! What the SQL stores share: the table name, and fences as SQL's signed 64-bit
//! integers.

use std::fmt;

use leasehold::Fence;

/// The largest fence a SQL store keeps exactly: `BIGINT` (PostgreSQL) and `INTEGER`
/// (SQLite) are signed 64-bit, so 2^63 − 1.
///
/// Every leasehold lock service stays below it: Redis's `INCR` stops at 2^63 − 1 and
/// the etcd service refuses to grant past it.
pub const MAX_SQL_FENCE: Fence = Fence(i64::MAX.unsigned_abs());

/// A fence above [`MAX_SQL_FENCE`]: refused before anything is sent, never rounded
/// or wrapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FenceOutOfRange {
    /// The fence presented.
    pub fence: Fence,
}

impl fmt::Display for FenceOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} does not fit a signed 64-bit SQL integer (at most {})",
            self.fence, MAX_SQL_FENCE.0
        )
    }
}

impl std::error::Error for FenceOutOfRange {}

/// `fence` as the SQL column holds it.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn to_sql(fence: Fence) -> Result<i64, FenceOutOfRange> {
    i64::try_from(fence.0).map_err(|_| FenceOutOfRange { fence })
}

/// A fence read back from the column; `None` for a negative number, which no fenced
/// write stores (the column's `CHECK` forbids it).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn from_sql(stored: i64) -> Option<Fence> {
    u64::try_from(stored).ok().map(Fence)
}

/// The name of a fenced table, checked once so that it can be spliced into SQL.
///
/// An unquoted identifier: 1 to 63 ASCII letters, digits and underscores, not
/// starting with a digit (63 bytes is PostgreSQL's identifier limit). SQL keywords
/// are the database's to refuse, with its own error, when the table is created.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// `name` if it is a plain identifier.
    ///
    /// ```
    /// use leasehold_storage::TableName;
    /// assert!(TableName::new("fenced_orders").is_ok());
    /// assert!(TableName::new("orders; DROP TABLE x").is_err());
    /// assert!(TableName::new("1st").is_err());
    /// ```
    pub fn new(name: &str) -> Result<TableName, InvalidTableName> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if first_ok && rest_ok && name.len() <= 63 {
            Ok(TableName(name.to_owned()))
        } else {
            Err(InvalidTableName {
                name: name.chars().take(80).collect(),
            })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A table name that is not a plain SQL identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InvalidTableName {
    /// The name given (its first 80 characters).
    pub name: String,
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a usable table name: use 1 to 63 ASCII letters, digits and \
             underscores, not starting with a digit",
            self.name
        )
    }
}

impl std::error::Error for InvalidTableName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_map_to_sql_exactly_up_to_i64_max_and_are_refused_above() {
        assert_eq!(to_sql(Fence(0)), Ok(0));
        assert_eq!(to_sql(MAX_SQL_FENCE), Ok(i64::MAX));
        let above = Fence(MAX_SQL_FENCE.0 + 1);
        assert_eq!(to_sql(above), Err(FenceOutOfRange { fence: above }));
        assert_eq!(to_sql(Fence(u64::MAX)).unwrap_err().fence, Fence(u64::MAX));
        assert_eq!(from_sql(i64::MAX), Some(MAX_SQL_FENCE));
        assert_eq!(from_sql(-1), None);
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        for good in ["t", "_t", "fenced_orders_2", &"a".repeat(63)] {
            assert_eq!(TableName::new(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "2t",
            "a-b",
            "a b",
            "a;b",
            "\"t\"",
            "tä",
            &"a".repeat(64),
        ] {
            let err = TableName::new(bad).unwrap_err();
            assert!(err.to_string().contains("not a usable table name"), "{err}");
        }
    }
}
