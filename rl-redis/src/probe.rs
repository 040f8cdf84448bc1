//! What answers at an address when connecting to it failed in a way that
//! says it may not speak Redis the way the URL asked (an HTTP server, a TLS
//! port reached without TLS, a plain port reached with TLS): one more, raw
//! look with a short timeout, so the error says so in a sentence instead of
//! a parser's complaint about byte 84.

use std::time::Duration;

use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest one look at an address may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The most of an answer read (and the most of its first line shown).
const ANSWER_BYTES: usize = 256;
const SHOWN_CHARS: usize = 60;

/// The first byte of every RESP2 and RESP3 reply type.
const RESP_TYPES: &[u8] = b"+-:$*%_,#!=(>|~";

/// One TCP address of a target, as its URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Address {
    host: String,
    port: u16,
    tls: bool,
    /// `valkey` for `valkey://` and `valkeys://`, else `redis`: the family
    /// of the scheme suggested instead.
    family: &'static str,
}

impl Address {
    fn shown(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The TCP addresses of `urls` (Unix sockets and URLs that do not parse
/// are left out: there is nothing to look at).
pub(crate) fn addresses<'u>(urls: impl IntoIterator<Item = &'u str>) -> Vec<Address> {
    urls.into_iter()
        .filter_map(|url| {
            let family = if url.trim_start().to_ascii_lowercase().starts_with("valkey") {
                "valkey"
            } else {
                "redis"
            };
            let (url, tls) = crate::url::plain(url).ok()?;
            let info = url.into_connection_info().ok()?;
            let ConnectionAddr::Tcp(host, port) = info.addr() else {
                return None;
            };
            let (host, port) = (host.clone(), *port);
            Some(Address {
                host,
                port,
                tls,
                family,
            })
        })
        .collect()
}

/// Whether `error`, met while connecting, may come from a server speaking
/// something else: a reply that is not RESP, or a connection reset, closed
/// or broken rather than refused (a TLS port reached without TLS resets
/// it; a TLS handshake with a plain server fails reading its answer).
pub(crate) fn worth_probing(error: &RedisError) -> bool {
    match error.kind() {
        ErrorKind::Parse => true,
        // A timeout too: a TLS handshake with a plain server waits for an
        // answer that never comes (the look is bounded, and taken only
        // once the connection has failed).
        ErrorKind::Io => !error.is_connection_refusal(),
        _ => error.is_connection_dropped(),
    }
}

/// A sentence saying what answers at the first of `addresses` that
/// explains the failure, if any does: `not a Redis server at
/// 127.0.0.1:8080: it answered "HTTP/1.1 400 Bad Request"`, `not a Redis
/// server at 127.0.0.1:6380 without TLS: it speaks TLS; for TLS use
/// rediss://`, `no TLS at 127.0.0.1:6379: it answers plain Redis; without
/// TLS use redis://`. All the looks together take at most `timeout`.
pub(crate) async fn explain(addresses: &[Address], timeout: Duration) -> Option<String> {
    let looks = async {
        for address in addresses {
            if let Some(sentence) = explain_one(address, timeout).await {
                return Some(sentence);
            }
        }
        None
    };
    tokio::time::timeout(timeout, looks).await.ok().flatten()
}

/// What a server sent back to `PING` on a plain connection.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A RESP reply (`+PONG`, `-NOAUTH ...`): a Redis server.
    Resp,
    /// A TLS record (an alert or a handshake message).
    Tls,
    /// Something else; its first line.
    Other(String),
    /// The connection was closed or reset before any byte came back.
    Closed,
    /// No answer (nothing within the timeout, or no connection at all).
    Nothing,
}

async fn explain_one(address: &Address, timeout: Duration) -> Option<String> {
    let at = address.shown();
    let answer = plain_answer(address, timeout).await;
    if address.tls {
        return (answer == Answer::Resp).then(|| {
            format!(
                "no TLS at {at}: it answers plain Redis; without TLS use {}://",
                address.family
            )
        });
    }
    let use_tls = format!("for TLS use {}s://", address.family);
    match answer {
        Answer::Resp | Answer::Nothing => None,
        Answer::Tls => Some(format!(
            "not a Redis server at {at} without TLS: it speaks TLS; {use_tls}"
        )),
        Answer::Other(line) => Some(format!("not a Redis server at {at}: it answered {line:?}")),
        Answer::Closed if speaks_tls(address, timeout).await => Some(format!(
            "not a Redis server at {at} without TLS: it speaks TLS; {use_tls}"
        )),
        Answer::Closed => Some(format!(
            "not a Redis server at {at}: it closed the connection without answering PING \
             (a TLS port does that: {use_tls}{})",
            if cfg!(feature = "__tls") {
                ""
            } else {
                ", with the `tls` or `tls-aws-lc-rs` feature of ratewall-redis"
            }
        )),
    }
}

/// Sends `PING` on a plain TCP connection and classifies what comes back.
async fn plain_answer(address: &Address, timeout: Duration) -> Answer {
    let looked = tokio::time::timeout(timeout, async {
        let Ok(mut stream) = TcpStream::connect((address.host.as_str(), address.port)).await else {
            return Answer::Nothing;
        };
        if stream.write_all(b"PING\r\n").await.is_err() {
            return Answer::Closed;
        }
        let mut buffer = vec![0_u8; ANSWER_BYTES];
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => Answer::Closed,
            Ok(read) => classify(&buffer[..read]),
        }
    })
    .await;
    looked.unwrap_or(Answer::Nothing)
}

