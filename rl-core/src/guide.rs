// The user guide: one page per subject, written in Markdown under
// `rl-core/docs/guide/` and included here, so that docs.rs shows it and
// `cargo test --doc` compiles and runs every example in it (a page that
// names a removed method breaks the build).
//
// Each page is included for documentation always; for doctests, only
// where its examples can build: a page needing a cargo feature is tested
// when that feature is on (CI's `cargo test --workspace` turns every
// feature on), and the pages whose examples need `ratewall-redis` are
// tested by `ratewall-redis`'s doctests, which include them too.
// `ratewall-tests`' `docs_compiled` test holds every page and the README
// to this: each Rust block is compiled somewhere, none is `ignore`d.
#![doc = include_str!("../docs/guide/index.md")]
// The guide links to items of every feature; built with fewer features
// (plain `cargo doc`), those links have nothing to point at. CI and docs.rs
// build the docs with every feature on, where a broken link is an error.
#![cfg_attr(
    not(all(
        feature = "macros",
        feature = "axum",
        feature = "config",
        feature = "serde",
        feature = "tower",
        feature = "reqwest",
        feature = "tonic",
        feature = "actix"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

/// One guide page: `$name` documented by `docs/guide/$file`, whose
/// examples are doctested here when `$tested` holds.
macro_rules! page {
    ($(#[$meta:meta])* $name:ident = $file:literal, tested if $tested:meta) => {
        $(#[$meta])*
        #[cfg_attr(any(not(doctest), $tested), doc = include_str!(concat!("../docs/guide/", $file)))]
        pub mod $name {}
    };
}

page!(macro_attribute = "macro_attribute.md", tested if feature = "macros");
page!(call_api = "call_api.md", tested if all());
page!(algorithms = "algorithms.md", tested if all());
page!(routes = "routes.md", tested if all(feature = "tower", feature = "axum", feature = "actix"));
// Its examples need `ratewall-redis`: doctested there.
page!(redis = "redis.md", tested if any());
page!(waiting = "waiting.md", tested if feature = "macros");
page!(tiers = "tiers.md", tested if feature = "macros");
page!(lists = "lists.md", tested if all(feature = "macros", feature = "config"));
page!(penalty_box = "penalty_box.md", tested if all(feature = "macros", feature = "config", feature = "tower", feature = "axum"));
page!(concurrency = "concurrency.md", tested if feature = "macros");
page!(leasing = "leasing.md", tested if any());
page!(budgets = "budgets.md", tested if feature = "macros");
page!(upstream = "upstream.md", tested if feature = "tower");
page!(operations = "operations.md", tested if all(feature = "config", feature = "serde"));
page!(metrics = "metrics.md", tested if all());
page!(architecture = "architecture.md", tested if all());
page!(showcases = "showcases.md", tested if all(feature = "macros", feature = "axum"));

#[doc = include_str!("../docs/guide/migrating.md")]
pub mod migrating {
    page!(from_governor = "migrating_governor.md", tested if all(feature = "tower", feature = "axum"));
    page!(from_rate_limiter_flexible = "migrating_flexible.md", tested if feature = "macros");
}
