//! TLS of this crate's own (features `tls`, `tls-aws-lc-rs`): a rustls
//! client configuration built with an explicit crypto provider, and the
//! connections made with it.
//!
//! redis-rs 1.8's own TLS (its `tls-rustls` feature) builds a rustls
//! configuration on every connection with `rustls::ClientConfig::builder()`,
//! which takes the process-wide default provider and, when there is none,
//! installs one chosen from rustls' crate features (or panics when those
//! name two): after one connection, an application could no longer install
//! a provider of its own, and redis-rs offers no way to hand it a
//! configuration. So this crate turns on no TLS feature of redis-rs: it
//! opens the TCP connection, runs the handshake with [`Connector`]'s
//! configuration (built with [`provider`], never the process default) and
//! hands the stream to redis-rs ([`MultiplexedConnection::new_with_config`],
//! [`PubSub::new`]), which speaks RESP over it. The process-wide default is
//! never read nor installed.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, RedisConnectionInfo, RedisError, RedisResult};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod standalone;

#[cfg(not(any(feature = "tls", feature = "tls-aws-lc-rs")))]
compile_error!(
    "ratewall-redis' TLS needs a crypto provider: turn on feature `tls` (ring) or `tls-aws-lc-rs` (aws-lc-rs), not `__tls` alone"
);

/// The name of the crypto provider [`provider`] returns, for messages.
#[cfg(feature = "tls-aws-lc-rs")]
pub(crate) const PROVIDER: &str = "aws-lc-rs";
/// The name of the crypto provider [`provider`] returns, for messages.
#[cfg(all(feature = "tls", not(feature = "tls-aws-lc-rs")))]
pub(crate) const PROVIDER: &str = "ring";

/// The crypto provider of every TLS connection of this crate: aws-lc-rs
/// with feature `tls-aws-lc-rs` (also when `tls` is on: `tls-aws-lc-rs` is
/// only ever turned on on purpose, while `tls` may come from another
/// crate's features), else ring.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "tls-aws-lc-rs")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(all(feature = "tls", not(feature = "tls-aws-lc-rs")))]
    let provider = rustls::crypto::ring::default_provider();
    Arc::new(provider)
}

/// What a backend's TLS connections trust and present.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Certificates {
    /// CA certificates (PEM) trusted instead of the system's roots.
    pub(crate) roots: Option<Vec<u8>>,
    /// A client certificate chain and its private key (both PEM).
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Certificates")
            .field("roots", &self.roots.as_ref().map(|_| "<PEM>"))
            .field("client", &self.client.as_ref().map(|_| "<PEM>"))
            .finish()
    }
}

/// Makes TLS connections with one configuration: the [`provider`], the
/// roots and client certificate of [`Certificates`].
#[derive(Clone)]
pub(crate) struct Connector {
    tls: TlsConnector,
    /// How long a connection may take: TCP, handshake and redis-rs' setup.
    connect_timeout: Duration,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("provider", &PROVIDER)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// The configuration of `certificates`; `Err` says what is wrong with
    /// them (or that the system has no root certificates to trust).
    pub(crate) fn new(
        certificates: &Certificates,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let roots = roots(certificates.roots.as_deref())?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("the {PROVIDER} crypto provider: {error}"))?
            .with_root_certificates(roots);
        let config = match &certificates.client {
            Some((chain, key)) => {
                let chain = CertificateDer::pem_slice_iter(chain)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| format!("the client certificate chain (PEM): {error}"))?;
                if chain.is_empty() {
                    return Err("the client certificate chain holds no PEM certificate".to_owned());
                }
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|error| format!("the client private key (PEM): {error}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| format!("the client certificate and key: {error}"))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            tls: TlsConnector::from(Arc::new(config)),
            connect_timeout,
        })
    }

    /// A TLS stream to `host:port`, checked against `host` (a name or an
    /// IP address).
    async fn stream(&self, host: &str, port: u16) -> io::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_owned()).map_err(|error| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{host}` is not a TLS server name: {error}"),
            )
        })?;
        let tcp = TcpStream::connect((host, port)).await?;
        self.tls.connect(name, tcp).await
    }

    /// A multiplexed connection over TLS to `host:port`, logged in with
    /// `redis`, with `config`'s response timeout; `TimedOut` past the
    /// connect timeout. Its driver runs on a task of the current runtime
    /// and ends with the connection's last clone.
    pub(crate) async fn multiplexed(
        &self,
        host: &str,
        port: u16,
        redis: &RedisConnectionInfo,
        config: AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        let connecting = async {
            let stream = self.stream(host, port).await?;
            let (connection, driver) =
                MultiplexedConnection::new_with_config(redis, stream, config).await?;
            tokio::spawn(driver);
            Ok(connection)
        };
        self.in_time(connecting).await
    }

    /// A RESP2 pub/sub connection over TLS to `host:port`, logged in with
    /// `redis` (a sentinel's `+switch-master` announcements, refund
    /// notices).
    pub(crate) async fn pubsub(
        &self,
        host: &str,
        port: u16,
        redis: &RedisConnectionInfo,
    ) -> RedisResult<PubSub> {
        let connecting = async {
            let stream = self.stream(host, port).await?;
            PubSub::new(redis, stream).await
        };
        self.in_time(connecting).await
    }

    async fn in_time<T>(&self, connecting: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
        tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connecting over TLS timed out",
                )))
            })
    }
}

/// The roots to trust: those of `pem`, else the system's.
fn roots(pem: Option<&[u8]>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match pem {
        Some(pem) => {
            for certificate in CertificateDer::pem_slice_iter(pem) {
                let certificate =
                    certificate.map_err(|error| format!("the root certificates (PEM): {error}"))?;
                store
                    .add(certificate)
                    .map_err(|error| format!("a root certificate: {error}"))?;
            }
            if store.is_empty() {
                return Err("the root certificates given hold no PEM certificate".to_owned());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (_, unusable) = store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "no root certificate to trust: the system's store gave none{}{} (give the \
                     CA with RedisBackendBuilder::tls_root_certificates)",
                    if unusable > 0 {
                        format!(" usable ({unusable} unreadable)")
                    } else {
                        String::new()
                    },
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", errors.join("; "))
                    }
                ));
            }
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(certificates: Certificates) -> String {
        Connector::new(&certificates, Duration::from_secs(1)).unwrap_err()
    }

    #[test]
    fn pem_that_holds_no_certificate_is_refused_with_what_is_wrong() {
        let error = refused(Certificates {
            roots: Some(b"not a certificate".to_vec()),
            client: None,
        });
        assert!(error.contains("hold no PEM certificate"), "{error}");
        // Building a configuration never touches the process-wide provider.
        assert!(CryptoProvider::get_default().is_none());
    }
}
