//! Every SQL statement the service sends, built once per table name.
//!
//! Each request is one statement (autocommit: PostgreSQL runs it in a transaction of
//! its own), sent unnamed with its parameter types (`query_typed`: Parse, Bind,
//! Execute and Sync in one round trip, no prepared statement left on the session),
//! so the service keeps no session state and works through a transaction-mode
//! pooler. Time is read on the server: `clock_timestamp()`, the server's wall clock
//! at the moment of the call (not `now()`, which is the start of the transaction).

use leasehold_storage::TableName;

/// The longest table name: the epoch table's name appends `_epoch` (6 bytes), and
/// PostgreSQL truncates identifiers at 63 bytes.
pub(crate) const MAX_TABLE_NAME: usize = 57;

/// How much longer than what is left of its lease a lease-checked transaction may sit
/// idle before PostgreSQL ends its session.
pub(crate) const GUARD_IDLE_GRACE_MS: u64 = 1_000;

/// A duration in whole microseconds, rounded up, from an interval expression.
fn micros(interval: &str) -> String {
    format!("ceil(extract(epoch FROM {interval}) * 1000000)::bigint")
}

/// The statements for one lease table.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    pub(crate) table: String,
    pub(crate) epoch: String,
    pub(crate) create: String,
    pub(crate) ensure_row: String,
    pub(crate) acquire: String,
    pub(crate) renew: String,
    pub(crate) release: String,
    pub(crate) holder: String,
    pub(crate) raise_fence: String,
    pub(crate) mark_new: String,
    pub(crate) probe: String,
    pub(crate) guard_begin: String,
    pub(crate) guard_check: String,
}

