//! Compile-time behaviour of `#[rate_limit]`: valid uses compile (and run),
//! and every invalid use fails with its message at the offending token.
//!
//! Cases live in `ui/pass/*.rs` and `ui/fail/*.rs` (with the
//! expected `.stderr`). After changing a message, regenerate with
//! `TRYBUILD=overwrite cargo test -p ratewall-macro-ui --test macro_ui` and read the
//! diff.

#[test]
fn rate_limit_compiles_valid_uses_and_rejects_invalid_ones_at_the_offending_token() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/pass/*.rs");
    cases.compile_fail("ui/fail/*.rs");
}
