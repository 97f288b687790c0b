//! One exchange with Redis as a synchronous state machine: `AUTH` on a new connection,
//! the request, and after `NOSCRIPT` the script's `SCRIPT LOAD` and the request again.
//!
//! It does no I/O and tells no time. [`Exchange::next`] says what to do next (write
//! these bytes of the write buffer, flush, read into the read buffer from here, or
//! stop: the final reply is at the start of the read buffer), [`Exchange::did`] takes
//! what the connection did. The service's async shell only carries that out, so the
//! logic is plain code linked once, whatever the connection type, instead of a
//! generic async state machine (kilobytes of flash on a microcontroller).

use core::cell::Cell;

use embedded_io_async::ErrorKind;

use crate::error::ProtocolError;
use crate::resp::{self, parse, Partial, Reply, Scalar, Window};
use crate::service::{Auth, Request};
use crate::ServerError;

/// What the shell does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Write the first `n` bytes of the write buffer (`n > 0`).
    Write(usize),
    /// Flush the connection: the command is written.
    Flush,
    /// Read into the read buffer from this offset on (it has room).
    Read(usize),
    /// Done: the request's reply, this long, is at the start of the read buffer.
    Done(usize),
}

/// Why an exchange failed: small and `Copy`, so passing it costs nothing. A refusal
/// of `AUTH` or of `SCRIPT LOAD` leaves Redis's error line in the read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    Connect,
    Io(ErrorKind),
    Closed,
    Timeout,
    Protocol(ProtocolError),
    /// `SCRIPT LOAD` answered an error (in the read buffer).
    Server,
    /// `AUTH` answered an error (in the read buffer).
    AuthRefused,
}

/// Which command of the exchange is on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// `AUTH`, first on a new connection.
    Auth,
    /// The request itself.
    Request,
    /// `SCRIPT LOAD` of the request's script, after `NOSCRIPT`.
    Load,
}

/// Where the current command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Bytes `sent..` of the command are still to be written.
    Send,
    /// Written; the flush is next.
    Flush,
    /// Flushed; `len` bytes of its reply are in the read buffer.
    Read,
}

/// One exchange's progress.
pub(crate) struct Exchange<'c> {
    step: Step,
    phase: Phase,
    sent: usize,
    /// How many bytes the last [`Next::Write`] asked to write: a count above it (a
    /// stream breaking its contract) is taken as all of them, never as more.
    asked: usize,
    len: usize,
    reloaded: bool,
    /// The service's count of reloads, raised when `NOSCRIPT` comes (whether the
    /// reload then succeeds, fails or times out).
    reloads: &'c Cell<u32>,
}

