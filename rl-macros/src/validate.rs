//! Validation after parsing: the function's shape and every rule that
//! relates two arguments, each reported at the span parsing stored.
//!
//! The limit rules are those of `rl_core::Limit` (its const constructor
//! panics on anything this module lets through, so the two must agree) plus
//! `Limit::check_cost`, which the limiter would otherwise only apply at run
//! time.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{
    Error, Expr, GenericArgument, LitStr, Path, PathArguments, Result, ReturnType, Signature, Type,
};

use crate::attr::{Algorithm, Arg, Args, OnError};

/// Largest value the algorithms' integers may reach (Lua numbers are doubles).
const EXACT_LIMIT: u64 = 1 << 53;

/// Mirror of `rl_core::Limit::SLIDING_LOG_CAP`.
const SLIDING_LOG_CAP: u64 = 10_000;

/// Mirror of `rl_core::Limit::DEFAULT_SLOTS`.
const DEFAULT_SLOTS: u64 = 10;

/// Everything expansion needs, defaults filled in and all rules checked.
pub(crate) struct Config {
    pub(crate) threshold: u64,
    pub(crate) period_us: u64,
    pub(crate) algorithm: Algorithm,
    pub(crate) burst: u64,
    pub(crate) slots: u64,
    pub(crate) cost: u64,
    pub(crate) key: Option<Arg<Expr>>,
    pub(crate) limiter: Option<Arg<Expr>>,
    pub(crate) name: Option<LitStr>,
    pub(crate) on_error: Option<OnError>,
    pub(crate) krate: Option<Path>,
    /// Where a failed `From<Rejection>` conversion is reported: the `E` of
    /// `Result<T, E>`, or the whole return type.
    pub(crate) error_type_span: Span,
}

/// Collects every error, so one build shows them all.
#[derive(Default)]
struct Errors(Option<Error>);