impl Statements {
    pub(crate) fn new(name: &TableName) -> Statements {
        let t = name.as_str();
        let e = format!("{t}_epoch");
        let remaining = micros("cur.expires_at - now.t");
        let quarantine = micros(
            "coalesce((SELECT until FROM ep), (SELECT until FROM mark), \
             now.t + $5 * interval '1 microsecond') - now.t",
        );
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    \
                 key        TEXT        PRIMARY KEY,\n    \
                 owner      TEXT,\n    \
                 fence      BIGINT      NOT NULL DEFAULT 0 CHECK (fence >= 0),\n    \
                 identity   TEXT        NOT NULL DEFAULT '',\n    \
                 expires_at TIMESTAMPTZ\n);\n\
                 CREATE UNLOGGED TABLE IF NOT EXISTS {e} (\n    \
                 id               SMALLINT    PRIMARY KEY CHECK (id = 1),\n    \
                 postmaster_start TIMESTAMPTZ NOT NULL,\n    \
                 quarantine_until TIMESTAMPTZ NOT NULL\n);"
            ),
            ensure_row: format!("INSERT INTO {t} (key) VALUES ($1) ON CONFLICT (key) DO NOTHING"),
            // $1 key, $2 owner token, $3 identity, $4 TTL µs, $5 max_ttl µs. The row is
            // locked first; the clock is read once, after the lock (a contender that
            // waited for a lease-checked transaction judges the row at its own
            // handling time, not at the time it started waiting).
            acquire: format!(
                "WITH locked AS MATERIALIZED (\n    \
                 SELECT owner, fence, identity, expires_at FROM {t} WHERE key = $1 FOR UPDATE\n\
                 ), now AS MATERIALIZED (\n    \
                 SELECT clock_timestamp() AS t, pg_postmaster_start_time() AS started FROM locked\n\
                 ), cur AS MATERIALIZED (\n    \
                 SELECT locked.*, (owner IS NOT NULL AND expires_at > now.t) AS held\n    \
                 FROM locked, now\n\
                 ), ep AS MATERIALIZED (\n    \
                 SELECT e.quarantine_until AS until FROM {e} e, now\n    \
                 WHERE e.id = 1 AND e.postmaster_start = now.started\n\
                 ), mark AS (\n    \
                 INSERT INTO {e} AS e (id, postmaster_start, quarantine_until)\n    \
                 SELECT 1, now.started, now.t + $5 * interval '1 microsecond' FROM now, cur\n    \
                 WHERE NOT cur.held AND NOT EXISTS (SELECT 1 FROM ep)\n    \
                 ON CONFLICT (id) DO UPDATE SET postmaster_start = EXCLUDED.postmaster_start,\n        \
                 quarantine_until = EXCLUDED.quarantine_until\n    \
                 WHERE e.postmaster_start <> EXCLUDED.postmaster_start\n    \
                 RETURNING e.quarantine_until AS until\n\
                 ), granted AS (\n    \
                 UPDATE {t} l SET owner = $2, identity = $3,\n        \
                 expires_at = now.t + $4 * interval '1 microsecond',\n        \
                 fence = CASE WHEN cur.held THEN cur.fence ELSE GREATEST(cur.fence + 1,\n            \
                 floor(extract(epoch FROM now.t) * 1000000)::bigint) END\n    \
                 FROM now, cur\n    \
                 WHERE l.key = $1 AND CASE WHEN cur.held THEN cur.owner = $2\n        \
                 ELSE EXISTS (SELECT 1 FROM ep WHERE ep.until <= now.t) END\n    \
                 RETURNING l.fence\n\
                 )\n\
                 SELECT cur.held, cur.owner = $2 AS mine, cur.fence, cur.identity,\n    \
                 {remaining} AS remaining,\n    \
                 (SELECT fence FROM granted) AS granted,\n    \
                 {quarantine} AS quarantine\n\
                 FROM cur, now"
            ),
            // $1 key, $2 owner token, $3 fence, $4 TTL µs. `clock_timestamp()` is read
            // after the row lock is taken (a row that changed while waiting is
            // checked again), and the expiry set is never before the check.
            renew: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $4 * interval '1 microsecond'\n\
                 WHERE key = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()\n\
                 RETURNING fence"
            ),
            // $1 key, $2 owner token. The row stays: its fence is the key's counter.
            release: format!(
                "UPDATE {t} SET owner = NULL, identity = '', expires_at = NULL\n\
                 WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()\n\
                 RETURNING fence"
            ),
            // $1 key.
            holder: format!(
                "SELECT identity, fence, {}\n\
                 FROM {t} WHERE key = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()",
                micros("expires_at - clock_timestamp()")
            ),
            // $1 key, $2 fence.
            raise_fence: format!(
                "INSERT INTO {t} AS l (key, fence) VALUES ($1, $2)\n\
                 ON CONFLICT (key) DO UPDATE SET fence = GREATEST(l.fence, EXCLUDED.fence)\n\
                 RETURNING fence"
            ),
            mark_new: format!(
                "INSERT INTO {e} (id, postmaster_start, quarantine_until)\n\
                 VALUES (1, pg_postmaster_start_time(), clock_timestamp())\n\
                 ON CONFLICT (id) DO UPDATE SET postmaster_start = EXCLUDED.postmaster_start,\n    \
                 quarantine_until = EXCLUDED.quarantine_until"
            ),
            probe: format!(
                "SELECT key, owner, fence, identity, expires_at FROM {t} WHERE false\n\
                 UNION ALL SELECT NULL, NULL, NULL, NULL, quarantine_until FROM {e} WHERE false"
            ),
            // $1 key, $2 owner token, $3 fence. `FOR KEY SHARE`: contenders' acquires
            // (`FOR UPDATE`) wait for the transaction; the holder's renewals (`FOR NO
            // KEY UPDATE`) and its other lease-checked transactions do not. The statement timeout is what is left
            // of the lease, the idle timeout a second more (a holder that comes back
            // just after its lease ended gets a clean refusal at its commit, not a
            // closed connection), so a stalled holder frees the row by then.
            guard_begin: format!(
                "SELECT fence, set_config('statement_timeout', left_ms::text, true),\n    \
                 set_config('idle_in_transaction_session_timeout', (left_ms + {GUARD_IDLE_GRACE_MS})::text, true)\n\
                 FROM (SELECT fence, greatest(1, ceil(extract(epoch FROM expires_at - \
                 clock_timestamp()) * 1000))::bigint AS left_ms\n    \
                 FROM {t} WHERE key = $1 AND owner = $2 AND fence = $3\n    \
                 AND expires_at > clock_timestamp() FOR KEY SHARE) AS held"
            ),
            guard_check: format!(
                "SELECT fence FROM {t}\n\
                 WHERE key = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()"
            ),
            table: t.to_owned(),
            epoch: e,
        }
    }
}
