//! Parsing: the attribute's arguments and the annotated function.
//!
//! Every argument is kept with the span of its value, so that validation
//! (in `validate.rs`) can report cross-field problems at the right token.
//! Nothing here checks how arguments relate to each other.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Error, Expr, Ident, LitFloat, LitInt, LitStr, Path, Result, Signature, Token,
    Visibility, braced, bracketed, parenthesized, token,
};

/// Declares the attribute's arguments, each once: its field (the keyword,
/// unless `as "keyword"` says otherwise), the field's type and the reader
/// of what follows the keyword. From that one table come the two structs,
/// the lists the docs and messages show ([`ARGUMENTS`], [`ALSO_ARGUMENTS`])
/// and the dispatch from keyword to reader.
macro_rules! arguments {
    (
        $(#[$group_doc:meta])*
        group $group:ident {
            $( $(#[$gdoc:meta])* $gfield:ident $(as $gkw:literal)? : $gty:ty = $gread:ident, )*
        }
        $(#[$call_doc:meta])*
        call $call:ident {
            $( $(#[$cdoc:meta])* $cfield:ident $(as $ckw:literal)? : $cty:ty = $cread:ident, )*
        }
    ) => {
        $(#[$group_doc])*
        #[derive(Default)]
        pub(crate) struct $group {
            $( $(#[$gdoc])* pub(crate) $gfield: $gty, )*
        }

        $(#[$call_doc])*
        #[derive(Default)]
        pub(crate) struct $call {
            /// The function's own key and limits.
            pub(crate) group: $group,
            $( $(#[$cdoc])* pub(crate) $cfield: $cty, )*
        }

        /// Every argument, in the order the docs and error messages list them.
        pub(crate) const ARGUMENTS: &[&str] = &[
            $( keyword!($gfield $(, $gkw)?), )*
            $( keyword!($cfield $(, $ckw)?), )*
        ];

        /// The arguments `also(...)` takes: those describing one key and its limits.
        pub(crate) const ALSO_ARGUMENTS: &[&str] = &[ $( keyword!($gfield $(, $gkw)?), )* ];

        impl $group {
            /// Reads the argument `keyword` names (the keyword already
            /// read) into its field; `false`, having read nothing more, when
            /// it is not one of the group's.
            fn read(&mut self, keyword: &str, span: Span, input: ParseStream) -> Result<bool> {
                read_into!(self, keyword, span, input, $( $gfield $(as $gkw)? = $gread ),*)
            }
        }

        impl $call {
            /// Reads any argument (the group's, then the function's own) into
            /// its field; `false` when `keyword` names none.
            fn read(&mut self, keyword: &str, span: Span, input: ParseStream) -> Result<bool> {
                if self.group.read(keyword, span, input)? {
                    return Ok(true);
                }
                read_into!(self, keyword, span, input, $( $cfield $(as $ckw)? = $cread ),*)
            }
        }
    };
}

/// Reads the argument `$keyword` names (the keyword already read) into its
/// field of `$owner`, one of `$field`s, with its reader: `Ok(true)`, or
/// `Ok(false)` having read nothing more when it names none of them.
macro_rules! read_into {
    ($owner:expr, $keyword:expr, $span:expr, $input:expr, $( $field:ident $(as $kw:literal)? = $read:ident ),*) => {
        match $keyword {
            $( keyword!($field $(, $kw)?) => {
                let value = read::$read($input, keyword!($field $(, $kw)?), $span)?;
                Field::store(&mut $owner.$field, keyword!($field $(, $kw)?), $span, value)?;
                Ok(true)
            } )*
            _ => Ok(false),
        }
    };
}

/// An argument's keyword: its field's name, or the one `as` gives.
macro_rules! keyword {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $keyword:literal) => {
        $keyword
    };
}

arguments! {
    /// The arguments that describe one key and its limits: the function's own
    /// (main) group, or one `also(...)` group. `None` for the ones left out.
    group GroupArgs {
        /// In microseconds.
        period: Option<Arg<u64>> = duration,
        threshold: Option<Arg<u64>> = count,
        key: Option<Arg<Expr>> = expr,
        algorithm: Option<Arg<Algorithm>> = algorithm,
        /// Units each call takes: a number, or an expression over the
        /// arguments (each call's own cost).
        cost: Option<Arg<Cost>> = cost,
        /// The real cost, from the body's result: `|out| ...` (the group's
        /// cost is then an estimate).
        settle: Option<Arg<Expr>> = expr,
        burst: Option<Arg<u64>> = count,
        slots: Option<Arg<u64>> = count,
        /// Units one process may lease at most (quota leasing).
        lease: Option<Arg<u64>> = count,
        /// Once refused, refused for this long (a penalty box), in
        /// microseconds.
        block_for: Option<Arg<u64>> = duration,
        /// At most this many calls in flight per key.
        max_in_flight: Option<Arg<u64>> = count,
        /// The lease of an in-flight slot, in microseconds.
        in_flight_ttl: Option<Arg<u64>> = duration,
        name: Option<Arg<LitStr>> = string,
        /// The span is the brackets'; each rate keeps its string's span.
        limits: Option<Arg<Vec<Arg<Rate>>>> = limits,
        /// The expression giving each call's tier.
        tier: Option<Arg<Expr>> = expr,
        /// `tiers(free = [..], pro = [..])`; the span is the `tiers` keyword's.
        tiers: Option<Arg<Vec<TierArg>>> = tiers,
        /// A flag: the span is the keyword's.
        reset_on_success: Option<Arg<()>> = flag,
    }
    /// The arguments as written; `None` for the ones left out.
    call Args {
        limiter: Option<Arg<Expr>> = expr,
        on_error: Option<Arg<OnError>> = on_error,
        /// The groups of `also(...)`, in order (the one argument that may be
        /// given more than once).
        also: Vec<Also> = also,
        count: Option<Arg<Count>> = count_mode,
        count_if: Option<Arg<Expr>> = expr,
        on_reject: Option<Arg<Expr>> = expr,
        /// A flag: the span is the keyword's.
        headers: Option<Arg<()>> = flag,
        /// The longest wait for room, in microseconds; the span is the value's.
        wait: Option<Arg<u64>> = duration,
        krate as "crate": Option<Arg<Path>> = crate_path,
    }
}

/// Where a read value goes: an argument given once, or one that repeats.
trait Field<V> {
    fn store(&mut self, keyword: &str, span: Span, value: V) -> Result<()>;
}

impl<T> Field<Arg<T>> for Option<Arg<T>> {
    /// The one place that refuses an argument written twice, at the second
    /// occurrence's keyword.
    fn store(&mut self, keyword: &str, span: Span, value: Arg<T>) -> Result<()> {
        if self.is_some() {
            return Err(Error::new(
                span,
                format!("`{keyword}` given twice; keep one"),
            ));
        }
        *self = Some(value);
        Ok(())
    }
}

impl Field<Also> for Vec<Also> {
    fn store(&mut self, _: &str, _: Span, value: Also) -> Result<()> {
        self.push(value);
        Ok(())
    }
}

/// The readers of what follows a keyword, named in the table above: each
/// gets the input after the keyword, the keyword and its span.
mod read {
    use super::*;

    /// `= value`, read by `value`.
    fn assigned<T>(input: ParseStream, value: impl FnOnce(ParseStream) -> Result<T>) -> Result<T> {
        input.parse::<Token![=]>()?;
        value(input)
    }

    pub(super) fn duration(input: ParseStream, keyword: &str, _: Span) -> Result<Arg<u64>> {
        assigned(input, |input| parse_duration(input, keyword))
    }

    pub(super) fn count(input: ParseStream, keyword: &str, _: Span) -> Result<Arg<u64>> {
        assigned(input, |input| parse_count(input, keyword))
    }

    /// `cost = 3` (checked against each limit's capacity at compile time)
    /// or `cost = <expr>` (each call's own, checked when the call is made).
    pub(super) fn cost(input: ParseStream, keyword: &str, _: Span) -> Result<Arg<Cost>> {
        assigned(input, |input| {
            // A number alone (perhaps negative, refused as a count) is a
            // fixed cost; anything else, `2 * n` included, an expression.
            let fork = input.fork();
            let _ = fork.parse::<Option<Token![-]>>();
            let lone_number =
                fork.parse::<LitInt>().is_ok() && (fork.is_empty() || fork.peek(Token![,]));
            if lone_number {
                let count = parse_count(input, keyword)?;
                return Ok(Arg::new(Cost::Units(count.value), count.span));
            }
            let expr = parse_expr(input)?;
            Ok(Arg::new(Cost::Expr(expr.value), expr.span))
        })
    }

    pub(super) fn expr(input: ParseStream, _: &str, _: Span) -> Result<Arg<Expr>> {
        assigned(input, parse_expr)
    }

    pub(super) fn algorithm(input: ParseStream, _: &str, _: Span) -> Result<Arg<Algorithm>> {
        assigned(input, parse_algorithm)
    }

    pub(super) fn string(input: ParseStream, _: &str, _: Span) -> Result<Arg<LitStr>> {
        assigned(input, |input| {
            let text: LitStr = input.parse()?;
            let span = text.span();
            Ok(Arg::new(text, span))
        })
    }

    pub(super) fn limits(input: ParseStream, _: &str, _: Span) -> Result<Arg<Vec<Arg<Rate>>>> {
        assigned(input, parse_limits)
    }

    pub(super) fn tiers(input: ParseStream, _: &str, span: Span) -> Result<Arg<Vec<TierArg>>> {
        parse_tiers(input, span)
    }

    pub(super) fn flag(input: ParseStream, keyword: &str, span: Span) -> Result<Arg<()>> {
        parse_flag(input, keyword, span)
    }

    pub(super) fn on_error(input: ParseStream, _: &str, _: Span) -> Result<Arg<OnError>> {
        assigned(input, parse_on_error)
    }

    pub(super) fn count_mode(input: ParseStream, _: &str, _: Span) -> Result<Arg<Count>> {
        assigned(input, parse_count_mode)
    }

    pub(super) fn crate_path(input: ParseStream, _: &str, _: Span) -> Result<Arg<Path>> {
        assigned(input, parse_crate_path)
    }

    pub(super) fn also(input: ParseStream, _: &str, span: Span) -> Result<Also> {
        let content;
        parenthesized!(content in input);
        let group = parse_also(&content)?;
        Ok(Also { group, span })
    }
}

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

/// A group's `cost`: a number of units, or an expression giving each
/// call's own.
pub(crate) enum Cost {
    Units(u64),
    Expr(Expr),
}

impl GroupArgs {
    /// `cost` when it is a number (the one the limits are checked against
    /// at compile time).
    pub(crate) fn cost_units(&self) -> Option<Arg<u64>> {
        match &self.cost {
            Some(Arg {
                value: Cost::Units(units),
                span,
            }) => Some(Arg::new(*units, *span)),
            _ => None,
        }
    }
}

/// The algorithms: the grammar's, shared with `ratewall`.
pub(crate) use ratewall_grammar::Algorithm;

/// The `on_error` values, mirroring `ratewall::FailurePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnError {
    FailOpen,
    FailClosed,
    /// Decide in process with `threshold / share`.
    Local(u64),
}

/// One string of `limits = [...]`: `"5/1h"` read as 5 per 3 600 000 000 µs.
#[derive(Debug, Clone)]
pub(crate) struct Rate {
    pub(crate) threshold: u64,
    pub(crate) period_us: u64,
    /// As written, for messages.
    pub(crate) text: String,
}

/// One tier of `tiers(...)`: its name and its limits.
pub(crate) struct TierArg {
    /// As written (an identifier or a string), with its span.
    pub(crate) name: Arg<String>,
    /// The span is the brackets'; each rate keeps its string's span.
    pub(crate) limits: Arg<Vec<Arg<Rate>>>,
}

/// One `also(...)`: another key decided with the function's own.
pub(crate) struct Also {
    pub(crate) group: GroupArgs,
    /// The `also` keyword, where a missing `name` is reported.
    pub(crate) span: Span,
}

/// The `count = ...` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// Only calls returning `Err` count.
    Failures,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            if !input.peek(Ident::peek_any) {
                return Err(Error::new(
                    input.span(),
                    format!("expected an argument, one of {}", listed(ARGUMENTS)),
                ));
            }
            let word = input.call(Ident::parse_any)?;
            let keyword = word.unraw().to_string();
            if !args.read(&keyword, word.span(), input)? {
                return Err(Error::new(word.span(), unknown_argument_message(&keyword)));
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// The inside of `also(...)`: the arguments of one group, nothing else.
fn parse_also(input: ParseStream) -> Result<GroupArgs> {
    let mut group = GroupArgs::default();
    while !input.is_empty() {
        if !input.peek(Ident::peek_any) {
            return Err(Error::new(
                input.span(),
                format!(
                    "expected an argument of `also(...)`, one of {}",
                    listed(ALSO_ARGUMENTS)
                ),
            ));
        }
        let word = input.call(Ident::parse_any)?;
        let keyword = word.unraw().to_string();
        if !group.read(&keyword, word.span(), input)? {
            return Err(also_argument_error(word.span(), &keyword));
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(group)
}

/// The error for an argument `also(...)` does not take, at its name.
fn also_argument_error(span: Span, written: &str) -> Error {
    let expected = listed(ALSO_ARGUMENTS);
    if written == "also" {
        return Error::new(
            span,
            "`also(...)` cannot be nested: write each extra key as its own `also(...)` among the main arguments",
        );
    }
    if ARGUMENTS.contains(&written) {
        return Error::new(
            span,
            format!(
                "`{written}` applies to the whole function, not to one `also(...)` group; move it to the main \
                 arguments (`also(...)` takes {expected})"
            ),
        );
    }
    let mut message =
        format!("unknown argument `{written}` in `also(...)`; expected one of {expected}");
    if let Some(close) = closest(written, ALSO_ARGUMENTS) {
        message.push_str(&format!(" (did you mean `{close}`?)"));
    }
    Error::new(span, message)
}

/// A flag takes no value: `headers`, not `headers = true`.
fn parse_flag(input: ParseStream, name: &str, keyword: Span) -> Result<Arg<()>> {
    if input.peek(Token![=]) {
        let equals: Token![=] = input.parse()?;
        return Err(Error::new(
            equals.span,
            format!("`{name}` is a flag and takes no value: write `{name}` alone, or leave it out"),
        ));
    }
    Ok(Arg::new((), keyword))
}

/// `count = failures`.
fn parse_count_mode(input: ParseStream) -> Result<Arg<Count>> {
    let (written, span) = parse_word(input)?;
    match written.as_str() {
        "failures" => Ok(Arg::new(Count::Failures, span)),
        _ => Err(Error::new(
            span,
            format!(
                "unknown `count` value `{written}`; expected `failures` (only calls returning `Err` count), or say \
                 which calls count with `count_if = |out| ...`"
            ),
        )),
    }
}

/// `tiers(free = ["10/1m"], pro = ["1000/1m", "20/1s"])`: a non-empty list
/// of tier names (identifiers or strings), each with a list of rates.
/// Whether a name is a valid tier name is left to validation.
fn parse_tiers(input: ParseStream, keyword: Span) -> Result<Arg<Vec<TierArg>>> {
    const EXAMPLE: &str = "e.g. `tiers(free = [\"10/1m\"], pro = [\"1000/1m\", \"20/1s\"])`";
    if !input.peek(token::Paren) {
        return Err(Error::new(
            keyword,
            format!("`tiers` takes each tier's name and limits in parentheses, {EXAMPLE}"),
        ));
    }
    let content;
    let parens = parenthesized!(content in input);
    let mut tiers = Vec::new();
    while !content.is_empty() {
        let lookahead = content.lookahead1();
        let name = if lookahead.peek(LitStr) {
            let text: LitStr = content.parse()?;
            Arg::new(text.value(), text.span())
        } else if lookahead.peek(Ident::peek_any) {
            let ident = content.call(Ident::parse_any)?;
            Arg::new(ident.unraw().to_string(), ident.span())
        } else {
            return Err(Error::new(
                content.span(),
                format!(
                    "expected a tier name (an identifier or a string) and its limits, {EXAMPLE}"
                ),
            ));
        };
        if !content.peek(Token![=]) {
            return Err(Error::new(
                name.span,
                format!(
                    "tier `{}` needs its limits: `{} = [\"10/1m\"]`",
                    name.value, name.value
                ),
            ));
        }
        content.parse::<Token![=]>()?;
        let limits = parse_rate_list(&content, &format!("tier `{}`", name.value), &name.value)?;
        tiers.push(TierArg { name, limits });
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    if tiers.is_empty() {
        return Err(Error::new(
            parens.span.join(),
            format!("`tiers` needs at least one tier, {EXAMPLE}"),
        ));
    }
    Ok(Arg::new(tiers, keyword))
}

/// `limits = ["5/1m", "100/1d"]`: a non-empty list of rate strings.
fn parse_limits(input: ParseStream) -> Result<Arg<Vec<Arg<Rate>>>> {
    parse_rate_list(input, "`limits`", "limits")
}

/// A non-empty list of rate strings; `what` names it in messages (`` `limits` ``,
/// ``tier `pro` ``), `assign` is what the example assigns to.
fn parse_rate_list(input: ParseStream, what: &str, assign: &str) -> Result<Arg<Vec<Arg<Rate>>>> {
    if input.peek(LitStr) {
        let text: LitStr = input.parse()?;
        return Err(Error::new(
            text.span(),
            format!(
                "{what} takes a list of strings, even for one limit: `{assign} = [{:?}]`",
                text.value()
            ),
        ));
    }
    let content;
    let brackets = bracketed!(content in input);
    let strings = Punctuated::<LitStr, Token![,]>::parse_terminated(&content)?;
    let span = brackets.span.join();
    if strings.is_empty() {
        return Err(Error::new(
            span,
            format!("{what} needs at least one limit, e.g. `{assign} = [\"5/1m\", \"100/1d\"]`"),
        ));
    }
    let rates = strings
        .iter()
        .map(|text| {
            parse_rate(&text.value())
                .map(|rate| Arg::new(rate, text.span()))
                .ok_or_else(|| Error::new(text.span(), bad_rate_message(&text.value())))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arg::new(rates, span))
}

/// `"5/1h"`, `"100/30s"`, `"10/d"`, `"10 per minute"`: [`ratewall_grammar::parse_rate`], the grammar
/// of `ratewall::Limit`'s `FromStr`. `None` when unreadable. Zero values are
/// read and left to validation.
pub(crate) fn parse_rate(text: &str) -> Option<Rate> {
    let rate = ratewall_grammar::parse_rate(text).ok()?;
    Some(Rate {
        threshold: rate.threshold,
        period_us: rate.period_us,
        text: text.to_owned(),
    })
}

fn bad_rate_message(text: &str) -> String {
    ratewall_grammar::BadRate(text.to_owned()).to_string()
}

/// `a`, `b`, `c`: the names quoted and joined, for messages.
pub(crate) fn listed(names: &[&str]) -> String {
    names
        .iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_argument_message(unknown: &str) -> String {
    let expected = listed(ARGUMENTS);
    let mut message = format!("unknown argument `{unknown}`; expected one of {expected}");
    if let Some(close) = closest(unknown, ARGUMENTS) {
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

/// A duration argument `name` (`period`, `in_flight_ttl`, `wait`): whole
/// seconds (`30`) or a duration string (`"500ms"`), in µs.
fn parse_duration(input: ParseStream, name: &str) -> Result<Arg<u64>> {
    if input.peek(Token![-]) {
        return Err(negative(input, name)?);
    }
    let lookahead = input.lookahead1();
    if lookahead.peek(LitInt) {
        let seconds = parse_count(input, name)?;
        let micros = seconds.value.checked_mul(1_000_000).ok_or_else(|| {
            Error::new(
                seconds.span,
                format!("`{name}` is too large to count in microseconds"),
            )
        })?;
        Ok(Arg::new(micros, seconds.span))
    } else if lookahead.peek(LitStr) {
        let text: LitStr = input.parse()?;
        let micros = ratewall_grammar::parse_duration_micros(&text.value())
            .map_err(|error| Error::new(text.span(), error))?;
        Ok(Arg::new(micros, text.span()))
    } else if input.peek(LitFloat) {
        let lit: LitFloat = input.parse()?;
        Err(Error::new(
            lit.span(),
            format!(
                "`{name}` takes whole seconds; write fractions as a duration string, e.g. `{name} = \"{}ms\"`",
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

/// `fail_open`, `fail_closed` or `local(N)`, as an identifier (or a string
/// `"fail_open"`, `"fail_closed"`, `"local:N"`).
fn parse_on_error(input: ParseStream) -> Result<Arg<OnError>> {
    const LOCAL_NEEDS_SHARE: &str = "`on_error = local(N)` needs how many instances share the limit, \
         a positive integer: e.g. `local(4)` decides with threshold / 4 while the backend is down";
    let (written, span) = parse_word(input)?;
    match written.as_str() {
        "fail_open" => Ok(Arg::new(OnError::FailOpen, span)),
        "fail_closed" => Ok(Arg::new(OnError::FailClosed, span)),
        "local" => {
            if !input.peek(syn::token::Paren) {
                return Err(Error::new(span, LOCAL_NEEDS_SHARE));
            }
            let content;
            syn::parenthesized!(content in input);
            let share: LitInt = content
                .parse()
                .map_err(|e| Error::new(e.span(), LOCAL_NEEDS_SHARE))?;
            match share.base10_parse::<u64>() {
                Ok(share) if share > 0 => Ok(Arg::new(OnError::Local(share), span)),
                _ => Err(Error::new(share.span(), LOCAL_NEEDS_SHARE)),
            }
        }
        text => match text.strip_prefix("local:").map(str::parse::<u64>) {
            Some(Ok(share)) if share > 0 => Ok(Arg::new(OnError::Local(share), span)),
            Some(_) => Err(Error::new(span, LOCAL_NEEDS_SHARE)),
            None => Err(Error::new(
                span,
                format!(
                    "unknown `on_error` value `{written}`; expected `fail_open`, `fail_closed` or `local(N)`"
                ),
            )),
        },
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

/// `crate = "path"`: where the generated code finds `ratewall`.
fn parse_crate_path(input: ParseStream) -> Result<Arg<Path>> {
    let text: LitStr = input.parse()?;
    let path = text.parse::<Path>().map_err(|_| {
        Error::new(
            text.span(),
            format!(
                "`crate` must be a path to `ratewall` or a re-export of it, e.g. `crate = \"my_crate::rl\"`; got {:?}",
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
        assert_eq!(args.group.cost_units().unwrap().value, 2);
        assert_eq!(args.group.period.unwrap().value, 60_000_000);
        assert_eq!(args.group.threshold.unwrap().value, 5);
        assert!(args.group.key.is_some());
        assert_eq!(
            args.group.algorithm.unwrap().value,
            Algorithm::SlidingWindow
        );
        assert_eq!(args.group.burst.unwrap().value, 7);
        assert_eq!(args.group.slots.unwrap().value, 6);
        assert_eq!(args.group.name.unwrap().value.value(), "login");
        assert!(args.limiter.is_some());
        assert_eq!(args.on_error.unwrap().value, OnError::FailClosed);
        assert_eq!(args.krate.unwrap().value.segments.len(), 2);
    }

    #[test]
    fn nothing_is_an_empty_set_of_arguments() {
        let args = parse(quote!()).unwrap();
        assert!(args.group.period.is_none() && args.group.threshold.is_none());
    }

    #[test]
    fn a_bare_integer_period_is_seconds() {
        assert_eq!(
            parse(quote!(period = 30))
                .unwrap()
                .group
                .period
                .unwrap()
                .value,
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
                    .group
                    .algorithm
                    .unwrap()
                    .value,
                algorithm
            );
            assert_eq!(
                parse(quote!(algorithm = #name))
                    .unwrap()
                    .group
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
            (quote!(limits = ["1/s"]), quote!(limits = ["1/s"]), "limits"),
            (quote!(count = failures), quote!(count = failures), "count"),
            (quote!(count_if = f), quote!(count_if = g), "count_if"),
            (quote!(on_reject = f), quote!(on_reject = g), "on_reject"),
            (quote!(headers), quote!(headers), "headers"),
            (quote!(wait = "1s"), quote!(wait = 2), "wait"),
            (
                quote!(reset_on_success),
                quote!(reset_on_success),
                "reset_on_success",
            ),
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
        assert!(error(quote!(wait = "soon")).starts_with("cannot parse duration \"soon\""));
        assert!(error(quote!(wait = 0.5)).contains("`wait = \"500ms\"`"));
        assert_eq!(
            error(quote!(wait = -1)),
            "`wait` must be a positive integer, got `-1`"
        );
    }

    #[test]
    fn arguments_must_be_separated_by_commas() {
        assert!(parse(quote!(period = 1 threshold = 2)).is_err());
    }

    #[test]
    fn the_new_arguments_are_read_with_their_values() {
        let args = parse(quote! {
            limits = ["1/1m", "5/1h", "10/d"], count = failures, reset_on_success, headers,
            on_reject = |r| r, count_if = is_failure,
            also(name = "sms_ip", key = ip, limits = ["20/1h"], algorithm = sliding_log, cost = 2,
                 reset_on_success),
            also(name = "global", period = 60, threshold = 100, burst = 10, slots = 6),
        })
        .unwrap();
        let limits = args.group.limits.unwrap().value;
        let rates: Vec<(u64, u64)> = limits
            .iter()
            .map(|r| (r.value.threshold, r.value.period_us))
            .collect();
        assert_eq!(
            rates,
            [(1, 60_000_000), (5, 3_600_000_000), (10, 86_400_000_000)]
        );
        assert_eq!(limits[2].value.text, "10/d");
        assert_eq!(args.count.unwrap().value, Count::Failures);
        assert!(args.group.reset_on_success.is_some() && args.headers.is_some());
        assert!(args.on_reject.is_some() && args.count_if.is_some());
        assert_eq!(args.also.len(), 2);
        let ip = &args.also[0].group;
        assert_eq!(ip.name.as_ref().unwrap().value.value(), "sms_ip");
        assert!(ip.key.is_some() && ip.reset_on_success.is_some());
        assert_eq!(ip.algorithm.as_ref().unwrap().value, Algorithm::SlidingLog);
        assert_eq!(ip.cost_units().unwrap().value, 2);
        let global = &args.also[1].group;
        assert_eq!(global.period.as_ref().unwrap().value, 60_000_000);
        assert_eq!(global.threshold.as_ref().unwrap().value, 100);
        assert_eq!(global.burst.as_ref().unwrap().value, 10);
        assert_eq!(global.slots.as_ref().unwrap().value, 6);
    }

    #[test]
    fn rates_follow_the_core_grammar() {
        let rate = |text: &str| parse_rate(text).map(|r| (r.threshold, r.period_us));
        assert_eq!(rate("5/1h"), Some((5, 3_600_000_000)));
        assert_eq!(rate("100/30s"), Some((100, 30_000_000)));
        assert_eq!(rate("3/500ms"), Some((3, 500_000)));
        assert_eq!(rate(" 10 / d "), Some((10, 86_400_000_000)));
        assert_eq!(rate("7/min"), Some((7, 60_000_000)));
        assert_eq!(rate("2/30"), Some((2, 30_000_000)));
        assert_eq!(rate("0/1h"), Some((0, 3_600_000_000)), "left to validation");
        assert_eq!(rate("10 per minute"), Some((10, 60_000_000)));
        assert_eq!(rate("10/second"), Some((10, 1_000_000)));
        assert_eq!(rate("5 per 30 seconds"), Some((5, 30_000_000)));
        for bad in [
            "5",
            "5/",
            "x/1h",
            "-1/1h",
            "5/1w",
            "5 every hour",
            "5/1h/2",
            "/1h",
        ] {
            assert_eq!(rate(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unreadable_new_values_are_refused_with_how_to_fix() {
        assert!(error(quote!(limits = ["5 every hour"])).starts_with(
            "cannot parse rate \"5 every hour\": expected THRESHOLD/PERIOD or THRESHOLD per PERIOD"
        ));
        assert_eq!(
            error(quote!(limits = "5/1h")),
            "`limits` takes a list of strings, even for one limit: `limits = [\"5/1h\"]`"
        );
        assert!(error(quote!(limits = [])).starts_with("`limits` needs at least one limit"));
        assert!(error(quote!(count = errors)).starts_with("unknown `count` value `errors`"));
        assert!(
            error(quote!(headers = true)).starts_with("`headers` is a flag and takes no value")
        );
    }

    #[test]
    fn also_takes_only_group_arguments() {
        assert!(
            error(quote!(also(name = "a", also(name = "b"))))
                .starts_with("`also(...)` cannot be nested")
        );
        let message = error(quote!(also(name = "a", limiter = l)));
        assert!(
            message.starts_with("`limiter` applies to the whole function"),
            "{message}"
        );
        let message = error(quote!(also(name = "a", tresh = 5)));
        assert!(
            message.starts_with(
                "unknown argument `tresh` in `also(...)`; expected one of `period`, `threshold`, `key`, \
                 `algorithm`, `cost`, `settle`, `burst`, `slots`, `lease`, `block_for`, `max_in_flight`, \
                 `in_flight_ttl`, `name`, `limits`, `tier`, `tiers`, `reset_on_success`"
            ),
            "{message}"
        );
        assert!(
            message.ends_with("(did you mean `threshold`?)"),
            "{message}"
        );
        assert_eq!(
            error(quote!(also(name = "a", name = "b"))),
            "`name` given twice; keep one"
        );
    }

    #[test]
    fn tiers_are_read_with_their_names_and_limits_in_and_out_of_also() {
        let args = parse(quote! {
            tier = user.plan(), tiers(free = ["10/1m"], "pro-2" = ["1000/1m", "20/1s"], r#type = ["1/d"]),
            also(name = "team", key = team, tier = "shared", tiers(shared = ["5/1h"])),
        })
        .unwrap();
        assert!(args.group.tier.is_some());
        let tiers = args.group.tiers.unwrap().value;
        let read: Vec<(String, Vec<(u64, u64)>)> = tiers
            .iter()
            .map(|t| {
                let rates = t
                    .limits
                    .value
                    .iter()
                    .map(|r| (r.value.threshold, r.value.period_us));
                (t.name.value.clone(), rates.collect())
            })
            .collect();
        assert_eq!(
            read,
            [
                ("free".to_owned(), vec![(10, 60_000_000)]),
                (
                    "pro-2".to_owned(),
                    vec![(1000, 60_000_000), (20, 1_000_000)]
                ),
                ("type".to_owned(), vec![(1, 86_400_000_000)]),
            ]
        );
        let team = &args.also[0].group;
        assert!(team.tier.is_some());
        assert_eq!(team.tiers.as_ref().unwrap().value[0].name.value, "shared");
    }

    #[test]
    fn unreadable_tiers_are_refused_with_how_to_fix() {
        assert!(error(quote!(tiers())).starts_with("`tiers` needs at least one tier"));
        assert!(
            error(quote!(tiers = ["1/1m"]))
                .starts_with("`tiers` takes each tier's name and limits")
        );
        assert_eq!(
            error(quote!(tiers(free))),
            "tier `free` needs its limits: `free = [\"10/1m\"]`"
        );
        assert_eq!(
            error(quote!(tiers(free = "1/1m"))),
            "tier `free` takes a list of strings, even for one limit: `free = [\"1/1m\"]`"
        );
        assert!(
            error(quote!(tiers(free = []))).starts_with("tier `free` needs at least one limit")
        );
        assert!(error(quote!(tiers(5 = ["1/1m"]))).starts_with("expected a tier name"));
        assert_eq!(
            error(quote!(tier = a, tier = b)),
            "`tier` given twice; keep one"
        );
        assert_eq!(
            error(quote!(tiers(a = ["1/1m"]), tiers(b = ["1/1m"]))),
            "`tiers` given twice; keep one"
        );
    }

    #[test]
    fn closest_finds_typos_only() {
        assert_eq!(closest("treshold", ARGUMENTS), Some("threshold"));
        assert_eq!(closest("perod", ARGUMENTS), Some("period"));
        assert_eq!(closest("tresh", ARGUMENTS), Some("threshold"));
        assert_eq!(closest("fooooo", ARGUMENTS), None);
    }

    #[test]
    fn on_error_local_takes_the_number_of_instances_sharing_the_limit() {
        let local = |tokens| parse(tokens).unwrap().on_error.unwrap().value;
        assert_eq!(local(quote!(on_error = local(4))), OnError::Local(4));
        assert_eq!(local(quote!(on_error = "local:2")), OnError::Local(2));
        for bad in [
            quote!(on_error = local),
            quote!(on_error = local(0)),
            quote!(on_error = "local:x"),
        ] {
            assert!(
                error(bad)
                    .contains("`on_error = local(N)` needs how many instances share the limit")
            );
        }
        assert!(
            error(quote!(on_error = retry))
                .contains("expected `fail_open`, `fail_closed` or `local(N)`")
        );
    }
}
