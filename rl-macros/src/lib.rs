//! The `#[rate_limit]` attribute. Use it through `ratewall`, which re-exports
//! it as `ratewall::rate_limit` and documents it with compiled examples; this
//! crate cannot depend on `ratewall`, so its own examples are not compiled.
//!
//! The macro is split the way `tracing-attributes` and `tokio-macros` are:
//! this file converts to `proc_macro2` and dispatches, `attr` parses,
//! `validate` checks arguments against each other and against the function,
//! and `expand` only generates. The limit grammar (algorithm names,
//! durations, rates and every numeric bound) is `ratewall-grammar`'s, shared with
//! `ratewall`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attr;
mod expand;
mod validate;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};

/// Limits how often an `async fn` may run: before the body, the limiter
/// decides the call; a refused call returns `Err(E::from(rejection))` (or
/// `on_reject`'s value) without running the body. Several limits per key,
/// several keys per call, counting only failures and HTTP `RateLimit`
/// headers are options below.
///
/// ```text
/// use ratewall::{Limiter, Rejection, rate_limit};
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
/// | `period` | integer (seconds) or duration string: `"250us"`, `"500ms"`, `"30s"`, `"1m"`, `"1h"`, `"1d"`, `"30 seconds"`, `"1 minute"` | required, unless `limits` | the window `threshold` applies to |
/// | `threshold` | integer ≥ 1 | required, unless `limits` | calls (units of `cost`) admitted per `period` |
/// | `limits` | list of rate strings, `THRESHOLD/PERIOD` or `THRESHOLD per PERIOD`: `["1/1m", "5/1h", "10/d"]`, `["10/minute", "1000 per hour", "5 per 30 seconds"]` (a period, or a bare unit meaning one of it) | instead of `period` + `threshold` | several limits on the key, decided together: a call passes only if every one admits it, and a refused call consumes none of them; at most one limit per period |
/// | `key` | any expression over the arguments whose value is `Display` | none: one limit shared by every call | whose quota the call uses; evaluated by reference, never moves an argument |
/// | `algorithm` | `fixed_window`, `sliding_log`, `sliding_window`, `token_bucket`, `leaky_bucket`, `gcra` (identifier or string) | `gcra` | how calls are counted (each limit of `limits`) |
/// | `cost` | integer ≥ 1, or an expression over the arguments giving an unsigned integer (`cost = req.max_tokens`) | `1` | units each call takes (from each limit of its group); an expression is each call's own cost, checked against the capacity when the call is made (above it: refused as unavailable, logged) |
/// | `settle` | expression callable as `FnOnce(&ReturnType) -> u64` (any unsigned integer): `\|out\| out.usage.total_tokens`; on the function or in an `also(...)`, with a `cost` | the cost stays taken | the group's `cost` is an estimate: once the body has returned, its real cost replaces it (`ratewall::Permit::settle_cost`): the rest given back below it, the difference charged as debt above it; a call dropped before it returns keeps the estimate; `0` gives everything back (a request never sent) |
/// | `burst` | integer ≥ 1 | `threshold` (of each limit) | capacity of `token_bucket`, `leaky_bucket` and `gcra`; refused for the others |
/// | `slots` | integer ≥ 1 | `10` | sub-windows of `sliding_window`; refused for the others |
/// | `lease` | integer ≥ 1, below the capacity | no leasing | quota leasing: a process may reserve up to this many units of each rate limit for a hot key and admit its calls from them without a round trip (`ratewall::Limit::with_lease`); refused for `sliding_log` (not the in-flight slots of `max_in_flight`) |
/// | `block_for` | integer (seconds) or duration string, `1ms` to `30d` | no block | a penalty box: once a call is refused by one of the group's rate limits, the key is refused by that limit for this long (`retry_after` says until when; refusals meanwhile do not extend it), on every instance sharing the store (`ratewall::Limit::with_block`); lifted by `limiter.settings().unblock(name, key)` or a reset; not with `lease`, nor on the slots of `max_in_flight` |
/// | `max_in_flight` | integer, 1 to 100 000 | none | at most this many calls of the key running at once (a concurrency limit): a call holds a slot from admission until its body returns or its future is dropped; alone or beside rate limits (decided together, all-or-nothing) |
/// | `in_flight_ttl` | integer (seconds) or duration string, `1s` to `1h` | `"10s"` | with `max_in_flight`: the lease of a slot in a remote store, renewed every third of it while the call runs; a dead instance's slots come back after it |
/// | `name` | string | `"<module path>::<fn name>"` | metrics label, log field and key scope |
/// | `limiter` | expression evaluating to a `Limiter`, `&Limiter`, `Arc<Limiter>` or `Box<Limiter>` (borrowed, never moved) | the global limiter | the limiter deciding the calls |
/// | `on_error` | `fail_open`, `fail_closed` or `local(N)` (decide in process with threshold / N) | the limiter's policy | what to do when the backend cannot decide |
/// | `also(...)` | `name` (required, distinct), `key`, `limits` or `period` + `threshold` and/or `max_in_flight`, `in_flight_ttl`, `algorithm`, `cost`, `settle`, `burst`, `slots`, `lease`, `block_for`, `reset_on_success`, `tier` + `tiers` | none; may be repeated | another key with its own limits (e.g. per IP beside per phone), decided in the same call, all-or-nothing |
/// | `tier` + `tiers(...)` | `tier`: any expression over the arguments whose value is `Display` (a `&str` or `String` as is); `tiers(free = ["10/1m"], pro = ["1000/1m", "20/1s"])`: tier names (identifiers or strings of ASCII letters, digits, `_`, `-`, `.`) with their limits | instead of `limits` / `period` + `threshold` | per-identity limits: each call is decided by the limits of the tier `tier` gives, on that tier's own state (key scope and runtime name `<name>@<tier>`); a tier named `default` decides unknown tiers, else the failure policy answers them |
/// | `count` | `failures` | every admitted call counts | only calls returning `Err` keep what they took; the others are given back (the function must return a `Result`) |
/// | `count_if` | expression callable as `FnOnce(&ReturnType) -> bool`: a closure (`\|r: &Response\| r.status() == 401`) or a function path | every admitted call counts | `true`: the call keeps what it took; `false`: it is given back |
/// | `reset_on_success` | flag, on the function or in an `also(...)` | off | with `count`/`count_if`: a call that does not count forgets this group's state for its key (consecutive-failure counting) instead of giving back its own units |
/// | `on_reject` | expression callable as `FnOnce(ratewall::Rejection) -> ReturnType` (closure or path, e.g. `IntoResponse::into_response`) | `Err(From::from(rejection))` | the value a refused call returns; with it the function may return any type |
/// | `headers` | flag (needs `ratewall`'s `axum` or `tower` feature) | off | adds `RateLimit-Policy` and `RateLimit` (the binding limit) to a successful response; the return type must implement `WithHeaders`: `http::Response<B>` or `Result<Response<B>, E>` |
/// | `wait` | integer (seconds) or duration string, > 0 | refuse at once | wait up to this long for room instead of being refused: on `gcra`, `token_bucket` and `leaky_bucket` the call reserves the earliest slot every limit allows and sleeps until it (callers queue); on the window algorithms, and on any call with `block_for`, it retries after each `retry_after` until the deadline (see `ratewall::Keys::wait`); a tiered call waits on its tier's limits; not with `max_in_flight`, `count` or `count_if`, nor over limits mixing the window algorithms with the others (unless one has `block_for`) |
/// | `crate` | string path to `ratewall` | `"::ratewall"` | for crates that re-export `ratewall` |
///
/// Every argument is checked at compile time, at the offending token:
/// unknown or repeated arguments, zero or negative numbers, unreadable
/// duration or limit strings, unknown algorithms, a `cost` above the
/// capacity (the `burst` of `token_bucket`, `leaky_bucket` and `gcra`, the
/// `threshold` of the others), a `sliding_window` period that does not
/// split into `slots` equal whole microseconds, a `sliding_log` threshold
/// above 10 000, a capacity × period (in µs) above 2^52, a `lease` of
/// zero, of the whole capacity or more, or on a `sliding_log`, and a
/// `block_for` under 1 ms or over 30 days, or beside `lease`; these apply to
/// every string of `limits` (reported at the string) and to every
/// `also(...)`. Also refused: `limits` with `period` or `threshold`, two
/// limits of one key with the same period, an `also(...)` without a
/// `name` or with a name another group uses, `also(...)` inside
/// `also(...)` or holding a whole-function argument (`limiter`,
/// `on_error`, `count`, `on_reject`, `headers`, `crate`), `count` with
/// `count_if`, `count = failures` on a function not returning a `Result`,
/// `reset_on_success` without `count`/`count_if`, `count`, `count_if`,
/// `headers` or `max_in_flight` on a function returning `impl Trait`,
/// `max_in_flight = 0` or above 100 000, `in_flight_ttl` without
/// `max_in_flight` or outside 1 s ..= 1 h, in a group with `max_in_flight`
/// but no rate limit, `algorithm`, `burst`, `slots`, `cost`, `settle`,
/// `lease`, `block_for` or `reset_on_success` (they describe rate limits; a call holds one slot
/// whatever its cost), `settle` without a `cost` (nothing to settle), on a
/// `sliding_log` (it keeps one entry per unit and at most `threshold` at
/// once, so it cannot carry debt; `gcra`, the buckets and the windows can),
/// or with `count`/`count_if` (settle at 0 instead), and for tiers: `tier` without `tiers(...)` or the
/// reverse, an empty `tiers()`, a tier name that is not one or is given
/// twice, `tiers` with `limits`, `period` or `threshold`, a tiered group's
/// `name` containing `@`, and every limit rule above for each tier's limits
/// (reported at the string); and a `wait` of zero, with `count` or
/// `count_if`, with `max_in_flight` in any group, or over
/// limits mixing a window algorithm with `gcra` or a bucket when none has
/// `block_for` (reported at `wait`).
///
/// # Tiers
///
/// ```text
/// #[rate_limit(name = "api", key = user.id, tier = user.plan(),
///              tiers(free = ["10/1m"], pro = ["1000/1m", "20/1s"], default = ["5/1m"]))]
/// async fn search(user: &User, q: String) -> Result<Hits, ApiError> { .. }
/// ```
///
/// Each call is decided by its tier's limits, on that tier's own state: a
/// user upgraded to `pro` is decided by `pro` from their next call. Tiers
/// are limits by name, `api@free` and `api@pro`: `set_limits("api@pro",
/// ..)` changes one, and `set_limits("api@gold", ..)` adds a tier the code
/// does not declare. A call whose tier is unknown goes to `default` when
/// declared (or configured); without one it cannot be decided, an error
/// naming the tier is logged and the failure policy answers (`fail_open`:
/// admitted). The metrics' `limit` label is `api@pro`.
///
/// # Waiting
///
/// ```text
/// #[rate_limit(key = tenant, period = "1s", threshold = 10, burst = 1,
///              algorithm = leaky_bucket, wait = "3s")]
/// async fn export(tenant: u64) -> Result<Report, Rejection> { .. }
/// ```
///
/// Callers of one tenant leave one every 100 ms; one whose turn is more
/// than 3 s away is refused at once (its `retry_after` says when its turn
/// would be). A caller whose future is dropped while it waits gives its
/// slot to the next caller.
///
/// # Several limits and several keys
///
/// ```text
/// #[rate_limit(
///     name = "sms_phone", key = phone, limits = ["1/1m", "5/1h", "10/1d"], algorithm = sliding_log,
///     also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = sliding_log),
/// )]
/// async fn send_sms(ip: ClientIp, phone: Phone) -> Result<Response, Rejection> { .. }
/// ```
///
/// Every limit of every group is decided in one call to the limiter (one
/// Redis round trip), all-or-nothing: a call refused by the daily limit
/// takes nothing from the minute limit nor from the IP group. The
/// rejection is named after the group that refused (`"sms_ip"`). A group's
/// `name` scopes its keys, so two functions with `also(name = "sms_ip", ..)`
/// share the per-IP counter; `limiter.settings().set_limits(name, ..)` replaces a
/// group's limits at run time.
///
/// # Counting failures
///
/// ```text
/// #[rate_limit(name = "login_user", key = form.username, period = "15m", threshold = 3,
///              algorithm = sliding_log, count = failures, reset_on_success,
///              also(name = "login_ip", key = ip, period = "1d", threshold = 100))]
/// async fn login(ip: ClientIp, form: Form) -> Result<Session, LoginError> { .. }
/// ```
///
/// With `count` or `count_if` a call still reserves its units before the
/// body runs (so concurrent calls never exceed a threshold); after the
/// body, a call that does not count gives them back, or, in a group with
/// `reset_on_success`, forgets that group's state for the key. Above: three
/// failed logins per user, then refused; a success starts the user's count
/// again but keeps the IP's failures. A call whose future is dropped
/// mid-body (or whose body panics) keeps what it reserved.
///
/// # Calls in flight
///
/// ```text
/// #[rate_limit(name = "export", key = tenant, max_in_flight = 4,
///              also(name = "export_user", key = user, limits = ["100/1h"]))]
/// async fn export(tenant: TenantId, user: UserId) -> Result<Report, Rejection> { .. }
/// ```
///
/// At most 4 exports per tenant run at once (across every instance sharing
/// the limiter's Redis), and 100 per user per hour, decided in one round
/// trip, all-or-nothing: a call refused by the hourly limit takes no slot,
/// and a call refused for lack of a slot (`Rejection::is_in_flight`, over
/// HTTP a `429` with `Retry-After: 1`) consumes none of the hour. The slot
/// is held until the body returns; a call whose future is dropped gives it
/// back too. In Redis a slot is a lease of `in_flight_ttl` (10 s by
/// default), renewed while the call runs: when an instance dies its slots
/// come back within that time.
///
/// # Responses
///
/// ```text
/// #[rate_limit(key = ip, period = 60, threshold = 10, headers,
///              on_reject = IntoResponse::into_response)]
/// async fn status(ip: ClientIp) -> Response { .. }
/// ```
///
/// `on_reject` makes the refused call's value, so an axum handler can
/// return a plain `Response` (a `Rejection` becomes a `429` with
/// `Retry-After` and the `RateLimit` fields). `headers` adds
/// `RateLimit-Policy` and `RateLimit` for the binding limit to successful
/// responses.
///
/// # The function
///
/// It must be an `async fn` (free function or method, with `self`, `&self`
/// or `&mut self`) returning `Result<T, E>` where
/// `E: From<ratewall::Rejection>`. Aliases are accepted when their name is or
/// ends in `Result` (`io::Result<T>`, `anyhow::Result<T>`, `AppResult<T>`);
/// the compiler then checks the conversion. The attributes, visibility and
/// signature are kept; the body runs unchanged after the check, so `return`
/// and `?` in it work as written. The key is rendered before the first
/// await, so the function's future is `Send` whenever its arguments are
/// (it can be spawned, or be an axum handler). With `on_reject` any return
/// type is accepted.
///
/// With `count`, `count_if` or `headers` the body runs in a block of its own
/// whose value is the function's result (`return` and `?` still leave with
/// the function's result): an `async move` block, or for `&mut self` and
/// `self` methods an `async` block borrowing the fields of `self` it uses,
/// so that `limiter = self.limiter` and a body mutating other fields go
/// together. The permit borrows the limiter until the body ends, so the
/// body cannot move what the limiter is borrowed from: in a `self` or
/// `&mut self` method whose body uses all of `self` (moves it, or calls a
/// `&mut self` method), pass `limiter = self.limiter.clone()` (an
/// `Arc<Limiter>`) or use the global limiter. `count_if` runs after the
/// body, when arguments the `async move` block took are gone: refer to
/// `Copy` values only. The result is held in a local, so these arguments
/// are refused with an `impl Trait` return type.
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
/// A refused call returns `Err(E::from(rejection))` (or, with `on_reject`,
/// what it makes of the rejection) without running the body;
/// `Rejection::retry_after` says how long to wait. If no `limiter` is
/// given and no global limiter was installed, the call is refused with a
/// rejection whose `is_unavailable()` is true (and logged): it does not
/// panic. Backend failures follow `on_error`, else the limiter's policy.
///
/// # What it expands to
///
/// Public API: a `static` `ratewall::CallSpec` and one `Limiter::call`
/// (through `__private::call`, which only adds "no global limiter installed"
/// as a rejection; `__private::admit` when no permit is kept, which awaits
/// nothing when the answer is decided already). The key goes in as an
/// integer or string when its type is one (rendered without `core::fmt`),
/// else through its `Display`:
///
/// ```text
/// async fn say_hi(user_id: u64) -> Result<String, Rejection> {
///     {
///         let __rl_limiter = ::ratewall::__private::global();
///         static __RL_LIMITS_0: [Limit; 1] = [Limit::from_parts_const(2, 30000000, Algorithm::Gcra, 2, 10)];
///         static __RL_GROUPS: [GroupSpec; 1] = [GroupSpec::new(concat!(module_path!(), "::", "say_hi"), &__RL_LIMITS_0)];
///         static __RL_SPEC: CallSpec = CallSpec::new(concat!(module_path!(), "::", "say_hi"), &__RL_GROUPS);
///         let __rl_call = ::ratewall::__private::admit(&__RL_SPEC, __rl_limiter, &[(&&Probe(&(user_id))).__rl_part()]);
///         // Decided already in memory: no await; a remote store's answer is awaited.
///         let __rl_decided = match __rl_call {
///             Ok(__rl_decided) => __rl_decided,
///             Err(__rl_later) => __rl_later.await,
///         };
///         match __rl_decided {
///             Ok(()) => {}
///             Err(__rl_rejection) => return Err(From::from(__rl_rejection)),
///         }
///     }
///     Ok(format!("hi {user_id}"))
/// }
/// ```
///
/// With `count`, `count_if` or `headers` the permit outlives the body
/// (shown with `count = failures` and `headers`):
///
/// ```text
/// async fn login(ip: IpAddr, user: String) -> Result<Response, LoginError> {
///     let __rl_limiter = ::ratewall::__private::global();
///     let __rl_permit = {
///         static __RL_LIMITS_0: [Limit; 1] = [..];
///         static __RL_LIMITS_1: [Limit; 1] = [..];
///         static __RL_GROUPS: [GroupSpec; 2] = [
///             GroupSpec::new(concat!(module_path!(), "::", "login"), &__RL_LIMITS_0).reset_on_success(),
///             GroupSpec::new("login_ip", &__RL_LIMITS_1),
///         ];
///         static __RL_SPEC: CallSpec = CallSpec::new(.., &__RL_GROUPS).with_counting(Counting::Settled);
///         let __rl_call = ::ratewall::__private::call(&__RL_SPEC, __rl_limiter, &[<user>, <ip>]);
///         match __rl_call.await {
///             Ok(__rl_permit) => __rl_permit,
///             Err(__rl_rejection) => return Err(From::from(__rl_rejection)), // or on_reject's value
///         }
///     };
///     let mut __rl_out: Result<Response, LoginError> = async move {
///         #[allow(unreachable_code)]
///         if false { let __rl_never: Result<Response, LoginError> = loop {}; return __rl_never; }
///         { /* the original body */ }
///     }
///     .await;
///     let __rl_counted: bool = Result::is_err(&__rl_out);
///     ::ratewall::__private::Permit::add_headers(&__rl_permit, &mut __rl_out);
///     ::ratewall::__private::Permit::settle(__rl_permit, __rl_counted).await;
///     __rl_out
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
    /// The argument table of this crate's docs lists exactly the
    /// arguments the parser declares (`attr::ARGUMENTS`, from the one
    /// `arguments!` table): the one list every other doc links to.
    #[test]
    fn the_documented_argument_table_is_the_declared_one() {
        let docs = include_str!("lib.rs");
        let mut documented: Vec<&str> = docs
            .lines()
            .filter_map(|line| line.strip_prefix("/// | `"))
            .filter_map(|row| row.split(" |").next())
            .flat_map(|cell| cell.split('`').step_by(2))
            .map(|name| name.trim_matches(|c: char| c == '+' || c.is_whitespace()))
            .map(|name| name.trim_end_matches("(...)"))
            .filter(|name| !name.is_empty())
            .collect();
        documented.sort_unstable();
        documented.dedup();
        let mut declared = crate::attr::ARGUMENTS.to_vec();
        declared.sort_unstable();
        assert_eq!(
            documented, declared,
            "the macro's argument table against its parser"
        );
    }

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
