//! A `BackendError` keeps the Redis error behind it as its `source()`, so a
//! program can read the kind of failure instead of parsing a message. Both
//! cases fail before any command: a port nothing listens on, and a URL that
//! is not one; no Redis server is needed.

use std::error::Error as _;
use std::time::Duration;

use ratewall::error::BackendError;
use ratewall_redis::RedisBackend;

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

#[tokio::test]
async fn a_refused_connection_is_unavailable_with_the_redis_error_as_source() {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let error = RedisBackend::builder(&url)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect_err("nothing listens on the port");
    assert!(matches!(error, BackendError::Unavailable(_)), "{error:?}");
    let source = error.source().expect("the Redis error is kept");
    let redis = source
        .downcast_ref::<redis::RedisError>()
        .unwrap_or_else(|| panic!("the source is the redis::RedisError itself: {source:?}"));
    assert_eq!(redis.kind(), redis::ErrorKind::Io, "{redis:?}");
    assert!(redis.is_connection_refusal(), "{redis:?}");
    // Clones share the source.
    let copy = error.clone();
    assert!(
        copy.source()
            .unwrap()
            .downcast_ref::<redis::RedisError>()
            .is_some()
    );
}

#[tokio::test]
async fn an_invalid_url_is_unavailable_with_the_redis_error_as_source() {
    let error = RedisBackend::connect("not-a-url")
        .await
        .expect_err("not a Redis URL");
    assert!(error.to_string().contains("invalid Redis URL"), "{error}");
    let redis = error
        .source()
        .and_then(|e| e.downcast_ref::<redis::RedisError>())
        .unwrap_or_else(|| panic!("the parse error is kept: {error:?}"));
    assert_eq!(
        redis.kind(),
        redis::ErrorKind::InvalidClientConfig,
        "{redis:?}"
    );
}
