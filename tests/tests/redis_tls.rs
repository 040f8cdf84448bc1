//! TLS (`rediss://`, the `tls` feature of ratewall-redis) against real
//! `redis-server` processes started with `--tls-port` and a certificate
//! chain this test generates (rcgen: a private CA, a server certificate for
//! 127.0.0.1, a client certificate): standalone, mutual TLS, a cluster
//! whose nodes talk TLS to clients and to each other, and a master found
//! through a sentinel, both over TLS; an application that installs its
//! own rustls provider after the backend connected; and refund notices
//! heard over TLS.

use std::fs;
use std::path::PathBuf;

use ratewall::{
    Algorithm, Key, Limit,
    backend::{Backend, Request},
    error::BackendError,
};
use ratewall_redis::{CallMode, RedisBackend, RedisUrl};
use ratewall_tests::harness::{PortReservation, RedisCluster, RedisSentinel, RedisServer, TempDir};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A private CA with a server and a client certificate, written as PEM
/// files for redis-server.
struct Pki {
    dir: TempDir,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Pki {
    fn generate() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ratewall-redis test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("self-signed CA");

        let leaf = |name: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params =
                CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                    .expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &ca).expect("signed by the CA");
            (cert.pem(), key.serialize_pem())
        };
        // Cluster nodes present their server certificate as clients too,
        // on the cluster bus.
        let (server_cert, server_key) = leaf(
            "redis-server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert_pem, client_key_pem) = leaf(
            "ratewall-redis client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );

        let dir = TempDir::new("tls-pki");
        let pki = Self {
            dir,
            ca_pem: ca.pem(),
            client_cert_pem,
            client_key_pem,
        };
        fs::write(pki.path("ca.crt"), &pki.ca_pem).expect("write ca.crt");
        fs::write(pki.path("server.crt"), server_cert).expect("write server.crt");
        fs::write(pki.path("server.key"), server_key).expect("write server.key");
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `redis-server` arguments serving TLS on `tls_port` (the harness keeps
    /// its plain port to see the server come up).
    fn server_args(&self, tls_port: u16, require_client_certificates: bool) -> Vec<String> {
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.path("server.crt").display().to_string(),
            "--tls-key-file",
            &self.path("server.key").display().to_string(),
            "--tls-ca-cert-file",
            &self.path("ca.crt").display().to_string(),
            "--tls-auth-clients",
            if require_client_certificates {
                "yes"
            } else {
                "no"
            },
        ]
        .map(String::from)
        .to_vec()
    }
}

fn start(pki: &Pki, require_client_certificates: bool) -> (RedisServer, PortReservation) {
    let tls_port = PortReservation::new();
    let args = pki.server_args(tls_port.port(), require_client_certificates);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (RedisServer::start_with(&args), tls_port)
}

fn rediss(port: &PortReservation) -> String {
    format!("rediss://127.0.0.1:{}/", port.port())
}

async fn decide_twice(backend: &RedisBackend, identity: &str) {
    let limit = Limit::per_minute(1)
        .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
        .expect("limit");
    let key = Key::new("tls", "otp", identity);
    let request = [Request::new(&key, &limit, 1)];
    assert!(backend.acquire(&request).await.expect("acquire").allowed());
    let refused = backend.acquire(&request).await.expect("acquire");
    assert!(!refused.allowed());
    assert!(refused[0].retry_after().as_secs() > 50);
}

#[tokio::test]
async fn rediss_with_a_private_ca_decides_on_a_tls_only_port_in_both_call_modes() {
    let pki = Pki::generate();
    let (server, tls_port) = start(&pki, false);
    for mode in [CallMode::Functions, CallMode::Scripts] {
        let backend = RedisBackend::builder(rediss(&tls_port))
            .tls_root_certificates(pki.ca_pem.as_bytes())
            .call_mode(mode)
            .connect()
            .await
            .expect("connect over TLS");
        assert_eq!(backend.call_mode(), mode);
        decide_twice(&backend, &format!("{mode:?}")).await;
    }
    // The port really speaks TLS only: plain text gets nowhere.
    let plain = RedisBackend::builder(format!("redis://127.0.0.1:{}/", tls_port.port()))
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_millis(500))
        .connect()
        .await;
    assert!(plain.is_err(), "plain text was answered on the TLS port");
    drop(server);
}

