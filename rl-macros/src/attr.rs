//! Parsing: the attribute's arguments and the annotated function.
//!
//! Every argument is kept with the span of its value, so that validation
//! (in `validate.rs`) can report cross-field problems at the right token.
//! Nothing here checks how arguments relate to each other.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{
    Attribute, Error, Expr, Ident, LitFloat, LitInt, LitStr, Path, Result, Signature, Token,
    Visibility, braced, token,
};

use crate::duration;

/// The argument keywords.
mod kw {
    syn::custom_keyword!(period);
    syn::custom_keyword!(threshold);
    syn::custom_keyword!(key);
    syn::custom_keyword!(algorithm);
    syn::custom_keyword!(cost);
    syn::custom_keyword!(burst);
    syn::custom_keyword!(slots);
    syn::custom_keyword!(name);
    syn::custom_keyword!(limiter);
    syn::custom_keyword!(on_error);
}

/// Every argument, in the order the docs and error messages list them.
pub(crate) const ARGUMENTS: [&str; 11] = [
    "period",
    "threshold",
    "key",
    "algorithm",
    "cost",
    "burst",
    "slots",
    "name",
    "limiter",
    "on_error",
    "crate",
];

/// A parsed value and the span errors about it point at.
#[derive(Debug, Clone)]
pub(crate) struct Arg<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

impl<T> Arg<T> {
    fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}

/// The algorithms, mirroring `rl_core::Algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra,
}

impl Algorithm {
    pub(crate) const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The name written in the attribute.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// The variant of `rl_core::Algorithm`.
    pub(crate) const fn variant(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "FixedWindow",
            Algorithm::SlidingLog => "SlidingLog",
            Algorithm::SlidingWindow => "SlidingWindow",
            Algorithm::TokenBucket => "TokenBucket",
            Algorithm::LeakyBucket => "LeakyBucket",
            Algorithm::Gcra => "Gcra",
        }
    }

    /// Whether `burst` is the capacity (as `rl_core::Algorithm::uses_burst`).
    pub(crate) const fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

/// The `on_error` values, mirroring `rl_core::FailurePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnError {
    FailOpen,
    FailClosed,
}

/// The arguments as written; `None` for the ones left out.
#[derive(Default)]
pub(crate) struct Args {
    /// In microseconds.
    pub(crate) period: Option<Arg<u64>>,
    pub(crate) threshold: Option<Arg<u64>>,
    pub(crate) key: Option<Arg<Expr>>,
    pub(crate) algorithm: Option<Arg<Algorithm>>,
    pub(crate) cost: Option<Arg<u64>>,
    pub(crate) burst: Option<Arg<u64>>,
    pub(crate) slots: Option<Arg<u64>>,
    pub(crate) name: Option<Arg<LitStr>>,
    pub(crate) limiter: Option<Arg<Expr>>,
    pub(crate) on_error: Option<Arg<OnError>>,
    pub(crate) krate: Option<Arg<Path>>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            args.parse_one(input)?;
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

impl Args {
    /// Parses one `name = value` pair into its field.
    fn parse_one(&mut self, input: ParseStream) -> Result<()> {
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::period) {
            let keyword = input.parse::<kw::period>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.period,
                "period",
                keyword.span,
                parse_period(input)?,
            )
        } else if lookahead.peek(kw::threshold) {
            let keyword = input.parse::<kw::threshold>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.threshold,
                "threshold",
                keyword.span,
                parse_count(input, "threshold")?,
            )
        } else if lookahead.peek(kw::key) {
            let keyword = input.parse::<kw::key>()?;
            input.parse::<Token![=]>()?;
            set_once(&mut self.key, "key", keyword.span, parse_expr(input)?)
        } else if lookahead.peek(kw::algorithm) {
            let keyword = input.parse::<kw::algorithm>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.algorithm,
                "algorithm",
                keyword.span,
                parse_algorithm(input)?,
            )
        } else if lookahead.peek(kw::cost) {
            let keyword = input.parse::<kw::cost>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.cost,
                "cost",
                keyword.span,
                parse_count(input, "cost")?,
            )
        } else if lookahead.peek(kw::burst) {
            let keyword = input.parse::<kw::burst>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.burst,
                "burst",
                keyword.span,
                parse_count(input, "burst")?,
            )
        } else if lookahead.peek(kw::slots) {
            let keyword = input.parse::<kw::slots>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.slots,
                "slots",
                keyword.span,
                parse_count(input, "slots")?,
            )
        } else if lookahead.peek(kw::name) {
            let keyword = input.parse::<kw::name>()?;
            input.parse::<Token![=]>()?;
            let name: LitStr = input.parse()?;
            let span = name.span();
            set_once(&mut self.name, "name", keyword.span, Arg::new(name, span))
        } else if lookahead.peek(kw::limiter) {
            let keyword = input.parse::<kw::limiter>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.limiter,
                "limiter",
                keyword.span,
                parse_expr(input)?,
            )
        } else if lookahead.peek(kw::on_error) {
            let keyword = input.parse::<kw::on_error>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.on_error,
                "on_error",
                keyword.span,
                parse_on_error(input)?,
            )
        } else if lookahead.peek(Token![crate]) {
            let keyword = input.parse::<Token![crate]>()?;
            input.parse::<Token![=]>()?;
            set_once(
                &mut self.krate,
                "crate",
                keyword.span,
                parse_crate_path(input)?,
            )
        } else if input.peek(Ident::peek_any) {
            let unknown = input.call(Ident::parse_any)?;
            Err(Error::new(
                unknown.span(),
                unknown_argument_message(&unknown.unraw().to_string()),
            ))
        } else {
            Err(lookahead.error())
        }
    }
}

