//! Fenced writes against real SQLite database files (the bundled SQLite).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use leasehold_storage::sqlite::{Error, FencedTable};
use leasehold_storage::{check_order, Fence, FencedWrite, MAX_SQL_FENCE};
use leasehold_test_support::{check_fenced_history, scratch_dir, Answer, FencePlan};
use rusqlite::Connection;

fn open(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn
}

#[test]
fn equal_and_newer_fences_are_admitted_and_an_older_one_is_stale_with_the_newest() {
    let dir = scratch_dir("sqlite");
    let conn = open(&dir.path().join("db.sqlite"));
    let table = FencedTable::new("fenced").unwrap();
    table.create(&conn).unwrap();
    table.create(&conn).expect("creating again is a no-op");

    let write = |fence: u64, value: &[u8]| table.write(&conn, "orders", Fence(fence), value);
    assert_eq!(write(5, b"a").unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"b").unwrap(),
        FencedWrite::Written,
        "the same holder writes again with an equal fence (a `<` guard fails here)"
    );
    assert_eq!(write(7, b"c").unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"late").unwrap(),
        FencedWrite::Stale {
            presented: Fence(5),
            newest: Fence(7)
        },
        "a paused holder's write is refused (a missing guard fails here)"
    );
    let stored = table.read(&conn, "orders").unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"c"[..], Fence(7))
    );
    assert_eq!(table.read(&conn, "absent").unwrap(), None);

    assert_eq!(
        table.write(&conn, "top", MAX_SQL_FENCE, b"x").unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        table
            .write(&conn, "top", Fence(MAX_SQL_FENCE.0 - 1), b"y")
            .unwrap(),
        FencedWrite::Stale {
            presented: Fence(MAX_SQL_FENCE.0 - 1),
            newest: MAX_SQL_FENCE
        }
    );
    let above = table
        .write(&conn, "top", Fence(MAX_SQL_FENCE.0 + 1), b"z")
        .unwrap_err();
    assert!(matches!(above, Error::FenceOutOfRange(_)), "{above}");

    // The data survives the connection: a new one sees the newest fence and refuses.
    drop(conn);
    let conn = open(&dir.path().join("db.sqlite"));
    assert_eq!(
        table
            .write(&conn, "orders", Fence(6), b"after reopen")
            .unwrap(),
        FencedWrite::Stale {
            presented: Fence(6),
            newest: Fence(7)
        }
    );
}

#[test]
fn a_missing_table_and_a_corrupt_fence_are_typed_errors() {
    let conn = Connection::open_in_memory().unwrap();
    let missing = FencedTable::new("never_created").unwrap();
    let err = missing.write(&conn, "k", Fence(1), b"v").unwrap_err();
    assert!(matches!(err, Error::Sqlite(_)), "{err:?}");
    assert!(err.to_string().contains("never_created"), "{err}");

    // A table someone made without the CHECK, holding a negative fence.
    conn.execute_batch(
        "CREATE TABLE loose (key TEXT PRIMARY KEY, value BLOB NOT NULL, fence INTEGER NOT NULL);
         INSERT INTO loose VALUES ('k', x'00', -4);",
    )
    .unwrap();
    let loose = FencedTable::new("loose").unwrap();
    let err = loose.read(&conn, "k").unwrap_err();
    assert!(
        matches!(err, Error::CorruptFence { found: -4, .. }),
        "{err:?}"
    );
}