#[tokio::test]
async fn a_url_asking_for_the_wrong_transport_says_which_scheme_to_use() {
    let pki = Pki::generate();
    let (server, tls_port) = start(&pki, false);
    // redis:// to the TLS port: the server resets the connection.
    let plain_to_tls = format!("redis://127.0.0.1:{}/", tls_port.port());
    let error = RedisBackend::builder(plain_to_tls.as_str())
        .connect_timeout(std::time::Duration::from_secs(2))
        .connect()
        .await
        .expect_err("plain text on a TLS port");
    assert_eq!(
        error.to_string(),
        format!(
            "backend protocol error: connecting to {plain_to_tls}: not a Redis server at \
             127.0.0.1:{} without TLS: it speaks TLS; for TLS use rediss://",
            tls_port.port()
        )
    );
    // rediss:// to the plain port: the handshake waits for an answer that
    // never comes, until the connect timeout.
    let tls_to_plain = format!("rediss://127.0.0.1:{}/", server.port());
    let error = RedisBackend::builder(tls_to_plain.as_str())
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect_timeout(std::time::Duration::from_secs(1))
        .connect()
        .await
        .expect_err("TLS on a plain port");
    assert_eq!(
        error.to_string(),
        format!(
            "backend protocol error: connecting to {tls_to_plain}: no TLS at 127.0.0.1:{}: \
             it answers plain Redis; without TLS use redis://",
            server.port()
        )
    );
    // The same through the one URL grammar, with valkey schemes.
    let valkey = format!("valkey://127.0.0.1:{}/", tls_port.port())
        .parse::<RedisUrl>()
        .expect("a valkey:// URL");
    let error = valkey
        .connect()
        .await
        .expect_err("plain text on a TLS port");
    assert!(
        error.to_string().ends_with("for TLS use valkeys://"),
        "{error}"
    );
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_refused_with_an_error() {
    let pki = Pki::generate();
    let (_server, tls_port) = start(&pki, false);
    let other = Pki::generate();
    let error = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(other.ca_pem.as_bytes())
        .connect_timeout(std::time::Duration::from_secs(3))
        .connect()
        .await
        .expect_err("the server's certificate is not signed by this CA");
    eprintln!("unknown CA: {error}");
    assert!(error.to_string().contains("certificate"), "{error}");
    assert!(
        matches!(
            error,
            BackendError::Unavailable(_) | BackendError::Protocol(_) | BackendError::Timeout(_)
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_client_certificate_is_presented_when_the_server_requires_one() {
    let pki = Pki::generate();
    let (_server, tls_port) = start(&pki, true);
    let without = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect_timeout(std::time::Duration::from_secs(3))
        .timeout(std::time::Duration::from_millis(500))
        .connect()
        .await;
    let error = without.expect_err("connected without a client certificate");
    eprintln!("no client certificate: {error}");
    assert!(error.to_string().contains("Certificate"), "{error}");
    let backend = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .tls_client_certificate(
            pki.client_cert_pem.as_bytes(),
            pki.client_key_pem.as_bytes(),
        )
        .connect()
        .await
        .expect("connect with a client certificate");
    decide_twice(&backend, "mtls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_decides_across_hash_tags_with_the_library_on_every_master() {
    let pki = Pki::generate();
    let tls_ports: Vec<PortReservation> = (0..3).map(|_| PortReservation::new()).collect();
    let node_args = tls_ports
        .iter()
        .map(|port| {
            let mut args = pki.server_args(port.port(), false);
            args.extend(["--tls-cluster", "yes"].map(String::from));
            args
        })
        .collect();
    let cluster = RedisCluster::start_with_node_args(node_args);
    let backend = RedisBackend::cluster_builder(tls_ports.iter().map(rediss))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("connect to the cluster over TLS");
    assert!(backend.is_cluster());
    assert_eq!(backend.call_mode(), CallMode::Functions);
    // The cluster backends of one process share one TLS configuration:
    // another with the same certificates connects, one with other roots is
    // refused, saying why.
    let same = RedisBackend::cluster_builder(tls_ports.iter().map(rediss))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("a second cluster backend with the same certificates");
    decide_twice(&same, "same-certificates").await;
    let other = Pki::generate();
    let refused = RedisBackend::cluster_builder(tls_ports.iter().map(rediss))
        .tls_root_certificates(other.ca_pem.as_bytes())
        .connect()
        .await
        .expect_err("a cluster backend with other certificates than a live one");
    assert!(
        refused
            .to_string()
            .contains("the cluster backends of one process share one TLS configuration"),
        "{refused}"
    );
    for master in cluster.masters() {
        let listed: redis::Value = master
            .cmd(&[
                "FUNCTION",
                "LIST",
                "LIBRARYNAME",
                RedisBackend::library_name(),
            ])
            .await;
        assert!(
            matches!(listed, redis::Value::Array(ref items) if !items.is_empty()),
            "no library on master {}",
            master.port()
        );
    }
    // Identities on every master, and a call over two hash tags.
    for n in 0..30 {
        decide_twice(&backend, &format!("user-{n}")).await;
    }
    let per_phone = Limit::per_minute(1).expect("limit");
    let per_ip = Limit::per_hour(2).expect("limit");
    let ip = Key::new("tls", "ip", "203.0.113.9");
    let mut admitted = 0;
    for phone in 0..4 {
        let phone = Key::from_display("tls", "phone", &phone);
        let batch = [
            Request::new(&phone, &per_phone, 1),
            Request::new(&ip, &per_ip, 1),
        ];
        admitted += usize::from(backend.acquire(&batch).await.expect("acquire").allowed());
    }
    assert_eq!(admitted, 2, "the per-IP limit admits two phones");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_found_through_a_sentinel_is_reached_over_tls() {
    let pki = Pki::generate();
    let (master, master_tls) = start(&pki, false);
    let sentinel_tls = PortReservation::new();
    let tls = pki.server_args(sentinel_tls.port(), false);
    // The sentinel's TLS directives, and TLS towards the master it monitors.
    let mut extra: Vec<String> = tls
        .chunks(2)
        .map(|kv| kv.join(" ").replace("--", ""))
        .collect();
    extra.push("tls-replication yes".to_owned());
    let sentinel = RedisSentinel::start_monitoring_with_config(
        "tls-master",
        master_tls.port(),
        1,
        1_000,
        5_000,
        &extra.join("\n"),
    );
    let backend = RedisBackend::sentinel_builder([rediss(&sentinel_tls)], "tls-master")
        .master_tls(true)
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("connect through the sentinel over TLS");
    assert!(backend.is_sentinel());
    decide_twice(&backend, "sentinel").await;
    let stats: String = master.cmd(&["INFO", "commandstats"]).await;
    assert!(
        stats.contains("cmdstat_fcall:calls="),
        "decided on the master: {stats}"
    );
    drop(sentinel);
}

/// A backend on a TLS server and one on a master found through a TLS
/// sentinel, which both decided, leave rustls' process-wide provider
/// alone: the application installs its own afterwards (ring here, as it
/// would aws-lc-rs) and gets `Ok`, and both backends keep deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_installs_its_own_rustls_provider_after_connecting_over_tls() {
    let pki = Pki::generate();
    let (_server, tls_port) = start(&pki, false);
    let standalone = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("connect over TLS");
    decide_twice(&standalone, "before-standalone").await;

    let (_master, master_tls) = start(&pki, false);
    let sentinel_tls = PortReservation::new();
    let mut extra: Vec<String> = pki
        .server_args(sentinel_tls.port(), false)
        .chunks(2)
        .map(|kv| kv.join(" ").replace("--", ""))
        .collect();
    extra.push("tls-replication yes".to_owned());
    let _sentinel = RedisSentinel::start_monitoring_with_config(
        "provider-master",
        master_tls.port(),
        1,
        1_000,
        5_000,
        &extra.join("\n"),
    );
    let sentinel = RedisBackend::sentinel_builder([rediss(&sentinel_tls)], "provider-master")
        .master_tls(true)
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("connect through the sentinel over TLS");
    decide_twice(&sentinel, "before-sentinel").await;

    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "connecting over TLS installed a process-wide rustls provider"
    );
    let installed = rustls::crypto::ring::default_provider().install_default();
    assert!(
        installed.is_ok(),
        "the application could not install its own provider"
    );
    decide_twice(&standalone, "after-standalone").await;
    decide_twice(&sentinel, "after-sentinel").await;
    // A backend connected after the application's install works as well.
    let later = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .connect()
        .await
        .expect("connect over TLS after the install");
    decide_twice(&later, "after-later").await;
}

/// The connection over TLS is this crate's own (redis-rs' reconnecting
/// manager makes only its own TLS connections): after the server restarts,
/// the first calls fail and a later one connects again and decides (the
/// library loaded again into the empty server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_over_tls_connects_again_after_the_server_restarts() {
    let pki = Pki::generate();
    let (server, tls_port) = start(&pki, false);
    let backend = RedisBackend::builder(rediss(&tls_port))
        .tls_root_certificates(pki.ca_pem.as_bytes())
        .timeout(std::time::Duration::from_millis(500))
        .connect()
        .await
        .expect("connect over TLS");
    decide_twice(&backend, "before-restart").await;
    let server = std::sync::Arc::new(server);
    let restarting = server.clone();
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .expect("restart");
    let limit = Limit::per_minute(1).expect("limit");
    let key = Key::new("tls", "otp", "after-restart");
    let request = [Request::new(&key, &limit, 1)];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut failures = Vec::new();
    loop {
        match backend.acquire(&request).await {
            Ok(decisions) => {
                assert!(decisions.allowed(), "a fresh identity after the restart");
                break;
            }
            Err(error) => failures.push(error.to_string()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no call decided within 10 s of the restart: {failures:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Refund notices over TLS: each backend subscribes on a TLS connection of
/// this crate's own, and a refund by one limiter clears the refusal the
/// other remembers well within its deny cache's hold (1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_notices_are_heard_over_tls() {
    let pki = Pki::generate();
    let (server, tls_port) = start(&pki, false);
    let limiter = || async {
        let backend = RedisBackend::builder(rediss(&tls_port))
            .tls_root_certificates(pki.ca_pem.as_bytes())
            .connect()
            .await
            .expect("connect over TLS");
        ratewall::Limiter::builder()
            .backend(backend)
            .prefix("tls")
            .build()
            .expect("limiter")
    };
    let (a, b) = (limiter().await, limiter().await);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // (The harness's own connection is on the plain port.)
        let counts: Vec<redis::Value> = server.cmd(&["PUBSUB", "NUMSUB", "tls:{refunds}"]).await;
        if counts.get(1) == Some(&redis::Value::Int(2)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not subscribed: {counts:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Both subscriptions came in on the TLS port.
    let clients: String = server.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
    let tls_address = format!("laddr=127.0.0.1:{} ", tls_port.port());
    assert_eq!(clients.lines().count(), 2, "{clients}");
    assert!(
        clients.lines().all(|line| line.contains(&tls_address)),
        "{clients}"
    );
    let limit = Limit::per_hour(1).expect("limit");
    let key = a.key("otp", &"alice");
    let call = [Request::new(&key, &limit, 1)];
    let taken = a.requests().acquire_all(&call).await.expect("decided");
    for _ in 0..2 {
        assert!(b.requests().check("otp", &call, None).await.is_err());
    }
    let at = taken.iter().next().expect("one decision").at_micros();
    a.requests().refund_all(&call, at).await.expect("refund");
    let start = std::time::Instant::now();
    while b.requests().check("otp", &call, None).await.is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let delay = start.elapsed();
    assert!(
        delay <= std::time::Duration::from_millis(100),
        "the refund was usable after {delay:?}"
    );
}
