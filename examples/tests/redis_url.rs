//! One URL grammar: the services (`REDIS_URL`) and the `ratewall` CLI (`--redis`)
//! accept and refuse exactly the same strings, both through
//! `ratewall_redis::RedisUrl`, with the same sentence saying what is wrong,
//! and both name an address that does not speak Redis. The real binaries,
//! against ports where nothing listens (so an accepted URL fails only when
//! connecting) and a local HTTP-speaking listener.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::run_to_exit;
use ratewall_redis::RedisUrl;

const SMS: &str = env!("CARGO_BIN_EXE_sms");
const LOGIN: &str = env!("CARGO_BIN_EXE_login");
const GATEWAY: &str = env!("CARGO_BIN_EXE_gateway");

/// A password every URL of the table may carry: never printed.
const SECRET: &str = "hunter2-u7";

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `ratewall --redis <url> --timeout 1s limits`: exit code and stderr.
fn admin(url: &str) -> (i32, String) {
    let output = Command::new(common::ratewall_cli())
        .args(["--redis", url, "--timeout", "1s", "limits"])
        .env_remove("REDIS_URL")
        .output()
        .expect("run ratewall");
    (
        output.status.code().expect("ratewall exited"),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// A service started with `REDIS_URL=<url>`: exit code and stderr.
fn service(binary: &str, url: &str) -> (i32, String) {
    let (code, stderr) = run_to_exit(binary, &[("REDIS_URL", url)], Duration::from_secs(30));
    (code.expect("the service exited"), stderr)
}

/// The table: each URL, and for a refused one what its refusal must say.
fn table() -> Vec<(String, Option<&'static str>)> {
    let (p, q) = (closed_port(), closed_port());
    let accepted = [
        format!("redis://127.0.0.1:{p}/"),
        format!("redis://:{SECRET}@127.0.0.1:{p}/0"),
        format!("valkey://127.0.0.1:{p}"),
        format!("rediss://127.0.0.1:{p}/"),
        "redis+unix:///nonexistent/ratewall-test.sock".to_owned(),
        format!("unix:///nonexistent/ratewall-test.sock?pass={SECRET}"),
        format!("redis://127.0.0.1:{p},redis://:{SECRET}@127.0.0.1:{q}"),
        format!("redis+sentinel://127.0.0.1:{p}/mymaster"),
        format!("redis+sentinel://:{SECRET}@127.0.0.1:{p},127.0.0.1:{q}/mymaster/0"),
        format!("valkey+sentinel://127.0.0.1:{p}/mymaster"),
    ];
    let refused = [
        ("not a url", "no scheme"),
        ("127.0.0.1:6379", "no scheme"),
        ("http://:hunter2-u7@host/", "unknown scheme `http://`"),
        ("redis://host:99999/", "invalid port"),
        ("redis://host/x", "database"),
        ("redis://a:1,,redis://b:2", "node 2 of the list is empty"),
        ("redis://a:1,redis+unix:///s", "Unix socket"),
        ("redis://a:1/1,redis://b:2", "only database 0"),
        (
            "redis://a:1,redis+sentinel://b:2/m",
            "cannot be one node of a list",
        ),
        ("redis+sentinel://:hunter2-u7@h1,h2", "no master name"),
        ("redis+sentinel://h1/m?db=1", "no query"),
    ];
    accepted
        .into_iter()
        .map(|url| (url, None))
        .chain(
            refused
                .into_iter()
                .map(|(url, reason)| (url.to_owned(), Some(reason))),
        )
        .collect()
}

#[test]
fn the_services_and_the_cli_accept_and_refuse_the_same_urls_with_the_same_reason() {
    let table = table();
    // The services wait up to 5 s on an address that never answers: run
    // every row at once.
    let runs: Vec<((i32, String), (i32, String))> = std::thread::scope(|scope| {
        let handles: Vec<_> = table
            .iter()
            .map(|(url, _)| scope.spawn(move || (admin(url), service(SMS, url))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((url, refusal), ((admin_code, admin_err), (sms_code, sms_err))) in table.iter().zip(runs) {
        assert_eq!(sms_code, 1, "{url}: {sms_err}");
        for stderr in [&admin_err, &sms_err] {
            assert!(
                !stderr.contains(SECRET),
                "{url}: a password printed: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{url}: {stderr}");
        }
        match refusal {
            Some(reason) => {
                let error = url.parse::<RedisUrl>().expect_err(url);
                assert!(error.reason().contains(reason), "{url}: {error}");
                assert_eq!(admin_code, 2, "{url}: {admin_err}");
                assert_eq!(admin_err.trim_end(), format!("ratewall: {error}"), "{url}");
                assert_eq!(
                    sms_err.trim_end(),
                    format!("sms: REDIS_URL: {error}"),
                    "{url}"
                );
            }
            None => {
                let parsed: RedisUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
                // Accepted by both: each fails only when connecting.
                assert_eq!(admin_code, 1, "{url}: {admin_err}");
                assert!(
                    admin_err.contains(&format!("Redis at {parsed} failed while connecting")),
                    "{url}: {admin_err}"
                );
                assert!(!sms_err.contains("invalid Redis URL"), "{url}: {sms_err}");
                if let Some(master) = parsed.master_name() {
                    assert!(
                        sms_err.contains(&format!("the master `{master}` of the sentinels")),
                        "{url}: {sms_err}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_service_reads_redis_url_with_the_same_grammar() {
    let url = "redis://a:1,,redis://b:2";
    let error = url.parse::<RedisUrl>().unwrap_err();
    for (binary, name) in [(LOGIN, "login"), (GATEWAY, "gateway")] {
        let (code, stderr) = service(binary, url);
        assert_eq!(code, 1, "{name}: {stderr}");
        assert_eq!(stderr.trim_end(), format!("{name}: REDIS_URL: {error}"));
    }
}

#[test]
fn an_address_answering_http_is_named_not_a_redis_server_by_both() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0_u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let url = format!("redis://127.0.0.1:{port}/");
    let sentence =
        format!("not a Redis server at 127.0.0.1:{port}: it answered \"HTTP/1.1 400 Bad Request\"");
    let (admin_code, admin_err) = admin(&url);
    assert_eq!(admin_code, 1, "{admin_err}");
    assert!(admin_err.contains(&sentence), "{admin_err}");
    let (sms_code, sms_err) = service(SMS, &url);
    assert_eq!(sms_code, 1, "{sms_err}");
    assert_eq!(
        sms_err.trim_end(),
        format!(
            "sms: cannot use Redis at {url}: backend protocol error: connecting to {url}: {sentence}"
        )
    );
}