/// Many threads, each with its own connection to one database file, interleaved
/// fresh, repeated and older fences on one key. A trigger logs every admitted write
/// in the order SQLite admitted it (one writer at a time holds the database's write
/// lock): it must never go back.
#[test]
fn concurrent_stale_and_fresh_writers_never_admit_an_older_fence_after_a_newer_one() {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let dir = scratch_dir("sqlite");
    let path = dir.path().join("db.sqlite");
    let admin = open(&path);
    let table = Arc::new(FencedTable::new("fenced").unwrap());
    table.create(&admin).unwrap();
    admin
        .execute_batch(
            "CREATE TABLE admitted (seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL);
             CREATE TRIGGER log_insert AFTER INSERT ON fenced
                 BEGIN INSERT INTO admitted (fence) VALUES (NEW.fence); END;
             CREATE TRIGGER log_update AFTER UPDATE ON fenced
                 BEGIN INSERT INTO admitted (fence) VALUES (NEW.fence); END;",
        )
        .unwrap();

    let plan = Arc::new(FencePlan::new());
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (table, plan, path) = (Arc::clone(&table), Arc::clone(&plan), path.clone());
            std::thread::spawn(move || {
                let conn = open(&path);
                let mut answers = Vec::new();
                let mut previous = None;
                for i in 0..WRITES {
                    let fence = plan.fence(writer, i, previous);
                    previous = Some(fence);
                    let value = format!("{}:{writer}:{i}", fence.0);
                    let stale = match table.write(&conn, "k", fence, value.as_bytes()) {
                        Ok(FencedWrite::Written) => None,
                        Ok(FencedWrite::Stale { presented, newest }) => {
                            assert_eq!(presented, fence);
                            Some(newest)
                        }
                        Err(e) => panic!("writer {writer}: {e}"),
                    };
                    answers.push(Answer { fence, stale });
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for writer in writers {
        answers.extend(writer.join().unwrap());
    }

    let admitted: Vec<Fence> = admin
        .prepare("SELECT fence FROM admitted ORDER BY seq")
        .unwrap()
        .query_map([], |row| row.get::<_, i64>(0))
        .unwrap()
        .map(|fence| Fence(fence.unwrap().unsigned_abs()))
        .collect();
    let counts = check_fenced_history(&admitted, &answers);
    println!("sqlite, {WRITERS} writers x {WRITES}: {counts:?}");
    let last = *admitted.last().unwrap();
    let stored = table.read(&admin, "k").unwrap().unwrap();
    assert_eq!(stored.fence, last);
    let value = String::from_utf8(stored.value).unwrap();
    assert!(
        value.starts_with(&format!("{}:", last.0)),
        "the value travels with its fence: {value} under {last}"
    );
}

/// The async table runs each statement on the blocking pool: while SQLite makes a write
/// wait for another connection's lock, the runtime's one thread keeps running other
/// tasks, and the write lands once the lock is gone, decided by its fence.
#[cfg(feature = "sqlite-tokio")]
#[tokio::test(flavor = "current_thread")]
async fn an_async_write_waiting_for_sqlites_lock_never_blocks_the_runtime() {
    use leasehold_storage::sqlite::AsyncFencedTable;

    let dir = scratch_dir("sqlite-async");
    let path = dir.path().join("db.sqlite");
    let table = AsyncFencedTable::new(FencedTable::new("fenced").unwrap(), open(&path));
    table.create().await.unwrap();
    assert_eq!(
        table
            .write("orders", Fence(3), b"a".to_vec())
            .await
            .unwrap(),
        FencedWrite::Written
    );

    // Another connection takes the write lock and holds it.
    let other = open(&path);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let waiting = tokio::spawn({
        let table = table.clone();
        async move { table.write("orders", Fence(5), b"b".to_vec()).await }
    });
    // A task on the same (only) thread runs meanwhile: a write that blocked the
    // thread would keep it from ever running.
    let ran = tokio::spawn(async { "other work" }).await.unwrap();
    assert_eq!(ran, "other work");
    assert!(!waiting.is_finished(), "the write waits for SQLite's lock");

    other.execute_batch("COMMIT").unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), FencedWrite::Written);
    assert_eq!(
        table
            .write("orders", Fence(4), b"late".to_vec())
            .await
            .unwrap(),
        FencedWrite::Stale {
            presented: Fence(4),
            newest: Fence(5)
        }
    );
    assert_eq!(table.read("orders").await.unwrap().unwrap().value, b"b");
}

fn audited(name: &str) -> FencedTable {
    FencedTable::new(name).unwrap().with_audit(true).unwrap()
}

/// With the audit on, every admitted write leaves one audit row, in admission order,
/// with its fence and SQLite's time; a refused write leaves none, and each key has its
/// own audit.
#[test]
fn audited_writes_are_recorded_in_admission_order_and_refused_ones_are_not() {
    let dir = scratch_dir("sqlite-audit");
    let conn = open(&dir.path().join("db.sqlite"));
    let table = audited("fenced");
    table.create(&conn).unwrap();
    table.create(&conn).expect("creating again is a no-op");

    let before = SystemTime::now() - Duration::from_secs(60);
    for (key, fence) in [("orders", 5), ("orders", 5), ("other", 1), ("orders", 7)] {
        let written = table.write(&conn, key, Fence(fence), b"v").unwrap();
        assert_eq!(written, FencedWrite::Written, "{key} {fence}");
    }
    for late in [5, 6] {
        let refused = table.write(&conn, "orders", Fence(late), b"late").unwrap();
        assert!(!refused.is_written(), "{refused:?}");
    }
    let after = SystemTime::now() + Duration::from_secs(60);

    let audit = table.audit(&conn, "orders").unwrap();
    let fences: Vec<u64> = audit.iter().map(|row| row.fence.0).collect();
    assert_eq!(fences, [5, 5, 7], "admitted writes only: {audit:?}");
    assert_eq!(check_order(&audit), Ok(()));
    assert!(
        audit.iter().all(|row| before < row.at && row.at < after),
        "SQLite's clock, near ours: {audit:?}"
    );
    let other = table.audit(&conn, "other").unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].fence, Fence(1));
    assert_eq!(
        table.audit_after(&conn, "orders", audit[0].seq).unwrap(),
        audit[1..]
    );
    assert_eq!(table.audit(&conn, "absent").unwrap(), []);
}

