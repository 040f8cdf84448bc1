//! Every public future of ratewall-redis is `Send`, so a backend can be built and
//! used inside `tokio::spawn` or an axum handler. Checked at compile time:
//! this file does not build if one of them is not. The futures are created
//! and dropped, never polled, so no Redis server is needed.

use std::future::Future;

use ratewall::{
    Key, Limit,
    backend::{Backend, Request},
};
use ratewall_redis::{CallMode, RedisBackend};

/// Compiles only for a `Send` future; returns it unpolled.
fn send<F: Future + Send>(future: F) -> F {
    future
}

/// Compiles only for a `Send + Sync` value.
fn send_sync<T: Send + Sync>(_: &T) {}

#[test]
fn connecting_futures_are_send() {
    drop(send(RedisBackend::connect("redis://127.0.0.1:1/")));
    drop(send(
        RedisBackend::builder("redis://127.0.0.1:1/")
            .call_mode(CallMode::Scripts)
            .connect(),
    ));
    #[cfg(feature = "cluster")]
    {
        drop(send(RedisBackend::connect_cluster([
            "redis://127.0.0.1:1/",
        ])));
        drop(send(
            RedisBackend::cluster_builder(["redis://127.0.0.1:1/"]).connect(),
        ));
    }
    #[cfg(feature = "sentinel")]
    {
        drop(send(RedisBackend::connect_sentinel(
            ["redis://127.0.0.1:1/"],
            "mymaster",
        )));
        drop(send(
            RedisBackend::sentinel_builder(["redis://127.0.0.1:1/"], "mymaster").connect(),
        ));
    }
    send_sync(&RedisBackend::builder("redis://127.0.0.1:1/"));
}

/// Every future a connected backend hands out. Never called: the compiler
/// type-checks it all the same, which is the check.
#[allow(dead_code)]
fn backend_futures_are_send(backend: &RedisBackend) {
    send_sync(backend);
    let key = Key::new("p", "s", "id");
    let limit = Limit::per_minute(1).expect("limit");
    let requests = [Request::new(&key, &limit, 1)];
    drop(send(backend.acquire(&requests)));
    drop(send(backend.acquire_once(&requests, "id")));
    drop(send(backend.peek(&requests)));
    drop(send(backend.refund(&requests, 0)));
    drop(send(backend.reset(&requests)));
    drop(send(backend.publish_limits("p", "s", &[limit])));
    drop(send(backend.registered_limits("p")));
    drop(send(backend.registered("p", "s")));
}