fn classify(bytes: &[u8]) -> Answer {
    match bytes {
        [first, ..] if RESP_TYPES.contains(first) => Answer::Resp,
        [0x15 | 0x16, 0x03, ..] => Answer::Tls,
        _ => {
            let line = bytes
                .split(|b| *b == b'\r' || *b == b'\n')
                .next()
                .unwrap_or_default();
            let text: String = String::from_utf8_lossy(line)
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .take(SHOWN_CHARS)
                .collect();
            Answer::Other(text)
        }
    }
}

/// Whether the server answers a TLS ClientHello with a TLS record (made
/// by rustls; the certificate is never checked: only the protocol counts).
#[cfg(feature = "__tls")]
async fn speaks_tls(address: &Address, timeout: Duration) -> bool {
    use std::sync::Arc;

    let Ok(config) = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = config
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let Ok(name) = rustls::pki_types::ServerName::try_from(address.host.clone()) else {
        return false;
    };
    let Ok(mut client) = rustls::ClientConnection::new(Arc::new(config), name) else {
        return false;
    };
    let mut hello = Vec::new();
    if client.write_tls(&mut hello).is_err() {
        return false;
    }
    let looked = tokio::time::timeout(timeout, async {
        let mut stream = TcpStream::connect((address.host.as_str(), address.port))
            .await
            .ok()?;
        stream.write_all(&hello).await.ok()?;
        let mut head = [0_u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        Some(matches!(head, [0x15 | 0x16, 0x03]))
    })
    .await;
    looked.ok().flatten().unwrap_or(false)
}

#[cfg(not(feature = "__tls"))]
async fn speaks_tls(_: &Address, _: Duration) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_apart_by_their_first_bytes() {
        assert_eq!(classify(b"+PONG\r\n"), Answer::Resp);
        assert_eq!(
            classify(b"-NOAUTH Authentication required.\r\n"),
            Answer::Resp
        );
        assert_eq!(classify(&[0x15, 0x03, 0x01, 0x00, 0x02]), Answer::Tls);
        assert_eq!(classify(&[0x16, 0x03, 0x03, 0x00, 0x7a]), Answer::Tls);
        assert_eq!(
            classify(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
            Answer::Other("HTTP/1.1 400 Bad Request".to_owned())
        );
        assert_eq!(
            classify(b"SSH-2.0-OpenSSH_9.2\x07"),
            Answer::Other("SSH-2.0-OpenSSH_9.2?".to_owned())
        );
    }

    #[test]
    fn addresses_come_from_tcp_urls_and_remember_tls_and_the_scheme_family() {
        let found = addresses([
            "redis://127.0.0.1:6379/",
            "valkey://h:7000",
            "redis+unix:///run/redis.sock",
            "not a url",
            "rediss://[::1]:6380/",
        ]);
        assert_eq!(
            found,
            [
                Address {
                    host: "127.0.0.1".to_owned(),
                    port: 6379,
                    tls: false,
                    family: "redis"
                },
                Address {
                    host: "h".to_owned(),
                    port: 7000,
                    tls: false,
                    family: "valkey"
                },
                Address {
                    host: "::1".to_owned(),
                    port: 6380,
                    tls: true,
                    family: "redis"
                },
            ]
        );
        assert_eq!(found[0].shown(), "127.0.0.1:6379");
        assert_eq!(found[2].shown(), "[::1]:6380");
    }

    #[test]
    fn refused_connections_and_server_errors_are_not_probed() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(!worth_probing(&refused));
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(worth_probing(&reset));
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS"));
        assert!(!worth_probing(&auth));
    }
}