impl Errors {
    fn push(&mut self, span: Span, message: impl std::fmt::Display) {
        let error = Error::new(span, message);
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish<T>(self, value: T) -> Result<T> {
        match self.0 {
            Some(error) => Err(error),
            None => Ok(value),
        }
    }
}

/// Checks the function and the arguments together.
pub(crate) fn validate(args: Args, sig: &Signature) -> Result<Config> {
    let mut errors = Errors::default();
    let error_type_span = check_signature(sig, &mut errors);

    let threshold = args.threshold.as_ref().map(|t| t.value);
    if args.threshold.is_none() {
        errors.push(
            Span::call_site(),
            "missing `threshold`: how many calls each key may make per `period`, e.g. `threshold = 10`",
        );
    }
    if args.period.is_none() {
        errors.push(
            Span::call_site(),
            "missing `period`: the window `threshold` applies to, in seconds (`period = 60`) or as a duration \
             string (`period = \"1m\"`)",
        );
    }
    let algorithm = args.algorithm.as_ref().map_or(Algorithm::Gcra, |a| a.value);

    for (arg, name) in [
        (&args.threshold, "threshold"),
        (&args.cost, "cost"),
        (&args.burst, "burst"),
        (&args.slots, "slots"),
    ] {
        if let Some(Arg { value: 0, span }) = arg {
            errors.push(*span, format!("`{name}` must be at least 1, got 0"));
        }
    }
    if let Some(Arg { value: 0, span }) = &args.period {
        errors.push(*span, "`period` must be longer than zero");
    }
    if let Some(burst) = &args.burst
        && !algorithm.uses_burst()
    {
        errors.push(
            burst.span,
            format!(
                "`burst` has no effect with `{}`, which admits at most `threshold` per period; remove it, or \
                 pick `token_bucket`, `leaky_bucket` or `gcra`",
                algorithm.name()
            ),
        );
    }
    if let Some(slots) = &args.slots
        && algorithm != Algorithm::SlidingWindow
    {
        errors.push(
            slots.span,
            format!(
                "`slots` only applies to `algorithm = sliding_window`, not `{}`; remove it",
                algorithm.name()
            ),
        );
    }
    if let Some(name) = &args.name
        && name.value.value().is_empty()
    {
        errors.push(
            name.span,
            "`name` must not be empty: it scopes the keys and labels the metrics",
        );
    }

    let burst = args.burst.as_ref().map_or(threshold, |b| Some(b.value));
    let slots = args.slots.as_ref().map_or(DEFAULT_SLOTS, |s| s.value);
    let cost = args.cost.as_ref().map_or(1, |c| c.value);
    let (Some(threshold_arg), Some(period_arg), Some(burst)) =
        (&args.threshold, &args.period, burst)
    else {
        return Err(errors.0.expect("a missing argument was reported"));
    };
    let (threshold, period_us) = (threshold_arg.value, period_arg.value);
    if threshold == 0 || period_us == 0 || burst == 0 || slots == 0 || cost == 0 {
        return Err(errors.0.expect("a zero value was reported"));
    }

    if algorithm == Algorithm::SlidingWindow && !period_us.is_multiple_of(slots) {
        let span = args.slots.as_ref().map_or(period_arg.span, |s| s.span);
        errors.push(
            span,
            format!(
                "a period of {period_us} µs cannot be split into {slots} equal `slots` (sliding_window counts per \
                 whole microsecond); pick a period or slot count that divides evenly"
            ),
        );
    }

    // The largest value a limit's state reaches, as `rl_core::Limit` computes it.
    let (capacity_name, capacity_span, size) = match &args.burst {
        Some(b) if algorithm.uses_burst() && b.value > threshold => ("burst", b.span, b.value),
        _ => ("threshold", threshold_arg.span, threshold),
    };
    if size
        .checked_mul(period_us)
        .is_none_or(|product| product > EXACT_LIMIT)
    {
        errors.push(
            capacity_span,
            format!(
                "`{capacity_name}` × `period` = {size} × {period_us} µs exceeds 2^53, too large to compute exactly \
                 (the Redis backend computes in doubles); pick a shorter period or a smaller {capacity_name}"
            ),
        );
    }

    if algorithm == Algorithm::SlidingLog && threshold > SLIDING_LOG_CAP {
        errors.push(
            threshold_arg.span,
            format!(
                "`sliding_log` stores one entry per admitted call and allows a threshold of at most \
                 {SLIDING_LOG_CAP}, got {threshold}; use `algorithm = sliding_window` for large thresholds"
            ),
        );
    }

    let (capacity, capacity_name) = if algorithm.uses_burst() {
        (burst, "burst")
    } else {
        (threshold, "threshold")
    };
    if let Some(cost_arg) = &args.cost
        && cost > capacity
    {
        errors.push(
            cost_arg.span,
            format!(
                "`cost = {cost}` exceeds the capacity of {capacity} (the `{capacity_name}` of `{}`), so \
                 every call would be refused; lower `cost` or raise `{capacity_name}`",
                algorithm.name()
            ),
        );
    }

    let config = Config {
        threshold,
        period_us,
        algorithm,
        burst,
        slots,
        cost,
        key: args.key,
        limiter: args.limiter,
        name: args.name.map(|n| n.value),
        on_error: args.on_error.map(|o| o.value),
        krate: args.krate.map(|k| k.value),
        error_type_span,
    };
    errors.finish(config)
}

const MUST_RETURN: &str = "`#[rate_limit]` functions must return `Result<T, E>` with \
    `E: From<rl_core::Rejection>`, so that a refused call can return an error";

/// The function must be `async` and return a `Result`. Returns the span
/// of the error type, where a missing `From<Rejection>` is reported.
fn check_signature(sig: &Signature, errors: &mut Errors) -> Span {
    if sig.asyncness.is_none() {
        errors.push(
            sig.fn_token.span,
            "`#[rate_limit]` needs an `async fn`: the limiter is asked before the body runs; write `async fn`",
        );
    }
    match &sig.output {
        ReturnType::Default => {
            let span = sig.paren_token.span.close();
            errors.push(
                span,
                format!("{MUST_RETURN}; add e.g. `-> Result<(), rl_core::Rejection>`"),
            );
            span
        }
        ReturnType::Type(_, ty) => match result_error_type(ty) {
            Some(span) => span,
            None => {
                errors.push(
                    ty.span(),
                    format!("{MUST_RETURN}; this type is not a `Result` (nor an alias whose name ends in `Result`)"),
                );
                ty.span()
            }
        },
    }
}

/// For a path type whose last segment is or ends in `Result`: the span of
/// its error type argument when written (`Result<T, E>`), else of the whole
/// type (`io::Result<T>`, `AppResult<T>`: aliases the user answers for, the
/// compiler checks them). `None` otherwise.
fn result_error_type(ty: &Type) -> Option<Span> {
    match ty {
        Type::Group(group) => result_error_type(&group.elem),
        Type::Paren(paren) => result_error_type(&paren.elem),
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last()?;
            if !last.ident.to_string().ends_with("Result") {
                return None;
            }
            let error = match &last.arguments {
                PathArguments::AngleBracketed(args) => args
                    .args
                    .iter()
                    .filter(|a| matches!(a, GenericArgument::Type(_)))
                    .nth(1),
                _ => None,
            };
            Some(error.map_or_else(|| ty.span(), Spanned::span))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn check(args: TokenStream, sig: TokenStream) -> Result<Config> {
        validate(syn::parse2(args).unwrap(), &syn::parse2(sig).unwrap())
    }

    fn messages(args: TokenStream) -> Vec<String> {
        match check(args, quote!(async fn f() -> Result<(), E>)) {
            Ok(_) => panic!("accepted"),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn single(args: TokenStream) -> String {
        let messages = messages(args);
        assert_eq!(messages.len(), 1, "{messages:?}");
        messages.into_iter().next().unwrap()
    }

    #[test]
    fn defaults_are_gcra_burst_threshold_ten_slots_cost_one() {
        let config = check(
            quote!(period = 60, threshold = 5),
            quote!(async fn f() -> Result<(), E>),
        )
        .unwrap();
        assert_eq!(config.algorithm, Algorithm::Gcra);
        assert_eq!(
            (
                config.threshold,
                config.period_us,
                config.burst,
                config.slots,
                config.cost
            ),
            (5, 60_000_000, 5, 10, 1)
        );
        assert!(config.key.is_none() && config.limiter.is_none() && config.name.is_none());
        assert!(config.on_error.is_none() && config.krate.is_none());
    }

    #[test]
    fn missing_threshold_and_period_are_both_reported() {
        let all = messages(quote!());
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all[0].starts_with("missing `threshold`"));
        assert!(all[1].starts_with("missing `period`"));
    }

    #[test]
    fn zero_values_are_refused_by_name() {
        assert_eq!(
            single(quote!(period = 1, threshold = 0)),
            "`threshold` must be at least 1, got 0"
        );
        assert_eq!(
            single(quote!(period = 1, threshold = 1, cost = 0)),
            "`cost` must be at least 1, got 0"
        );
        assert_eq!(
            single(quote!(period = 1, threshold = 1, burst = 0)),
            "`burst` must be at least 1, got 0"
        );
        assert_eq!(
            single(quote!(
                period = 1,
                threshold = 1,
                slots = 0,
                algorithm = sliding_window
            )),
            "`slots` must be at least 1, got 0"
        );
        assert_eq!(
            single(quote!(period = 0, threshold = 1)),
            "`period` must be longer than zero"
        );
        assert_eq!(
            single(quote!(period = "0ms", threshold = 1)),
            "`period` must be longer than zero"
        );
    }

    #[test]
    fn cost_above_the_capacity_is_refused_for_every_algorithm() {
        assert!(
            single(quote!(period = 1, threshold = 5, cost = 6))
                .starts_with("`cost = 6` exceeds the capacity of 5")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 5,
                burst = 2,
                cost = 3,
                algorithm = token_bucket
            ))
            .contains("capacity of 2 (the `burst` of `token_bucket`)")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 5,
                cost = 6,
                algorithm = fixed_window
            ))
            .contains("(the `threshold` of `fixed_window`)")
        );
        assert!(
            check(
                quote!(
                    period = 1,
                    threshold = 5,
                    burst = 9,
                    cost = 9,
                    algorithm = leaky_bucket
                ),
                quote!(async fn f() -> Result<(), E>)
            )
            .is_ok()
        );
    }

    #[test]
    fn sliding_window_needs_a_period_divisible_into_slots() {
        let message = single(quote!(
            period = "1001us",
            threshold = 5,
            algorithm = sliding_window
        ));
        assert!(
            message.starts_with("a period of 1001 µs cannot be split into 10 equal `slots`"),
            "{message}"
        );
        assert!(
            check(
                quote!(
                    period = "1001us",
                    threshold = 5,
                    algorithm = sliding_window,
                    slots = 7
                ),
                quote!(async fn f() -> Result<(), E>)
            )
            .is_ok()
        );
    }

    #[test]
    fn sliding_log_above_its_cap_suggests_sliding_window() {
        let message = single(quote!(
            period = 1,
            threshold = 10_001,
            algorithm = sliding_log
        ));
        assert!(
            message.contains("use `algorithm = sliding_window`"),
            "{message}"
        );
        assert!(
            check(
                quote!(period = 1, threshold = 10_000, algorithm = sliding_log),
                quote!(async fn f() -> Result<(), E>)
            )
            .is_ok()
        );
    }

    #[test]
    fn values_beyond_two_to_the_53_are_refused_at_the_larger_of_threshold_and_burst() {
        // A day is 8.64e10 µs and 2^53 ≈ 9.007e15: up to 104 249 per day.
        assert!(
            single(quote!(period = "1d", threshold = 104_250))
                .starts_with("`threshold` × `period` = 104250 × ")
        );
        assert!(
            single(quote!(period = "1d", threshold = 1, burst = 104_250))
                .starts_with("`burst` × `period` = 104250 × ")
        );
        assert!(
            check(
                quote!(period = "1d", threshold = 104_249),
                quote!(async fn f() -> Result<(), E>)
            )
            .is_ok()
        );
    }

    #[test]
    fn burst_and_slots_are_refused_where_they_have_no_effect() {
        assert!(
            single(quote!(
                period = 1,
                threshold = 5,
                burst = 6,
                algorithm = fixed_window
            ))
            .starts_with("`burst` has no effect with `fixed_window`")
        );
        assert!(
            single(quote!(period = 1, threshold = 5, slots = 5))
                .starts_with("`slots` only applies")
        );
    }

    #[test]
    fn an_empty_name_is_refused() {
        assert!(
            single(quote!(period = 1, threshold = 5, name = ""))
                .starts_with("`name` must not be empty")
        );
    }

    #[test]
    fn the_function_must_be_async_and_return_a_result() {
        let args = || syn::parse2::<Args>(quote!(period = 1, threshold = 1)).unwrap();
        let error = |sig: TokenStream| {
            validate(args(), &syn::parse2(sig).unwrap())
                .err()
                .map(|e| e.to_string())
        };
        assert!(
            error(quote!(fn f() -> Result<(), E>))
                .unwrap()
                .contains("needs an `async fn`")
        );
        assert!(
            error(quote!(async fn f()))
                .unwrap()
                .contains("must return `Result<T, E>`")
        );
        assert!(
            error(quote!(async fn f() -> Option<u8>))
                .unwrap()
                .contains("not a `Result`")
        );
        assert!(error(quote!(async fn f() -> io::Result<u8>)).is_none());
        assert!(error(quote!(async fn f() -> AppResult<u8>)).is_none());
        assert!(error(quote!(async fn f() -> Resulting<u8>)).is_some());
        assert!(error(quote!(async fn f() -> std::result::Result<u8, E>)).is_none());
        assert!(error(quote!(async fn f(&self) -> (Result<u8, E>))).is_none());
    }
}
