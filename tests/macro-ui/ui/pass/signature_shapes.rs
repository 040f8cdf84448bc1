//! The signature and attributes are kept as written: visibility, generics,
//! `where` clauses, lifetimes, patterns, raw identifiers, doc comments,
//! inner attributes, `io::Result`-style aliases, `impl Trait` in the
//! return type and `on_error`.

#![deny(unused_mut)]

use std::fmt::Display;

use ratewall::{Limiter, Rejection, rate_limit};

#[derive(Debug)]
struct AppError;

impl From<Rejection> for AppError {
    fn from(_: Rejection) -> Self {
        AppError
    }
}

type AppResult<T> = std::result::Result<T, AppError>;

mod app {
    /// Like `io::Result`: an alias named `Result` with the error built in.
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

mod inner {
    use super::*;

    /// Documented, public in the crate, generic with a where clause.
    #[rate_limit(period = 60, threshold = 5, key = who, on_error = fail_open)]
    #[allow(clippy::needless_lifetimes)]
    pub(crate) async fn generic<'a, T>(who: T, text: &'a str) -> Result<&'a str, Rejection>
    where
        T: Display + Send,
    {
        #![allow(unused_variables)]
        let unused = 1;
        Ok(text)
    }
}

#[rate_limit(period = 60, threshold = 5, key = format_args!("{a}-{b}"))]
async fn destructured((a, b): (u8, u8)) -> Result<u8, Rejection> {
    Ok(a + b)
}

#[rate_limit(period = 60, threshold = 5, key = r#type)]
async fn r#match(r#type: &str) -> app::Result<String> {
    Ok(r#type.to_owned())
}

#[rate_limit(period = 60, threshold = 5)]
async fn aliased() -> AppResult<u8> {
    Ok(1)
}

#[rate_limit(period = 60, threshold = 5, key = id)]
async fn boxed_error(id: u32) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    if id == 0 {
        return Err("zero".into());
    }
    Ok(id)
}

#[rate_limit(period = 60, threshold = 5)]
async fn opaque() -> Result<impl Display, Rejection> {
    Ok(5)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert_eq!(inner::generic(1, "x").await.unwrap(), "x");
    assert_eq!(destructured((1, 2)).await.unwrap(), 3);
    assert_eq!(r#match("t").await.unwrap(), "t");
    assert_eq!(aliased().await.unwrap(), 1);
    assert!(boxed_error(0).await.is_err());
    assert_eq!(boxed_error(1).await.unwrap(), 1);
    assert_eq!(opaque().await.unwrap().to_string(), "5");
}
