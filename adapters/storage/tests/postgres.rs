//! Fenced writes against a real PostgreSQL cluster started by the test.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use leasehold_storage::postgres::{Error, FencedTable};
use leasehold_storage::{check_order, Fence, FencedWrite, MAX_SQL_FENCE};
use leasehold_test_support::{check_fenced_history, Answer, FencePlan, PostgresServer, Proxy};
use tokio_postgres::{Client, NoTls};

async fn connect(server: &PostgresServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.conninfo(), NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.conninfo()));
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn equal_and_newer_fences_are_admitted_and_an_older_one_is_stale_with_the_newest() {
    let server = PostgresServer::start();
    let client = connect(&server).await;
    let table = FencedTable::new("fenced").unwrap();
    table.create(&client).await.unwrap();
    table
        .create(&client)
        .await
        .expect("creating again is a no-op");

    let write =
        |fence: u64, value: &'static [u8]| table.write(&client, "orders", Fence(fence), value);
    assert_eq!(write(5, b"a").await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"b").await.unwrap(),
        FencedWrite::Written,
        "the same holder writes again with an equal fence (a `<` guard fails here)"
    );
    assert_eq!(write(7, b"c").await.unwrap(), FencedWrite::Written);
    assert_eq!(
        write(5, b"late").await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(5),
            newest: Fence(7)
        },
        "a paused holder's write is refused (a missing guard fails here)"
    );
    let stored = table.read(&client, "orders").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"c"[..], Fence(7))
    );
    assert_eq!(table.read(&client, "absent").await.unwrap(), None);

    // Keys are independent; fences are exact at the top of BIGINT and refused above.
    assert_eq!(
        table.write(&client, "other", Fence(1), b"x").await.unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        table
            .write(&client, "top", MAX_SQL_FENCE, b"x")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        table
            .write(&client, "top", Fence(MAX_SQL_FENCE.0 - 1), b"y")
            .await
            .unwrap(),
        FencedWrite::Stale {
            presented: Fence(MAX_SQL_FENCE.0 - 1),
            newest: MAX_SQL_FENCE
        }
    );
    let above = table
        .write(&client, "top", Fence(MAX_SQL_FENCE.0 + 1), b"z")
        .await
        .unwrap_err();
    assert!(matches!(above, Error::FenceOutOfRange(_)), "{above}");
    assert_eq!(
        table.read(&client, "top").await.unwrap().unwrap().value,
        b"x"
    );
}

#[tokio::test]
async fn a_missing_table_is_a_typed_error_naming_postgres() {
    let server = PostgresServer::start();
    let client = connect(&server).await;
    let table = FencedTable::new("never_created").unwrap();
    let err = table.write(&client, "k", Fence(1), b"v").await.unwrap_err();
    assert!(matches!(err, Error::Postgres(_)), "{err:?}");
    assert!(err.to_string().contains("never_created"), "{err}");
}

/// Many writers on their own connections, interleaved fresh, repeated and older
/// fences on one key. A trigger logs every admitted write in the order PostgreSQL
/// admitted it (each writer waits for the row lock of the one before, so the log's
/// sequence is the admission order): it must never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_stale_and_fresh_writers_never_admit_an_older_fence_after_a_newer_one() {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let server = PostgresServer::start();
    let admin = connect(&server).await;
    let table = Arc::new(FencedTable::new("fenced").unwrap());
    table.create(&admin).await.unwrap();
    admin
        .batch_execute(
            "CREATE TABLE admitted (seq BIGSERIAL PRIMARY KEY, fence BIGINT NOT NULL);
             CREATE FUNCTION log_admitted() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO admitted (fence) VALUES (NEW.fence); RETURN NEW; END $$;
             CREATE TRIGGER log_admitted AFTER INSERT OR UPDATE ON fenced
                 FOR EACH ROW EXECUTE FUNCTION log_admitted();",
        )
        .await
        .unwrap();

    let plan = Arc::new(FencePlan::new());
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let client = connect(&server).await;
        let (table, plan) = (Arc::clone(&table), Arc::clone(&plan));
        writers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut previous = None;
            for i in 0..WRITES {
                let fence = plan.fence(writer, i, previous);
                previous = Some(fence);
                let value = format!("{}:{writer}:{i}", fence.0);
                let stale = match table.write(&client, "k", fence, value.as_bytes()).await {
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
        }));
    }
    let mut answers = Vec::new();
    for writer in writers {
        answers.extend(writer.await.unwrap());
    }

    let admitted: Vec<Fence> = admin
        .query("SELECT fence FROM admitted ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| Fence(row.get::<_, i64>(0).unsigned_abs()))
        .collect();
    let counts = check_fenced_history(&admitted, &answers);
    println!("postgres, {WRITERS} writers x {WRITES}: {counts:?}");
    let last = *admitted.last().unwrap();
    let stored = table.read(&admin, "k").await.unwrap().unwrap();
    assert_eq!(stored.fence, last);
    let value = String::from_utf8(stored.value).unwrap();
    assert!(
        value.starts_with(&format!("{}:", last.0)),
        "the value travels with its fence: {value} under {last}"
    );
}