impl<'c> Exchange<'c> {
    /// An exchange that starts with `AUTH` if `authenticate`, else with the request;
    /// it counts a reload in `reloads`.
    pub(crate) fn new(authenticate: bool, reloads: &'c Cell<u32>) -> Exchange<'c> {
        Exchange {
            step: if authenticate {
                Step::Auth
            } else {
                Step::Request
            },
            phase: Phase::Send,
            sent: 0,
            asked: 0,
            len: 0,
            reloaded: false,
            reloads,
        }
    }

    /// What to do next. `auth` is the service's credentials; `read` holds what
    /// [`did`](Self::did) counted; `write` gets the next bytes to send.
    pub(crate) fn next(
        &mut self,
        request: &Request<'_>,
        auth: Option<&Auth<'_>>,
        read: &[u8],
        write: &mut [u8],
    ) -> Result<Next, Fault> {
        loop {
            match self.phase {
                Phase::Send => {
                    let mut window = Window::new(self.sent, write);
                    match (self.step, auth, request.script()) {
                        (Step::Auth, Some(auth), _) => Request::Auth(auth).encode(&mut window),
                        (Step::Load, _, Some((source, _))) => {
                            Request::Load { source }.encode(&mut window)
                        }
                        _ => request.encode(&mut window),
                    }
                    if window.len() > 0 {
                        self.asked = window.len();
                        return Ok(Next::Write(self.asked));
                    }
                    self.phase = Phase::Flush;
                }
                Phase::Flush => return Ok(Next::Flush),
                Phase::Read => {
                    let filled = read.get(..self.len).unwrap_or(&[]);
                    match parse(filled) {
                        Ok((reply, used)) if used == self.len => {
                            if let Some(done) = self.answered(request, reply)? {
                                return Ok(done);
                            }
                        }
                        // Bytes after the reply answer nothing we asked.
                        Ok(_) => return Err(Fault::Protocol(ProtocolError::TrailingBytes)),
                        Err(Partial::Malformed) => {
                            return Err(Fault::Protocol(ProtocolError::Malformed))
                        }
                        Err(Partial::Incomplete) if self.len < read.len() => {
                            return Ok(Next::Read(self.len))
                        }
                        Err(Partial::Incomplete) => {
                            return Err(Fault::Protocol(ProtocolError::ReplyTooLong))
                        }
                    }
                }
            }
        }
    }

    /// What the connection did with the last [`Next`]: `n` bytes written or read (a
    /// flush passes 0). Writing or reading nothing is an error: no progress is ever
    /// waited for again.
    pub(crate) fn did(&mut self, n: usize) -> Result<(), Fault> {
        match self.phase {
            Phase::Send if n == 0 => return Err(Fault::Io(ErrorKind::WriteZero)),
            Phase::Send => self.sent = self.sent.saturating_add(n.min(self.asked)),
            Phase::Flush => self.phase = Phase::Read,
            Phase::Read if n == 0 => return Err(Fault::Closed),
            Phase::Read => self.len = self.len.saturating_add(n),
        }
        Ok(())
    }

    /// A whole reply to the current command: the final one, or the next command.
    fn answered(&mut self, request: &Request<'_>, reply: Reply<'_>) -> Result<Option<Next>, Fault> {
        let script = request.script();
        match (self.step, reply) {
            (Step::Auth, Reply::Scalar(Scalar::Simple(b"OK"))) => {}
            (Step::Auth, Reply::Error(_)) => return Err(Fault::AuthRefused),
            (Step::Load, Reply::Error(_)) => return Err(Fault::Server),
            (Step::Load, Reply::Scalar(Scalar::Bulk(Some(answer)))) => {
                if script.is_none_or(|(_, sha)| !resp::same(answer, sha.as_bytes())) {
                    return Err(Fault::Protocol(ProtocolError::WrongSha));
                }
            }
            (Step::Auth | Step::Load, _) => return Err(Fault::Protocol(ProtocolError::Unexpected)),
            (Step::Request, Reply::Error(line))
                if !self.reloaded
                    && script.is_some()
                    && resp::same(ServerError::from_line(line).code_bytes(), b"NOSCRIPT") =>
            {
                // Redis forgot the script (a restart, SCRIPT FLUSH, a failover): load
                // it and ask again, once.
                self.reloaded = true;
                self.reloads.set(self.reloads.get().wrapping_add(1));
                self.step = Step::Load;
                self.restart();
                return Ok(None);
            }
            (Step::Request, _) => return Ok(Some(Next::Done(self.len))),
        }
        self.step = Step::Request;
        self.restart();
        Ok(None)
    }

    /// The next command starts from its first byte, with an empty read buffer.
    fn restart(&mut self) {
        self.phase = Phase::Send;
        self.sent = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts;
    use std::vec::Vec;

    /// Runs an exchange to its end against `replies` (one per command sent, each
    /// handed out `chunk` bytes a read once its command is flushed), with a write
    /// buffer of `w` bytes and writes of at most 3 bytes; returns what was written,
    /// how it ended (the final reply's text on success), and whether it reloaded.
    fn run(
        request: &Request<'_>,
        auth: Option<&Auth<'_>>,
        replies: &[&[u8]],
        w: usize,
        chunk: usize,
    ) -> (Vec<u8>, Result<Vec<u8>, Fault>, bool) {
        let reloads = Cell::new(0);
        let mut exchange = Exchange::new(auth.is_some(), &reloads);
        let (mut read, mut write) = ([0u8; 256], std::vec![0u8; w]);
        let (mut wire, mut at, mut commands) = (Vec::new(), 0, 0);
        for _ in 0..100_000 {
            let n = match exchange.next(request, auth, &read, &mut write) {
                Ok(Next::Write(n)) => {
                    assert!(n > 0 && n <= w);
                    let n = n.min(3);
                    wire.extend_from_slice(&write[..n]);
                    n
                }
                Ok(Next::Flush) => {
                    commands += 1;
                    at = 0;
                    0
                }
                Ok(Next::Read(from)) => {
                    let reply = replies.get(commands - 1).copied().unwrap_or(&[]);
                    let rest = &reply[at.min(reply.len())..];
                    let n = chunk.min(rest.len()).min(read.len() - from);
                    read[from..from + n].copy_from_slice(&rest[..n]);
                    at += n;
                    n
                }
                Ok(Next::Done(len)) => {
                    return (wire, Ok(read[..len].to_vec()), (reloads.get() > 0))
                }
                Err(fault) => return (wire, Err(fault), (reloads.get() > 0)),
            };
            if let Err(fault) = exchange.did(n) {
                return (wire, Err(fault), (reloads.get() > 0));
            }
        }
        panic!("the exchange never ended");
    }

    fn renew<'r>(key: &'r str, token: &'r leasehold::EncodedToken) -> Request<'r> {
        Request::Renew {
            key,
            token,
            fence: u64::MAX,
            ms: 300,
            script: scripts::RENEW_PAIR,
        }
    }

    #[test]
    fn requests_of_any_size_pass_through_a_write_buffer_of_any_size() {
        let token = leasehold::Owner([1; 16]).token(leasehold::Term(2)).encode();
        let key = "k".repeat(300);
        let request = renew(&key, &token);
        let mut whole = [0u8; 1024];
        let mut window = Window::new(0, &mut whole);
        request.encode(&mut window);
        let len = window.len();
        let want = whole[..len].to_vec();
        for w in [1, 7, 64, 1024] {
            let (wire, end, _) = run(&request, None, &[b":1\r\n"], w, 1);
            assert_eq!(wire, want, "write buffer of {w}");
            assert_eq!(end, Ok(b":1\r\n".to_vec()));
        }
    }

    #[test]
    fn a_write_count_above_what_was_asked_skips_nothing() {
        let token = leasehold::Owner([1; 16]).token(leasehold::Term(2)).encode();
        let request = renew("k", &token);
        let reloads = Cell::new(0);
        let mut exchange = Exchange::new(false, &reloads);
        let (read, mut write) = ([0u8; 16], [0u8; 8]);
        let mut wire = Vec::new();
        while let Ok(Next::Write(n)) = exchange.next(&request, None, &read, &mut write) {
            wire.extend_from_slice(&write[..n]);
            // The stream claims twice what it was given.
            exchange.did(2 * n).unwrap();
        }
        let mut whole = [0u8; 256];
        let mut window = Window::new(0, &mut whole);
        request.encode(&mut window);
        let len = window.len();
        assert_eq!(wire, whole[..len].to_vec());
    }

    #[test]
    fn auth_then_request_and_a_noscript_reload_once() {
        let token = leasehold::Owner([1; 16]).token(leasehold::Term(2)).encode();
        let request = renew("k", &token);
        let auth = Auth {
            user: None,
            password: "pw",
        };
        let sha = scripts::RENEW_SHA;
        let load = std::format!("${}\r\n{sha}\r\n", sha.len());
        let replies = [
            &b"+OK\r\n"[..],
            b"-NOSCRIPT No matching script\r\n",
            load.as_bytes(),
            b":0\r\n",
        ];
        for chunk in [1, 5, 1000] {
            let (wire, end, reloaded) = run(&request, Some(&auth), &replies, 16, chunk);
            assert_eq!(end, Ok(b":0\r\n".to_vec()), "chunk {chunk}");
            let wire = std::string::String::from_utf8(wire).unwrap();
            let auth_at = wire.find("AUTH").unwrap();
            let load_at = wire.find("SCRIPT").unwrap();
            assert_eq!(wire.matches("EVALSHA").count(), 2);
            assert!(auth_at < wire.find("EVALSHA").unwrap() && load_at > auth_at);
            assert!(wire.contains(scripts::RENEW));
            assert!(reloaded);
        }
        // A second NOSCRIPT is the answer, not a reason to load again.
        let replies = [
            &b"-NOSCRIPT x\r\n"[..],
            load.as_bytes(),
            b"-NOSCRIPT No matching script\r\n",
        ];
        let (wire, end, _) = run(&request, None, &replies, 64, 1000);
        assert_eq!(end, Ok(b"-NOSCRIPT No matching script\r\n".to_vec()));
        assert_eq!(
            std::string::String::from_utf8(wire)
                .unwrap()
                .matches("SCRIPT")
                .count(),
            1
        );
    }

    #[test]
    fn bad_answers_are_faults_never_a_done() {
        let token = leasehold::Owner([1; 16]).token(leasehold::Term(2)).encode();
        let request = renew("k", &token);
        let auth = Auth {
            user: None,
            password: "pw",
        };
        let protocol = |p| Err(Fault::Protocol(p));
        for (auth, replies, want) in [
            (
                Some(&auth),
                &[&b"-WRONGPASS x\r\n"[..]][..],
                Err(Fault::AuthRefused),
            ),
            (
                Some(&auth),
                &[b":1\r\n"],
                protocol(ProtocolError::Unexpected),
            ),
            (
                None,
                &[b"-NOSCRIPT x\r\n", b"-ERR no\r\n"],
                Err(Fault::Server),
            ),
            (
                None,
                &[b"-NOSCRIPT x\r\n", b"$3\r\nabc\r\n"],
                protocol(ProtocolError::WrongSha),
            ),
            (
                None,
                &[b":1\r\n:1\r\n"],
                protocol(ProtocolError::TrailingBytes),
            ),
            (None, &[b":01\r\n"], protocol(ProtocolError::Malformed)),
            (None, &[b":1"], Err(Fault::Closed)),
            (None, &[b"*9\r\n"], protocol(ProtocolError::Malformed)),
            (
                None,
                &[&[b'$'; 300][..]],
                protocol(ProtocolError::ReplyTooLong),
            ),
        ] {
            let (_, end, _) = run(&request, auth, replies, 64, 1000);
            assert_eq!(end.map(|_| ()), want, "{replies:?}");
        }
        let long = std::format!("${}\r\n{}\r\n", 300, "x".repeat(300));
        let (_, end, _) = run(&request, None, &[long.as_bytes()], 64, 7);
        assert_eq!(end.map(|_| ()), protocol(ProtocolError::ReplyTooLong));
    }
}
