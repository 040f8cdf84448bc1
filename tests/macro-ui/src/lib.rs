//! Nothing to use: this crate holds the `#[rate_limit]` compile-time cases
//! (`ui/pass`, `ui/fail`) and their trybuild test (`tests/macro_ui.rs`).
//! They live apart from `ratewall-tests` so that trybuild, which builds
//! every case against the dependencies of the crate that runs it, builds
//! only what the cases use (not Redis, TLS, tonic or reqwest).

#![forbid(unsafe_code)]