/// A PostgreSQL that stops answering (its connection stalled in a proxy: a paused
/// server, a silent network) costs one `Timeout` within the table's bound, for a
/// write and for a read, never a stuck writer; once it answers again, nothing was
/// lost and writes go on under the fence rule.
#[tokio::test]
async fn a_server_that_stops_answering_is_a_timeout_within_the_bound() {
    let server = PostgresServer::start();
    let proxy = Proxy::start(server.port()).await;
    let conninfo = server.conninfo().replace(
        &format!("port={}", server.port()),
        &format!("port={}", proxy.port()),
    );
    let (client, connection) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(connection);
    let bound = std::time::Duration::from_millis(300);
    let table = FencedTable::new("fenced").unwrap().with_timeout(bound);
    table.create(&client).await.unwrap();
    assert_eq!(
        table.write(&client, "k", Fence(3), b"a").await.unwrap(),
        FencedWrite::Written
    );

    proxy.stall();
    for read in [false, true] {
        let started = std::time::Instant::now();
        let err = if read {
            table.read(&client, "k").await.map(|_| ()).unwrap_err()
        } else {
            table
                .write(&client, "k", Fence(4), b"b")
                .await
                .map(|_| ())
                .unwrap_err()
        };
        let took = started.elapsed();
        assert!(
            matches!(&err, Error::Timeout { key, after } if key == "k" && *after == bound),
            "{err}"
        );
        assert!(took >= bound && took < bound * 5, "{took:?}");
    }

    proxy.resume();
    assert_eq!(
        table.write(&client, "k", Fence(5), b"c").await.unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        table.write(&client, "k", Fence(4), b"late").await.unwrap(),
        FencedWrite::Stale {
            presented: Fence(4),
            newest: Fence(5)
        }
    );
    let stored = table.read(&client, "k").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"c"[..], Fence(5))
    );
}

/// The table `name` with the audit on, created.
async fn audited(client: &Client, name: &str) -> FencedTable {
    let table = FencedTable::new(name).unwrap().with_audit(true).unwrap();
    table.create(client).await.unwrap();
    table
}

/// With the audit on, every admitted write leaves one audit row, in admission order,
/// with its fence and the server's time; a refused write leaves none, and each key
/// has its own audit.
#[tokio::test]
async fn audited_writes_are_recorded_in_admission_order_and_refused_ones_are_not() {
    let server = PostgresServer::start();
    let client = connect(&server).await;
    let table = audited(&client, "fenced").await;
    table
        .create(&client)
        .await
        .expect("creating again is a no-op");

    let before = SystemTime::now() - Duration::from_secs(60);
    let mut answers = Vec::new();
    for (key, fence) in [("orders", 5), ("orders", 5), ("other", 1), ("orders", 7)] {
        let written = table.write(&client, key, Fence(fence), b"v").await.unwrap();
        answers.push(written);
    }
    for late in [5, 6] {
        let refused = table
            .write(&client, "orders", Fence(late), b"late")
            .await
            .unwrap();
        assert!(!refused.is_written(), "{refused:?}");
    }
    assert!(answers.iter().all(FencedWrite::is_written), "{answers:?}");
    let after = SystemTime::now() + Duration::from_secs(60);

    let audit = table.audit(&client, "orders").await.unwrap();
    let fences: Vec<u64> = audit.iter().map(|row| row.fence.0).collect();
    assert_eq!(fences, [5, 5, 7], "admitted writes only: {audit:?}");
    assert_eq!(check_order(&audit), Ok(()));
    assert!(
        audit.iter().all(|row| before < row.at && row.at < after),
        "the server's clock, near ours: {audit:?}"
    );
    let other = table.audit(&client, "other").await.unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].fence, Fence(1));

    let since = table
        .audit_after(&client, "orders", audit[0].seq)
        .await
        .unwrap();
    assert_eq!(since, audit[1..]);
    assert_eq!(table.audit(&client, "absent").await.unwrap(), []);
}

