//! The quarantine after a loss of state: how this crate notices that etcd may have
//! forgotten grants that are still alive, and grants nothing until they have expired.
//!
//! etcd is durable (a member acknowledges a write once it is in a quorum's log), so it
//! loses grants only when an operator restores it from a backup (a snapshot older than
//! the latest grants), or runs a new cluster on the old endpoints. Three signs of that,
//! checked by every acquire that finds its key free:
//!
//! * **The epoch marker** `<prefix>{leasehold}epoch` is missing (a new or emptied data
//!   set), or names another cluster id than the one answering, or a raft term above
//!   the one answering (terms only grow in a cluster's life; a restored member starts
//!   again at term 1). Its value is `<cluster id> <raft term>` in decimal, kept up to
//!   date by the grants (`0 0`: a marker written by hand for a new data set, which
//!   names no cluster and no term yet).
//! * **This client's memory**: the highest revision any linearizable answer carried.
//!   An answer to a request sent afterwards must carry at least that revision; a lower
//!   one means the store went back in time. Any request may notice it (a renewal's
//!   ownership read, a release), and then the quarantine is started at once, for every
//!   client.
//!
//! A quarantine is the key `<prefix>{leasehold}quarantine`, attached to an etcd lease
//! of the longest TTL any client may ask for (`max_ttl`): etcd deletes it on its own
//! monotonic clock when that has passed, and restarts its countdown (like every
//! lease's) when a new leader is elected, which only lengthens it. Grants compare that
//! the key is absent, so no grant slips in while it stands.
//!
//! Keys have no braces, so no lock key (nor its fence counter, `<key>{fence}`) can be
//! one of these two.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use etcd_client::proto::PbResponseHeader;

/// The epoch marker's name under `prefix`.
pub(crate) fn marker_key(prefix: &str) -> String {
    format!("{prefix}{{leasehold}}epoch")
}

/// The quarantine key's name under `prefix`.
pub(crate) fn quarantine_key(prefix: &str) -> String {
    format!("{prefix}{{leasehold}}quarantine")
}

/// The epoch marker's value: which cluster, at which raft term, last confirmed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The cluster id (0: not known yet).
    pub(crate) cluster: u64,
    /// The highest raft term a grant saw.
    pub(crate) term: u64,
}

impl Marker {
    /// What a header says now.
    pub(crate) fn of(header: &PbResponseHeader) -> Marker {
        Marker {
            cluster: header.cluster_id,
            term: header.raft_term,
        }
    }

    /// Parses `<cluster> <term>`; `None` for anything else.
    pub(crate) fn parse(value: &[u8]) -> Option<Marker> {
        let text = std::str::from_utf8(value).ok()?;
        let (cluster, term) = text.split_once(' ')?;
        Some(Marker {
            cluster: cluster.parse().ok()?,
            term: term.parse().ok()?,
        })
    }

    /// The stored form.
    pub(crate) fn encode(self) -> String {
        format!("{} {}", self.cluster, self.term)
    }

    /// Why a data set with this marker, answered by `now`, may have lost grants, if
    /// it may have: another cluster, or a term that went back.
    pub(crate) fn lost_since(self, now: Marker) -> Option<&'static str> {
        if self.cluster != 0 && self.cluster != now.cluster {
            Some("the epoch marker names another cluster id (a new cluster on these endpoints, or a restore)")
        } else if self.term > now.term {
            Some("the raft term went back since the epoch marker was written (etcd was restored from a backup)")
        } else {
            None
        }
    }

    /// Whether a grant should write `now` over this marker (it learned something).
    pub(crate) fn behind(self, now: Marker) -> bool {
        self.cluster != now.cluster || self.term < now.term
    }
}

/// What one service remembers of etcd's history, to notice it going back.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// The highest revision a linearizable answer carried.
    revision: AtomicI64,
    /// A rollback was seen and no quarantine has been written for it yet: no grant
    /// until one is.
    rolled_back: AtomicBool,
}

impl Memory {
    /// The revision to compare an answer with: take it before sending the request.
    pub(crate) fn before(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    /// Takes in the header of a linearizable answer to a request sent after
    /// [`before`](Self::before) returned `before`; whether the store went back.
    pub(crate) fn observe(&self, header: Option<&PbResponseHeader>, before: i64) -> bool {
        let Some(revision) = header.map(|h| h.revision).filter(|&r| r > 0) else {
            return false;
        };
        if revision < before {
            // From here on the store's history is the restored one.
            self.revision.store(revision, Ordering::Release);
            self.rolled_back.store(true, Ordering::Release);
            return true;
        }
        self.revision.fetch_max(revision, Ordering::AcqRel);
        false
    }

    /// Whether a rollback was seen and no quarantine written for it yet.
    pub(crate) fn rolled_back(&self) -> bool {
        self.rolled_back.load(Ordering::Acquire)
    }

    /// A quarantine stands at etcd now (written, or found): the rollback is answered.
    pub(crate) fn quarantined(&self) {
        self.rolled_back.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(cluster: u64, term: u64, revision: i64) -> PbResponseHeader {
        PbResponseHeader {
            cluster_id: cluster,
            raft_term: term,
            revision,
            ..PbResponseHeader::default()
        }
    }

    #[test]
    fn markers_round_trip_and_name_what_went_back() {
        let m = Marker::of(&header(7, 3, 10));
        assert_eq!(Marker::parse(m.encode().as_bytes()), Some(m));
        assert_eq!(
            Marker::parse(b"0 0"),
            Some(Marker {
                cluster: 0,
                term: 0
            })
        );
        for garbage in [&b""[..], b"7", b"7 x", b"-1 2", b"7  3", b"\xff 1"] {
            assert_eq!(Marker::parse(garbage), None, "{garbage:?}");
        }
        let now = Marker {
            cluster: 7,
            term: 3,
        };
        assert_eq!(
            Marker {
                cluster: 0,
                term: 0
            }
            .lost_since(now),
            None
        );
        assert_eq!(
            Marker {
                cluster: 7,
                term: 3
            }
            .lost_since(now),
            None
        );
        assert!(Marker {
            cluster: 8,
            term: 1
        }
        .lost_since(now)
        .is_some());
        assert!(Marker {
            cluster: 7,
            term: 4
        }
        .lost_since(now)
        .is_some());
        assert!(Marker {
            cluster: 0,
            term: 0
        }
        .behind(now));
        assert!(!now.behind(now));
    }

    #[test]
    fn a_revision_below_one_seen_before_the_request_is_a_rollback() {
        let memory = Memory::default();
        assert!(!memory.observe(Some(&header(1, 2, 100)), memory.before()));
        let before = memory.before();
        assert_eq!(before, 100);
        // Concurrent answers may arrive in any order: only what was seen before the
        // request was sent counts.
        assert!(!memory.observe(Some(&header(1, 2, 90)), 0));
        assert!(!memory.observe(Some(&header(1, 2, 100)), before));
        assert!(!memory.rolled_back());
        assert!(memory.observe(Some(&header(1, 2, 40)), before));
        assert!(memory.rolled_back(), "until a quarantine is written");
        assert!(memory.rolled_back());
        memory.quarantined();
        assert!(!memory.rolled_back());
        assert_eq!(memory.before(), 40, "the restored history is the one kept");
        assert!(!memory.observe(None, 1_000));
    }
}
