//! The optional audit of admitted writes: what a SQL store records per admitted write
//! when a table has it on, and the check that no stale writer got in.

use std::fmt;
use std::time::SystemTime;

use leasehold::Fence;

/// One write the store admitted, as its audit table recorded it (`with_audit(true)`
/// on `postgres::FencedTable` or `sqlite::FencedTable`).
///
/// The audit row is inserted in the same statement (PostgreSQL) or transaction
/// (SQLite) as the write it records, so it exists exactly when the write was
/// committed; a refused write leaves none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Admitted {
    /// The audit row's id, taken from the database's sequence (PostgreSQL identity,
    /// SQLite `AUTOINCREMENT`) after the write was admitted. For one key, a larger
    /// `seq` was admitted later: writers to a key are decided one at a time (the row
    /// lock, SQLite's write lock) and each takes its number while holding that lock.
    /// Numbers are not consecutive (a rolled-back write leaves a gap), and across keys
    /// on PostgreSQL their order is not commit order.
    pub seq: i64,
    /// The fence the write presented (and the row has held since).
    pub fence: Fence,
    /// When the database admitted it, by the database's clock (PostgreSQL
    /// `clock_timestamp()`, microseconds; SQLite `'now'`, milliseconds). For humans:
    /// a clock can step back, so order by `seq`, never by `at`.
    pub at: SystemTime,
}

impl Admitted {
    /// An audit row, for a [`check_order`] of rows recorded elsewhere.
    pub const fn new(seq: i64, fence: Fence, at: SystemTime) -> Admitted {
        Admitted { seq, fence, at }
    }
}

/// Two consecutive audit rows that break the fence rule, from [`check_order`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutOfOrder {
    /// The earlier row.
    pub earlier: Admitted,
    /// The row right after it: an older fence than `earlier`'s (a stale writer got
    /// in), or a `seq` that does not rise (the rows are not in admission order).
    pub later: Admitted,
}

impl fmt::Display for OutOfOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (earlier, later) = (&self.earlier, &self.later);
        if later.seq <= earlier.seq {
            write!(
                f,
                "audit row seq {} follows seq {}: the rows are not in admission order",
                later.seq, earlier.seq
            )
        } else {
            write!(
                f,
                "audit row seq {} admitted fence {} after seq {} admitted fence {}: \
                 an older fence after a newer one",
                later.seq, later.fence.0, earlier.seq, earlier.fence.0
            )
        }
    }
}

impl std::error::Error for OutOfOrder {}

/// Checks one key's audit (in `seq` order, as `audit` returns it): `seq` rises and
/// the fence never decreases from one row to the next (equal is the same holder
/// writing again). The first pair that breaks it is the error.
///
/// ```
/// use leasehold_storage::{check_order, Admitted, Fence};
/// use std::time::SystemTime;
///
/// let row = |seq, fence| Admitted::new(seq, Fence(fence), SystemTime::UNIX_EPOCH);
/// assert!(check_order(&[row(1, 5), row(2, 5), row(4, 7)]).is_ok());
/// let err = check_order(&[row(1, 5), row(2, 7), row(3, 6)]).unwrap_err();
/// assert_eq!((err.earlier.seq, err.later.seq), (2, 3));
/// ```
pub fn check_order(rows: &[Admitted]) -> Result<(), OutOfOrder> {
    rows.windows(2).try_for_each(|pair| match pair {
        [earlier, later] if later.seq <= earlier.seq || later.fence < earlier.fence => {
            Err(OutOfOrder {
                earlier: *earlier,
                later: *later,
            })
        }
        _ => Ok(()),
    })
}

/// A time `millis` milliseconds from the Unix epoch (SQLite's audit column).
#[cfg(feature = "sqlite")]
pub(crate) fn from_unix_millis(millis: i64) -> SystemTime {
    let span = std::time::Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        SystemTime::UNIX_EPOCH + span
    } else {
        SystemTime::UNIX_EPOCH - span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, fence: u64) -> Admitted {
        Admitted::new(seq, Fence(fence), SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn fences_may_repeat_and_rise_but_never_fall_along_seq() {
        assert_eq!(check_order(&[]), Ok(()));
        assert_eq!(check_order(&[row(3, 1)]), Ok(()));
        assert_eq!(check_order(&[row(1, 1), row(2, 1), row(9, 4)]), Ok(()));

        let err = check_order(&[row(1, 1), row(2, 4), row(3, 3), row(4, 2)]).unwrap_err();
        assert_eq!(
            err,
            OutOfOrder {
                earlier: row(2, 4),
                later: row(3, 3)
            }
        );
        assert_eq!(
            err.to_string(),
            "audit row seq 3 admitted fence 3 after seq 2 admitted fence 4: \
             an older fence after a newer one"
        );
    }

    #[test]
    fn rows_out_of_seq_order_are_refused() {
        let err = check_order(&[row(2, 1), row(2, 1)]).unwrap_err();
        assert_eq!((err.earlier.seq, err.later.seq), (2, 2));
        assert!(err.to_string().contains("not in admission order"), "{err}");
        assert!(check_order(&[row(5, 1), row(4, 2)]).is_err());
    }
}