/// The one place that refuses an argument written twice, at the second
/// occurrence's keyword.
fn set_once<T>(slot: &mut Option<Arg<T>>, name: &str, keyword: Span, value: Arg<T>) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new(
            keyword,
            format!("`{name}` given twice; keep one"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn unknown_argument_message(unknown: &str) -> String {
    let expected = ARGUMENTS
        .iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut message = format!("unknown argument `{unknown}`; expected one of {expected}");
    if let Some(close) = closest(unknown, &ARGUMENTS) {
        message.push_str(&format!(" (did you mean `{close}`?)"));
    }
    message
}

/// The candidate `word` is most likely a typo of: within a small edit
/// distance, or containing all of its (three or more) letters in order
/// (`tresh` in `threshold`).
pub(crate) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(distance, c)| {
            *distance <= limit || (word.chars().count() >= 3 && is_subsequence(word, c))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

fn is_subsequence(word: &str, candidate: &str) -> bool {
    let mut rest = candidate.chars();
    word.chars().all(|w| rest.any(|c| c == w))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// A whole number: `5`. Zero is accepted here and refused by validation;
/// a negative number is refused here, since it has no representation.
fn parse_count(input: ParseStream, name: &str) -> Result<Arg<u64>> {
    // First: syn peeks `-1` as an integer literal.
    if input.peek(Token![-]) {
        return Err(negative(input, name)?);
    }
    let lookahead = input.lookahead1();
    if lookahead.peek(LitInt) {
        let lit: LitInt = input.parse()?;
        let value = lit.base10_parse::<u64>().map_err(|_| {
            Error::new(
                lit.span(),
                format!("`{name}` is too large: at most {}", u64::MAX),
            )
        })?;
        Ok(Arg::new(value, lit.span()))
    } else {
        Err(lookahead.error())
    }
}

/// The error for `name = -N`, spanning the sign and the number.
fn negative(input: ParseStream, name: &str) -> Result<Error> {
    let minus: Token![-] = input.parse()?;
    let value: syn::Lit = input.parse()?;
    let mut tokens = minus.to_token_stream();
    value.to_tokens(&mut tokens);
    let written = tokens.to_string().replace(' ', "");
    Ok(Error::new_spanned(
        tokens,
        format!("`{name}` must be a positive integer, got `{written}`"),
    ))
}

/// A period: whole seconds (`30`) or a duration string (`"500ms"`), in µs.
fn parse_period(input: ParseStream) -> Result<Arg<u64>> {
    if input.peek(Token![-]) {
        return Err(negative(input, "period")?);
    }
    let lookahead = input.lookahead1();
    if lookahead.peek(LitInt) {
        let seconds = parse_count(input, "period")?;
        let micros = duration::seconds_to_micros(seconds.value).ok_or_else(|| {
            Error::new(
                seconds.span,
                "`period` is too large to count in microseconds",
            )
        })?;
        Ok(Arg::new(micros, seconds.span))
    } else if lookahead.peek(LitStr) {
        let text: LitStr = input.parse()?;
        let micros = duration::parse_micros(&text.value()).ok_or_else(|| {
            Error::new(text.span(), duration::bad_duration_message(&text.value()))
        })?;
        Ok(Arg::new(micros, text.span()))
    } else if input.peek(LitFloat) {
        let lit: LitFloat = input.parse()?;
        Err(Error::new(
            lit.span(),
            format!(
                "`period` takes whole seconds; write fractions as a duration string, e.g. `period = \"{}ms\"`",
                lit.base10_parse::<f64>()
                    .map(|s| (s * 1000.0).round() as u64)
                    .unwrap_or(1500)
            ),
        ))
    } else {
        Err(lookahead.error())
    }
}

/// An algorithm, as an identifier (`gcra`) or a string (`"gcra"`).
fn parse_algorithm(input: ParseStream) -> Result<Arg<Algorithm>> {
    let (written, span) = parse_word(input)?;
    let expected = Algorithm::ALL.map(Algorithm::name);
    match Algorithm::ALL.into_iter().find(|a| a.name() == written) {
        Some(algorithm) => Ok(Arg::new(algorithm, span)),
        None => Err(Error::new(
            span,
            format!(
                "unknown algorithm `{written}`; expected one of {}{}",
                expected.map(|a| format!("`{a}`")).join(", "),
                closest(&written, &expected)
                    .map(|c| format!(" (did you mean `{c}`?)"))
                    .unwrap_or_default()
            ),
        )),
    }
}

/// `fail_open` or `fail_closed`, as an identifier or a string.
fn parse_on_error(input: ParseStream) -> Result<Arg<OnError>> {
    let (written, span) = parse_word(input)?;
    match written.as_str() {
        "fail_open" => Ok(Arg::new(OnError::FailOpen, span)),
        "fail_closed" => Ok(Arg::new(OnError::FailClosed, span)),
        _ => Err(Error::new(
            span,
            format!("unknown `on_error` value `{written}`; expected `fail_open` or `fail_closed`"),
        )),
    }
}

/// An identifier or a string literal, as text.
fn parse_word(input: ParseStream) -> Result<(String, Span)> {
    let lookahead = input.lookahead1();
    if lookahead.peek(Ident) {
        let ident: Ident = input.parse()?;
        Ok((ident.unraw().to_string(), ident.span()))
    } else if lookahead.peek(LitStr) {
        let text: LitStr = input.parse()?;
        Ok((text.value(), text.span()))
    } else {
        Err(lookahead.error())
    }
}

/// `crate = "path"`: where the generated code finds `rl_core`.
fn parse_crate_path(input: ParseStream) -> Result<Arg<Path>> {
    let text: LitStr = input.parse()?;
    let path = text.parse::<Path>().map_err(|_| {
        Error::new(
            text.span(),
            format!(
                "`crate` must be a path to `rl_core` or a re-export of it, e.g. `crate = \"my_crate::rl\"`; got {:?}",
                text.value()
            ),
        )
    })?;
    Ok(Arg::new(path, text.span()))
}

fn parse_expr(input: ParseStream) -> Result<Arg<Expr>> {
    let expr: Expr = input.parse()?;
    let span = expr.span();
    Ok(Arg::new(expr, span))
}

/// The annotated function. The body is kept as tokens: it is emitted as
/// written, never re-printed, so it costs nothing to parse and keeps every span.
pub(crate) struct Function {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) brace: token::Brace,
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) body: TokenStream,
}

impl Parse for Function {
    fn parse(input: ParseStream) -> Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        let content;
        let brace = braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body: TokenStream = content.parse()?;
        Ok(Function {
            attrs,
            vis,
            sig,
            brace,
            inner_attrs,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(tokens: TokenStream) -> Result<Args> {
        syn::parse2(tokens)
    }

    fn error(tokens: TokenStream) -> String {
        match parse(tokens) {
            Ok(_) => panic!("parsed"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn every_argument_is_read_with_its_value() {
        let args = parse(quote! {
            period = "1m", threshold = 5, key = user.id, algorithm = sliding_window, cost = 2,
            burst = 7, slots = 6, name = "login", limiter = self.limiter, on_error = fail_closed,
            crate = "my::rl",
        })
        .unwrap();
        assert_eq!(args.period.unwrap().value, 60_000_000);
        assert_eq!(args.threshold.unwrap().value, 5);
        assert!(args.key.is_some());
        assert_eq!(args.algorithm.unwrap().value, Algorithm::SlidingWindow);
        assert_eq!(args.cost.unwrap().value, 2);
        assert_eq!(args.burst.unwrap().value, 7);
        assert_eq!(args.slots.unwrap().value, 6);
        assert_eq!(args.name.unwrap().value.value(), "login");
        assert!(args.limiter.is_some());
        assert_eq!(args.on_error.unwrap().value, OnError::FailClosed);
        assert_eq!(args.krate.unwrap().value.segments.len(), 2);
    }

    #[test]
    fn nothing_is_an_empty_set_of_arguments() {
        let args = parse(quote!()).unwrap();
        assert!(args.period.is_none() && args.threshold.is_none());
    }

    #[test]
    fn a_bare_integer_period_is_seconds() {
        assert_eq!(
            parse(quote!(period = 30)).unwrap().period.unwrap().value,
            30_000_000
        );
    }

    #[test]
    fn algorithms_are_read_from_identifiers_and_strings() {
        for algorithm in Algorithm::ALL {
            let ident = Ident::new(algorithm.name(), Span::call_site());
            let name = algorithm.name();
            assert_eq!(
                parse(quote!(algorithm = #ident))
                    .unwrap()
                    .algorithm
                    .unwrap()
                    .value,
                algorithm
            );
            assert_eq!(
                parse(quote!(algorithm = #name))
                    .unwrap()
                    .algorithm
                    .unwrap()
                    .value,
                algorithm
            );
        }
    }

    #[test]
    fn every_argument_given_twice_is_refused_by_name() {
        for (first, second, name) in [
            (quote!(period = 1), quote!(period = 2), "period"),
            (quote!(threshold = 1), quote!(threshold = 2), "threshold"),
            (quote!(key = a), quote!(key = b), "key"),
            (
                quote!(algorithm = gcra),
                quote!(algorithm = gcra),
                "algorithm",
            ),
            (quote!(cost = 1), quote!(cost = 1), "cost"),
            (quote!(burst = 1), quote!(burst = 1), "burst"),
            (quote!(slots = 1), quote!(slots = 1), "slots"),
            (quote!(name = "a"), quote!(name = "b"), "name"),
            (quote!(limiter = a), quote!(limiter = b), "limiter"),
            (
                quote!(on_error = fail_open),
                quote!(on_error = fail_open),
                "on_error",
            ),
            (quote!(crate = "a"), quote!(crate = "b"), "crate"),
        ] {
            assert_eq!(
                error(quote!(#first, #second)),
                format!("`{name}` given twice; keep one")
            );
        }
    }

    #[test]
    fn an_unknown_argument_lists_the_valid_ones_and_suggests_the_closest() {
        let message = error(quote!(tresh = 5));
        assert!(
            message.starts_with(
                "unknown argument `tresh`; expected one of `period`, `threshold`, `key`,"
            ),
            "{message}"
        );
        assert!(message.contains("`crate`"), "{message}");
        assert!(
            message.ends_with("(did you mean `threshold`?)"),
            "{message}"
        );
        assert!(!error(quote!(zzz = 5)).contains("did you mean"));
    }

    #[test]
    fn negative_numbers_are_refused_with_the_value_shown() {
        assert_eq!(
            error(quote!(threshold = -1)),
            "`threshold` must be a positive integer, got `-1`"
        );
        assert_eq!(
            error(quote!(period = -5)),
            "`period` must be a positive integer, got `-5`"
        );
    }

    #[test]
    fn unreadable_values_are_refused() {
        assert!(error(quote!(period = "soon")).starts_with("cannot parse duration \"soon\""));
        assert!(error(quote!(period = 1.5)).contains("\"1500ms\""));
        assert!(error(quote!(algorithm = fastest)).starts_with("unknown algorithm `fastest`"));
        assert!(error(quote!(on_error = retry)).starts_with("unknown `on_error` value `retry`"));
        assert!(error(quote!(crate = "not a path")).starts_with("`crate` must be a path"));
        assert!(
            error(quote!(threshold = 99999999999999999999999))
                .starts_with("`threshold` is too large")
        );
        assert!(error(quote!(period = 99999999999999999)).starts_with("`period` is too large"));
    }

    #[test]
    fn arguments_must_be_separated_by_commas() {
        assert!(parse(quote!(period = 1 threshold = 2)).is_err());
    }

    #[test]
    fn closest_finds_typos_only() {
        assert_eq!(closest("treshold", &ARGUMENTS), Some("threshold"));
        assert_eq!(closest("perod", &ARGUMENTS), Some("period"));
        assert_eq!(closest("tresh", &ARGUMENTS), Some("threshold"));
        assert_eq!(closest("fooooo", &ARGUMENTS), None);
    }
}