/// The audit row is part of the write's own statement: a write in a transaction that
/// rolls back leaves neither, one that commits leaves both, and an audit row that
/// cannot be inserted takes its write down with it (two statements would leave the
/// write standing, unaudited).
#[tokio::test]
async fn an_audited_write_and_its_audit_row_commit_together_or_not_at_all() {
    let server = PostgresServer::start();
    let mut client = connect(&server).await;
    let table = audited(&client, "fenced").await;

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        table
            .write(&tx, "k", Fence(3), b"rolled back")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    assert_eq!(table.audit(&tx, "k").await.unwrap().len(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(table.read(&client, "k").await.unwrap(), None);
    assert_eq!(table.audit(&client, "k").await.unwrap(), []);

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        table.write(&tx, "k", Fence(4), b"kept").await.unwrap(),
        FencedWrite::Written
    );
    tx.commit().await.unwrap();
    assert_eq!(
        table.read(&client, "k").await.unwrap().unwrap().fence,
        Fence(4)
    );
    let audit = table.audit(&client, "k").await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].fence, Fence(4));

    // The audit table refuses fence 13: so must the write.
    client
        .batch_execute("ALTER TABLE fenced_audit ADD CONSTRAINT no_13 CHECK (fence <> 13)")
        .await
        .unwrap();
    let err = table
        .write(&client, "k", Fence(13), b"unaudited")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_13"), "{err}");
    let stored = table.read(&client, "k").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.fence),
        (&b"kept"[..], Fence(4)),
        "a write whose audit row failed must not stand"
    );
    assert_eq!(table.audit(&client, "k").await.unwrap(), audit);
}

/// Many audited writers on their own connections, interleaved fresh, repeated and
/// older fences on one key: the table's own audit, read back by `seq`, never goes
/// back and holds exactly the writes answered `Written`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_audited_writers_leave_an_audit_in_order_with_every_written_answer() {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let server = PostgresServer::start();
    let admin = connect(&server).await;
    let table = Arc::new(audited(&admin, "fenced").await);

    let plan = Arc::new(FencePlan::new());
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let client = connect(&server).await;
        let (table, plan) = (Arc::clone(&table), Arc::clone(&plan));
        writers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut previous = None;
            for i in 0..WRITES {
                let fence = plan.fence(writer, i, previous);
                previous = Some(fence);
                let stale = match table.write(&client, "k", fence, b"v").await {
                    Ok(FencedWrite::Written) => None,
                    Ok(FencedWrite::Stale { newest, .. }) => Some(newest),
                    Err(e) => panic!("writer {writer}: {e}"),
                };
                answers.push(Answer { fence, stale });
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for writer in writers {
        answers.extend(writer.await.unwrap());
    }

    let audit = table.audit(&admin, "k").await.unwrap();
    if let Err(e) = check_order(&audit) {
        panic!("{e}");
    }
    let written = answers.iter().filter(|a| a.stale.is_none()).count();
    assert_eq!(audit.len(), written, "one audit row per `Written` answer");
    let fences: Vec<Fence> = audit.iter().map(|row| row.fence).collect();
    let counts = check_fenced_history(&fences, &answers);
    println!("postgres audit, {WRITERS} writers x {WRITES}: {counts:?}");
    let stored = table.read(&admin, "k").await.unwrap().unwrap();
    assert_eq!(stored.fence, *fences.last().unwrap());
}

/// Off (the default), writes never touch an audit table: none is created, an
/// existing one gets no rows, and reading the audit is a typed error.
#[tokio::test]
async fn with_the_audit_off_no_audit_table_is_touched() {
    let server = PostgresServer::start();
    let client = connect(&server).await;
    let plain = FencedTable::new("plain").unwrap();
    plain.create(&client).await.unwrap();
    assert_eq!(
        plain.write(&client, "k", Fence(1), b"v").await.unwrap(),
        FencedWrite::Written
    );
    let exists = |name: &'static str| {
        let client = &client;
        async move {
            client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(!exists("plain_audit").await, "off creates no audit table");
    let err = plain.audit(&client, "k").await.unwrap_err();
    assert!(
        matches!(err, Error::NotAudited { ref table } if table == "plain"),
        "{err}"
    );

    // One table, written through an audited and an unaudited `FencedTable`: only the
    // audited writes leave rows.
    let audited = audited(&client, "shared").await;
    assert!(exists("shared_audit").await);
    let unaudited = FencedTable::new("shared").unwrap();
    for (table, fence) in [
        (&audited, 1),
        (&unaudited, 2),
        (&unaudited, 3),
        (&audited, 4),
    ] {
        assert!(table
            .write(&client, "k", Fence(fence), b"v")
            .await
            .unwrap()
            .is_written());
    }
    let fences: Vec<u64> = audited
        .audit(&client, "k")
        .await
        .unwrap()
        .iter()
        .map(|row| row.fence.0)
        .collect();
    assert_eq!(fences, [1, 4]);
}
