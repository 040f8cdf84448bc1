//! A loopback TCP proxy in front of a real Redis that can lose a reply.
//!
//! [`Proxy::start`] listens on `127.0.0.1:0` and forwards every connection to
//! the upstream server, byte for byte, cutting the server's stream into
//! RESP replies. [`Proxy::drop_next_reply`] arms a switch: the next complete
//! reply from Redis to a client is discarded, that connection then stays
//! silent for [`Proxy::HOLD`] (the client's call times out, as when a reply
//! is lost on the network after the server ran the command) and is closed,
//! so the client reconnects.
//!
//! Closing matters: Redis clients match replies to requests by order, so a
//! connection that lost one reply but stayed open would hand every later
//! reply to the wrong request.
//!
//! ```no_run
//! # async fn demo(server: &ratewall_tests::RedisServer) {
//! use ratewall_tests::proxy::Proxy;
//!
//! let proxy = Proxy::start(server.port()).await;
//! let client = redis::Client::open(proxy.url()).unwrap();
//! proxy.drop_next_reply();
//! // The next command sent through `client` runs on the server, but its
//! // reply never arrives.
//! assert_eq!(proxy.replies_dropped(), 0);
//! # }
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The switch and counters shared with the connection tasks.
#[derive(Debug, Default)]
struct State {
    drop_next: AtomicBool,
    dropped: AtomicU64,
    accepted: AtomicU64,
}

/// A running proxy; dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// How long a connection that lost a reply stays silent before the proxy
    /// closes it.
    pub const HOLD: Duration = Duration::from_secs(1);

    /// Starts a proxy on a free loopback port forwarding to
    /// `127.0.0.1:upstream_port`. Must be called inside a Tokio runtime.
    ///
    /// # Panics
    ///
    /// Panics if no loopback port can be bound.
    pub async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
        let state = Arc::new(State::default());
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // Dropped with the accept task: aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        shared.accepted.fetch_add(1, Ordering::Relaxed);
                        connections.spawn(serve(client, upstream, shared.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Self { addr, state, task }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// Arms the switch: the next complete reply from Redis (on any
    /// connection) is discarded and its connection goes silent, then closes.
    pub fn drop_next_reply(&self) {
        self.state.drop_next.store(true, Ordering::SeqCst);
    }

    /// How many replies were discarded so far.
    pub fn replies_dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// How many client connections were accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards one client connection until either side closes, or until it
/// lost a reply and was held silent for [`Proxy::HOLD`].
async fn serve(client: TcpStream, upstream: SocketAddr, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upward = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    // Ends with `true` when a reply was lost.
    let downward = async {
        let mut pending: Vec<u8> = Vec::with_capacity(16 * 1024);
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            let read = match server_read.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(read) => read,
            };
            pending.extend_from_slice(&chunk[..read]);
            let mut forward_upto = 0;
            while let Some(len) = frame_len(&pending[forward_upto..]) {
                if state.drop_next.swap(false, Ordering::SeqCst) {
                    state.dropped.fetch_add(1, Ordering::SeqCst);
                    // Forward what came before the lost reply, then go silent.
                    let _ = client_write.write_all(&pending[..forward_upto]).await;
                    return true;
                }
                forward_upto += len;
            }
            if forward_upto > 0 {
                if client_write
                    .write_all(&pending[..forward_upto])
                    .await
                    .is_err()
                {
                    return false;
                }
                pending.drain(..forward_upto);
            }
        }
    };
    // Whichever direction ends first closes both sockets.
    let lost = tokio::select! {
        () = upward => false,
        lost = downward => lost,
    };
    if lost {
        // A broken network: nothing more reaches Redis, nothing comes back;
        // the client's call times out, then its connection is closed.
        drop((server_read, server_write));
        tokio::time::sleep(Proxy::HOLD).await;
    }
    drop((client_read, client_write));
}

/// The length of the first complete RESP2/RESP3 value in `buf`, if complete.
fn frame_len(buf: &[u8]) -> Option<usize> {
    let mut pos = 0;
    skip_value(buf, &mut pos)?;
    Some(pos)
}

/// The line at `pos` (without `\r\n`), moving `pos` past it.
fn line<'b>(buf: &'b [u8], pos: &mut usize) -> Option<&'b [u8]> {
    let rest = buf.get(*pos..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    *pos += end + 2;
    Some(&rest[..end])
}

fn number(line: &[u8]) -> Option<i64> {
    std::str::from_utf8(line).ok()?.parse().ok()
}

fn skip_value(buf: &[u8], pos: &mut usize) -> Option<()> {
    let kind = *buf.get(*pos)?;
    *pos += 1;
    let header = line(buf, pos)?;
    let count = |elements_per_item: i64| -> Option<i64> {
        Some(number(header).unwrap_or(0).max(0) * elements_per_item)
    };
    match kind {
        // Blob types: length, payload, CRLF (a negative length is a null).
        b'$' | b'!' | b'=' => {
            let len = number(header).unwrap_or(-1);
            if len >= 0 {
                let end = *pos + usize::try_from(len).ok()? + 2;
                if buf.len() < end {
                    return None;
                }
                *pos = end;
            }
            Some(())
        }
        // Aggregates of n values.
        b'*' | b'~' | b'>' => {
            for _ in 0..count(1)? {
                skip_value(buf, pos)?;
            }
            Some(())
        }
        // Maps: n key/value pairs.
        b'%' => {
            for _ in 0..count(2)? {
                skip_value(buf, pos)?;
            }
            Some(())
        }
        // An attribute map precedes the value it describes.
        b'|' => {
            for _ in 0..count(2)? {
                skip_value(buf, pos)?;
            }
            skip_value(buf, pos)
        }
        // Simple strings, errors, integers, nulls, doubles, booleans, big
        // numbers, and anything unknown: one line.
        _ => Some(()),
    }
}

#[cfg(test)]
mod tests {
    use super::frame_len;

    #[test]
    fn replies_are_cut_at_resp_value_boundaries() {
        assert_eq!(frame_len(b"+OK\r\n+OK\r\n"), Some(5));
        assert_eq!(frame_len(b":12\r\n"), Some(5));
        assert_eq!(frame_len(b"$3\r\nabc\r\n:1\r\n"), Some(9));
        assert_eq!(frame_len(b"$-1\r\n"), Some(5));
        assert_eq!(frame_len(b"*2\r\n:1\r\n$2\r\nab\r\n"), Some(16));
        assert_eq!(frame_len(b"*2\r\n:1\r\n$2\r\na"), None);
        assert_eq!(frame_len(b"%1\r\n+a\r\n:1\r\n"), Some(12));
        assert_eq!(frame_len(b"*3\r\n:1"), None);
        assert_eq!(frame_len(b""), None);
        assert_eq!(frame_len(b"-ERR x\r\n"), Some(8));
    }
}