/// The audit row is inserted in the write's own transaction: a write in a transaction
/// of the caller's that rolls back leaves neither, and an audit row that cannot be
/// inserted takes its write down with it, alone or inside the caller's transaction
/// (whose other writes stay).
#[test]
fn an_audited_write_and_its_audit_row_commit_together_or_not_at_all() {
    let dir = scratch_dir("sqlite-audit");
    let conn = open(&dir.path().join("db.sqlite"));
    let table = audited("fenced");
    table.create(&conn).unwrap();

    conn.execute_batch("BEGIN").unwrap();
    assert_eq!(
        table.write(&conn, "k", Fence(3), b"rolled back").unwrap(),
        FencedWrite::Written
    );
    assert_eq!(table.audit(&conn, "k").unwrap().len(), 1);
    conn.execute_batch("ROLLBACK").unwrap();
    assert_eq!(table.read(&conn, "k").unwrap(), None);
    assert_eq!(table.audit(&conn, "k").unwrap(), []);

    assert_eq!(
        table.write(&conn, "k", Fence(4), b"kept").unwrap(),
        FencedWrite::Written
    );

    // The audit table refuses fence 13: so must the write.
    conn.execute_batch(
        "CREATE TRIGGER no_13 BEFORE INSERT ON fenced_audit WHEN NEW.fence = 13
             BEGIN SELECT RAISE(ABORT, 'no_13'); END;",
    )
    .unwrap();
    let err = table
        .write(&conn, "k", Fence(13), b"unaudited")
        .unwrap_err();
    assert!(err.to_string().contains("no_13"), "{err}");
    let stored = table.read(&conn, "k").unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"kept"[..], Fence(4)),
        "a write whose audit row failed must not stand"
    );
    assert!(conn.is_autocommit(), "no transaction left open");

    // Inside the caller's transaction, the failed write alone is undone.
    conn.execute_batch("BEGIN").unwrap();
    table
        .write(&conn, "k", Fence(13), b"unaudited")
        .unwrap_err();
    assert_eq!(
        table.write(&conn, "k", Fence(14), b"audited").unwrap(),
        FencedWrite::Written
    );
    assert!(
        !conn.is_autocommit(),
        "the caller's transaction is still open"
    );
    conn.execute_batch("COMMIT").unwrap();
    assert_eq!(table.read(&conn, "k").unwrap().unwrap().value, b"audited");
    let fences: Vec<u64> = table
        .audit(&conn, "k")
        .unwrap()
        .iter()
        .map(|row| row.fence.0)
        .collect();
    assert_eq!(fences, [4, 14]);
}

