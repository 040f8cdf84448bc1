//! The `#[rate_limit]` attribute. Use it through `rl-core`, which re-exports
//! it as `rl_core::rate_limit` and documents it with compiled examples; this
//! crate cannot depend on `rl-core`, so its own examples are not compiled.
//!
//! The macro is split the way `tracing-attributes` and `tokio-macros` are:
//! this file converts to `proc_macro2` and dispatches, `attr` parses,
//! `validate` checks arguments against each other and against the function,
//! `expand` only generates, and `duration` reads duration strings.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attr;
mod duration;
mod expand;
mod validate;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};

/// Limits how often an `async fn` may run: before the body, the limiter
/// decides the call; a refused call returns `Err(E::from(rejection))`
/// without running the body.
///
/// ```text
/// use rl_core::{rate_limit, Limiter, Rejection};
///
/// #[rate_limit(period = 30, threshold = 2, key = user_id)]
/// async fn say_hi(user_id: u64) -> Result<String, Rejection> {
///     Ok(format!("hi {user_id}"))
/// }
///
/// // once, at startup:
/// Limiter::builder().memory().install()?;
/// say_hi(7).await?;                                // allowed
/// say_hi(7).await?;                                // allowed
/// let refused = say_hi(7).await.unwrap_err();      // third call within 30 s
/// assert_eq!(refused.retry_after(), Some(Duration::from_secs(15)));
/// say_hi(8).await?;                                // another key, its own quota
/// ```
///
/// # Arguments
///
/// | argument | value | default | meaning |
/// |---|---|---|---|
/// | `period` | integer (seconds) or duration string: `"250us"`, `"500ms"`, `"30s"`, `"1m"`, `"1h"`, `"1d"` | required | the window `threshold` applies to |
/// | `threshold` | integer ≥ 1 | required | calls (units of `cost`) admitted per `period` |
/// | `key` | any expression over the arguments whose value is `Display` | none: one limit shared by every call | whose quota the call uses; evaluated by reference, never moves an argument |
/// | `algorithm` | `fixed_window`, `sliding_log`, `sliding_window`, `token_bucket`, `leaky_bucket`, `gcra` (identifier or string) | `gcra` | how calls are counted |
/// | `cost` | integer ≥ 1 | `1` | units each call takes |
/// | `burst` | integer ≥ 1 | `threshold` | capacity of `token_bucket`, `leaky_bucket` and `gcra`; refused for the others |
/// | `slots` | integer ≥ 1 | `10` | sub-windows of `sliding_window`; refused for the others |
/// | `name` | string | `"<module path>::<fn name>"` | metrics label, log field and key scope |
/// | `limiter` | expression evaluating to a `Limiter`, `&Limiter`, `Arc<Limiter>` or `Box<Limiter>` (borrowed, never moved) | the global limiter | the limiter deciding the calls |
/// | `on_error` | `fail_open` or `fail_closed` | the limiter's policy | what to do when the backend cannot decide |
/// | `crate` | string path to `rl_core` | `"::rl_core"` | for crates that re-export `rl_core` |
///
/// Every argument is checked at compile time, at the offending token:
/// unknown or repeated arguments, zero or negative numbers, unreadable
/// duration strings, unknown algorithms, a `cost` above the capacity (the
/// `burst` of `token_bucket`, `leaky_bucket` and `gcra`, the `threshold`
/// of the others), a `sliding_window` period that does not split into
/// `slots` equal whole microseconds, a `sliding_log` threshold above
/// 10 000, and a capacity × period (in µs) above 2^53.
///
/// # The function
///
/// It must be an `async fn` (free function or method, with `self`, `&self`
/// or `&mut self`) returning `Result<T, E>` where
/// `E: From<rl_core::Rejection>`. Aliases are accepted when their name is or
/// ends in `Result` (`io::Result<T>`, `anyhow::Result<T>`, `AppResult<T>`);
/// the compiler then checks the conversion. The attributes, visibility and
/// signature are kept; the body runs unchanged after the check, so `return`
/// and `?` in it work as written. The key is rendered before the first
/// await, so the function's future is `Send` whenever its arguments are
/// (it can be spawned, or be an axum handler).
///
/// ```text
/// #[derive(Debug)]
/// enum ApiError { TooManyRequests(Rejection), NotFound }
///
/// impl From<Rejection> for ApiError {
///     fn from(rejection: Rejection) -> Self { ApiError::TooManyRequests(rejection) }
/// }
///
/// struct Sms { limiter: Arc<Limiter>, tenant: String }
///
/// impl Sms {
///     #[rate_limit(period = "1h", threshold = 5, key = self.tenant,
///                  algorithm = sliding_log, limiter = self.limiter, on_error = fail_closed)]
///     async fn send(&self, to: &str) -> Result<(), ApiError> {
///         if to.is_empty() { return Err(ApiError::NotFound); }
///         Ok(())
///     }
/// }
/// ```
///
/// # Keys and names
///
/// A call's storage key is the limiter's prefix, the limit's `name` and the
/// `key`'s text. Two functions therefore share a counter only when they
/// share a `name`: give both `name = "sms"` to make them draw on one quota.
/// The default name is the module path and the function name, so two
/// *methods* with the same name in one module (on different types) share
/// a default name; give them distinct `name`s when that matters.
/// Changing `period` or `algorithm` starts from fresh state.
///
/// # Failures
///
/// A refused call returns `Err(E::from(rejection))` without running the
/// body; `Rejection::retry_after` says how long to wait. If no `limiter` is
/// given and no global limiter was installed, the call is refused with a
/// rejection whose `is_unavailable()` is true (and logged): it does not
/// panic. Backend failures follow `on_error`, else the limiter's policy.
///
/// # What it expands to
///
/// ```text
/// async fn say_hi(user_id: u64) -> Result<String, Rejection> {
///     {
///         static __RL_SPEC: ::rl_core::__private::Spec = ::rl_core::__private::Spec {
///             name: concat!(module_path!(), "::", "say_hi"),
///             limits: &[::rl_core::__private::limit(2, 30000000, Algorithm::Gcra, 2, 10)],
///             cost: 1,
///             policy: None,
///         };
///         match ::rl_core::__private::check(&__RL_SPEC, ::rl_core::__private::global(), &(user_id)).await {
///             Ok(_) => {}
///             Err(__rl_rejection) => return Err(From::from(__rl_rejection)),
///         }
///     }
///     Ok(format!("hi {user_id}"))
/// }
/// ```
///
/// When the arguments or the function are invalid, the macro emits the
/// errors and the function unchanged, so the rest of the crate (and the
/// IDE) still sees it.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    rate_limit_impl(args.into(), item.into()).into()
}

