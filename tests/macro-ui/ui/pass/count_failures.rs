//! `count = failures` and `count_if`: free functions and methods (`&self`,
//! `&mut self`, `self`) whose bodies use `return` and `?`, with the limiter
//! from an argument, from `self`, or the global one.

use std::sync::Arc;

use ratewall::{Limiter, Rejection, rate_limit};

#[derive(Debug)]
enum LoginError {
    Wrong,
    Parse(std::num::ParseIntError),
    Limited(Rejection),
}

impl From<Rejection> for LoginError {
    fn from(rejection: Rejection) -> Self {
        LoginError::Limited(rejection)
    }
}

impl From<std::num::ParseIntError> for LoginError {
    fn from(error: std::num::ParseIntError) -> Self {
        LoginError::Parse(error)
    }
}

#[rate_limit(key = user, period = "1m", threshold = 3, count = failures, reset_on_success)]
async fn login(user: &str, pin: &str) -> Result<u32, LoginError> {
    if pin.is_empty() {
        return Err(LoginError::Wrong);
    }
    let pin: u32 = pin.parse()?;
    Ok(pin)
}

fn is_failure(out: &Result<u32, Box<dyn std::error::Error + Send + Sync>>) -> bool {
    out.is_err()
}

#[rate_limit(period = 60, threshold = 3, count_if = is_failure)]
async fn boxed(id: u32) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    if id == 0 {
        return Err(Box::new(std::fmt::Error));
    }
    let parsed: u32 = "7".parse()?;
    Ok(parsed + id)
}

/// Generics, lifetimes and a `where` clause with a counted body.
#[rate_limit(period = 60, threshold = 5, key = who, count = failures)]
async fn generic<'a, T>(who: T, text: &'a str) -> Result<&'a str, Rejection>
where
    T: std::fmt::Display + Send,
{
    if text.is_empty() {
        return Err(Rejection::unavailable(
            "empty",
            ratewall::Error::NotInstalled,
        ));
    }
    Ok(text)
}

struct Accounts {
    limiter: Arc<Limiter>,
    tenant: String,
    attempts: u32,
}

impl Accounts {
    #[rate_limit(key = self.tenant, period = 60, threshold = 3, limiter = self.limiter, count = failures)]
    async fn check(&self, pin: &str) -> Result<&str, LoginError> {
        if pin != "1234" {
            return Err(LoginError::Wrong);
        }
        Ok(&self.tenant)
    }

    #[rate_limit(key = self.tenant, period = 60, threshold = 3, limiter = self.limiter,
                 count_if = |out| matches!(out, Err(LoginError::Wrong)), reset_on_success)]
    async fn attempt(&mut self, pin: &str) -> Result<u32, LoginError> {
        self.attempts += 1;
        let _: u32 = pin.parse()?;
        Ok(self.attempts)
    }

    #[rate_limit(key = self.tenant, period = 60, threshold = 3, limiter = self.limiter, count = failures)]
    async fn into_tenant(self) -> Result<String, LoginError> {
        Ok(self.tenant)
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert!(matches!(
        assert_send(login("ada", "")).await,
        Err(LoginError::Wrong)
    ));
    assert!(matches!(login("ada", "x").await, Err(LoginError::Parse(_))));
    assert_eq!(login("ada", "12").await.unwrap(), 12);
    assert!(boxed(0).await.is_err());
    assert_eq!(boxed(1).await.unwrap(), 8);
    assert_eq!(generic(1, "x").await.unwrap(), "x");
    assert!(generic(1, "").await.is_err());

    let mut accounts = Accounts {
        limiter: Arc::new(Limiter::builder().build().unwrap()),
        tenant: "acme".to_owned(),
        attempts: 0,
    };
    assert_eq!(assert_send(accounts.check("1234")).await.unwrap(), "acme");
    assert!(matches!(accounts.check("0").await, Err(LoginError::Wrong)));
    assert_eq!(assert_send(accounts.attempt("5")).await.unwrap(), 1);
    assert_eq!(accounts.into_tenant().await.unwrap(), "acme");
}