/// Many threads, each with its own connection and an audited table, interleaved
/// fresh, repeated and older fences on one key: the audit, read back by `seq`, never
/// goes back and holds exactly the writes answered `Written`.
#[test]
fn concurrent_audited_writers_leave_an_audit_in_order_with_every_written_answer() {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let dir = scratch_dir("sqlite-audit");
    let path = dir.path().join("db.sqlite");
    let admin = open(&path);
    let table = Arc::new(audited("fenced"));
    table.create(&admin).unwrap();

    let plan = Arc::new(FencePlan::new());
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (table, plan, path) = (Arc::clone(&table), Arc::clone(&plan), path.clone());
            std::thread::spawn(move || {
                let conn = open(&path);
                let mut answers = Vec::new();
                let mut previous = None;
                for i in 0..WRITES {
                    let fence = plan.fence(writer, i, previous);
                    previous = Some(fence);
                    let stale = match table.write(&conn, "k", fence, b"v") {
                        Ok(FencedWrite::Written) => None,
                        Ok(FencedWrite::Stale { newest, .. }) => Some(newest),
                        Err(e) => panic!("writer {writer}: {e}"),
                    };
                    answers.push(Answer { fence, stale });
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for writer in writers {
        answers.extend(writer.join().unwrap());
    }

    let audit = table.audit(&admin, "k").unwrap();
    if let Err(e) = check_order(&audit) {
        panic!("{e}");
    }
    let written = answers.iter().filter(|a| a.stale.is_none()).count();
    assert_eq!(audit.len(), written, "one audit row per `Written` answer");
    let fences: Vec<Fence> = audit.iter().map(|row| row.fence).collect();
    let counts = check_fenced_history(&fences, &answers);
    println!("sqlite audit, {WRITERS} writers x {WRITES}: {counts:?}");
    let stored = table.read(&admin, "k").unwrap().unwrap();
    assert_eq!(stored.fence, *fences.last().unwrap());
}

/// Off (the default), writes never touch an audit table: none is created, an
/// existing one gets no rows, and reading the audit is a typed error.
#[test]
fn with_the_audit_off_no_audit_table_is_touched() {
    let conn = Connection::open_in_memory().unwrap();
    let plain = FencedTable::new("plain").unwrap();
    plain.create(&conn).unwrap();
    assert!(plain
        .write(&conn, "k", Fence(1), b"v")
        .unwrap()
        .is_written());
    let tables = |conn: &Connection| -> Vec<String> {
        conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(tables(&conn), ["plain"], "off creates no audit table");
    let err = plain.audit(&conn, "k").unwrap_err();
    assert!(
        matches!(err, Error::NotAudited { ref table } if table == "plain"),
        "{err}"
    );

    // One table, written through an audited and an unaudited `FencedTable`: only the
    // audited writes leave rows.
    let audited = audited("shared");
    audited.create(&conn).unwrap();
    assert!(tables(&conn).contains(&"shared_audit".to_owned()));
    let unaudited = FencedTable::new("shared").unwrap();
    for (table, fence) in [
        (&audited, 1),
        (&unaudited, 2),
        (&unaudited, 3),
        (&audited, 4),
    ] {
        assert!(table
            .write(&conn, "k", Fence(fence), b"v")
            .unwrap()
            .is_written());
    }
    let fences: Vec<u64> = audited
        .audit(&conn, "k")
        .unwrap()
        .iter()
        .map(|row| row.fence.0)
        .collect();
    assert_eq!(fences, [1, 4]);
}

/// The async table reaches the audit: built from an audited `FencedTable`, its writes
/// are audited and `audit` reads them on the blocking pool.
#[cfg(feature = "sqlite-tokio")]
#[tokio::test(flavor = "current_thread")]
async fn the_async_table_writes_and_reads_the_audit() {
    use leasehold_storage::sqlite::AsyncFencedTable;

    let table = AsyncFencedTable::new(audited("fenced"), Connection::open_in_memory().unwrap());
    table.create().await.unwrap();
    for fence in [2, 3, 1, 3] {
        let _ = table.write("k", Fence(fence), b"v".to_vec()).await.unwrap();
    }
    let audit = table.audit("k").await.unwrap();
    let fences: Vec<u64> = audit.iter().map(|row| row.fence.0).collect();
    assert_eq!(fences, [2, 3, 3]);
    assert_eq!(check_order(&audit), Ok(()));
    assert_eq!(
        table.audit_after("k", audit[1].seq).await.unwrap(),
        audit[2..]
    );
}