fn rate_limit_impl(args: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let function = syn::parse2::<attr::Function>(item.clone()).map_err(|_| {
        syn::Error::new(
            Span::call_site(),
            "`#[rate_limit]` can only be applied to an `async fn` with a body (a free function or a method)",
        )
    });
    let args = syn::parse2::<attr::Args>(args);
    let result = match (args, function) {
        (Ok(args), Ok(function)) => {
            validate::validate(args, &function.sig).map(|config| expand::expand(config, function))
        }
        (Err(mut error), Err(other)) => {
            error.combine(other);
            Err(error)
        }
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => Err(error),
    };
    result.unwrap_or_else(|error| {
        let mut output = error.into_compile_error();
        output.extend(item);
        output
    })
}

#[cfg(test)]
mod tests {
    use quote::quote;

    #[test]
    fn on_error_the_function_is_emitted_unchanged_after_the_errors() {
        let function = quote!(
            fn handler() -> Result<(), E> {
                Ok(())
            }
        );
        let output = super::rate_limit_impl(quote!(tresh = 5), function.clone()).to_string();
        assert!(output.starts_with(":: core :: compile_error !"), "{output}");
        assert!(output.ends_with(&function.to_string()), "{output}");
    }

    #[test]
    fn argument_and_item_errors_are_reported_together() {
        let output = super::rate_limit_impl(
            quote!(tresh = 5),
            quote!(
                struct S;
            ),
        )
        .to_string();
        assert_eq!(output.matches("compile_error").count(), 2, "{output}");
    }

    #[test]
    fn validation_errors_are_all_reported() {
        let output = super::rate_limit_impl(
            quote!(),
            quote!(
                fn f() {}
            ),
        )
        .to_string();
        assert_eq!(output.matches("compile_error").count(), 4, "{output}");
    }
}
