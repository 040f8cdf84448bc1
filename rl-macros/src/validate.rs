//! Validation after parsing: the function's shape and every rule that
//! relates two arguments, each reported at the span parsing stored.
//!
//! The limit rules are `ratewall_grammar::problems`, the ones `ratewall::Limit`
//! checks (its const constructor fails compilation on anything this module
//! lets through), reported here at the argument that breaks them, plus
//! `Limit::check_cost`, which the limiter would otherwise only apply at run
//! time. They apply to every limit of every group: the function's own and
//! each `also(...)`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Error, Expr, GenericArgument, LitStr, Path, PathArguments, ReceiverKind, Result, ReturnType,
    Signature, Type, TypeReference,
};

use crate::attr::{Algorithm, Arg, Args, Cost, Count, GroupArgs, OnError, Rate};

use ratewall_grammar::{DEFAULT_SLOTS, LeaseProblem, Problem};

/// Everything expansion needs, defaults filled in and all rules checked.
pub(crate) struct Config {
    /// The function's own group first, then each `also(...)` in order.
    pub(crate) groups: Vec<GroupConfig>,
    pub(crate) limiter: Option<Arg<Expr>>,
    pub(crate) on_error: Option<OnError>,
    pub(crate) krate: Option<Path>,
    /// Where a failed `From<Rejection>` conversion is reported: the `E` of
    /// `Result<T, E>`, or the whole return type.
    pub(crate) error_type_span: Span,
    /// Which calls count (`count` / `count_if`); `None`: every admitted call.
    pub(crate) counting: Option<Counting>,
    pub(crate) on_reject: Option<Arg<Expr>>,
    /// The `headers` keyword, when given.
    pub(crate) headers: Option<Span>,
    /// `wait`: how long a call may wait for room, in µs (never zero).
    pub(crate) wait: Option<u64>,
    /// The return type as written, `()` when there is none.
    pub(crate) output: Type,
    /// A `&mut self` or `self` method: the body's block borrows what it
    /// uses (precisely, field by field) rather than moving the receiver, so
    /// a limiter borrowed from another field of `self` can stay borrowed.
    pub(crate) borrows_self: bool,
    /// The first `max_in_flight`, when a group has one: the permit holds
    /// the slots until the body has returned.
    pub(crate) in_flight: Option<Span>,
}

impl Config {
    /// Whether the body's result is needed as a value before returning it
    /// (and the permit kept until then).
    pub(crate) fn wraps_body(&self) -> bool {
        self.counting.is_some()
            || self.headers.is_some()
            || self.in_flight.is_some()
            || self.settles()
    }

    /// Whether a group settles its cost from the body's result.
    pub(crate) fn settles(&self) -> bool {
        self.groups.iter().any(|g| g.settle.is_some())
    }
}

/// Which admitted calls keep what they took.
pub(crate) enum Counting {
    /// `count = failures`: the ones returning `Err`; the span is `failures`'.
    Failures(Span),
    /// `count_if = <expr>`: the ones the predicate accepts.
    If(Arg<Expr>),
}

/// One key and its limits, checked.
pub(crate) struct GroupConfig {
    /// `None` for the function's own group without `name`: the default name.
    pub(crate) name: Option<LitStr>,
    pub(crate) key: Option<Arg<Expr>>,
    pub(crate) limits: Vec<LimitConfig>,
    pub(crate) cost: u64,
    /// `cost = <expr>`: each call's own cost (`cost` is then unused).
    pub(crate) cost_expr: Option<Arg<Expr>>,
    /// `settle = <expr>`: the real cost from the body's result.
    pub(crate) settle: Option<Arg<Expr>>,
    pub(crate) reset_on_success: bool,
    /// The expression giving each call's tier, for a tiered group.
    pub(crate) tier: Option<Arg<Expr>>,
    /// A tiered group's tiers (its `limits` are then empty).
    pub(crate) tiers: Option<Vec<TierConfig>>,
}

impl GroupConfig {
    /// Every limit the group's calls may be decided by: its own, or each
    /// of its tiers'.
    pub(crate) fn every_limit(&self) -> impl Iterator<Item = &LimitConfig> + Clone {
        self.limits
            .iter()
            .chain(self.tiers.iter().flatten().flat_map(|t| t.limits.iter()))
    }
}

/// One tier of a group, checked.
pub(crate) struct TierConfig {
    pub(crate) name: String,
    pub(crate) limits: Vec<LimitConfig>,
}

/// The parts of one `ratewall::Limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitConfig {
    pub(crate) threshold: u64,
    pub(crate) period_us: u64,
    pub(crate) algorithm: Algorithm,
    pub(crate) burst: u64,
    pub(crate) slots: u64,
    /// Units one process may lease at most (0: no leasing).
    pub(crate) lease: u64,
    /// Once refused, refused for this long, in µs (0: no block).
    pub(crate) block_us: u64,
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
    let Args {
        group,
        limiter,
        on_error,
        krate,
        also,
        count,
        count_if,
        on_reject,
        headers,
        wait,
    } = args;
    let error_type_span = check_signature(sig, on_reject.is_none(), &mut errors);
    let in_flight = group
        .max_in_flight
        .as_ref()
        .or_else(|| also.iter().find_map(|a| a.group.max_in_flight.as_ref()))
        .map(|m| m.span);

    // Every `reset_on_success`, checked against `count` below.
    let mut resets: Vec<Span> = Vec::new();
    // Names in use, to refuse two groups sharing one.
    let mut names: Vec<String> = Vec::new();
    if let Some(name) = &group.name {
        names.push(name.value.value());
    }
    resets.extend(group.reset_on_success.as_ref().map(|r| r.span));
    let main = validate_group(group, None, &mut errors);
    let mut groups = vec![main];
    for also in also {
        resets.extend(also.group.reset_on_success.as_ref().map(|r| r.span));
        match &also.group.name {
            None => errors.push(
                also.span,
                "`also(...)` needs a `name`: it scopes the group's keys and names the group in rejections and \
                 headers, e.g. `also(name = \"sms_ip\", key = ip, limits = [\"20/1h\"])`",
            ),
            Some(name) => {
                let value = name.value.value();
                if !value.is_empty() {
                    if names.contains(&value) {
                        errors.push(
                            name.span,
                            format!(
                                "the name {value:?} is already used by another group of this function; give each \
                                 `also(...)` its own `name` (groups with one name would share their counters)"
                            ),
                        );
                    }
                    names.push(value);
                }
            }
        }
        groups.push(validate_group(also.group, Some(also.span), &mut errors));
    }

    let counting = match (count, count_if) {
        (Some(_), Some(count_if)) => {
            errors.push(
                count_if.span,
                "`count` and `count_if` both say which calls count; keep one",
            );
            None
        }
        (Some(count), None) => match count.value {
            Count::Failures => Some(Counting::Failures(count.span)),
        },
        (None, Some(count_if)) => Some(Counting::If(count_if)),
        (None, None) => None,
    };
    if let Some(Counting::Failures(span)) = &counting
        && !returns_result(sig)
    {
        errors.push(
            *span,
            "`count = failures` counts the calls that return `Err`, but this function does not return a `Result`; \
             say which calls count with `count_if = |out: &T| ...` instead",
        );
    }
    if counting.is_none() {
        for span in resets {
            errors.push(
                span,
                "`reset_on_success` only applies when calls are counted selectively: add `count = failures` or \
                 `count_if = ...`, or remove it",
            );
        }
    }
    let settle = groups
        .iter()
        .flatten()
        .find_map(|g| g.settle.as_ref().map(|s| s.span));
    if let (Some(span), Some(counting)) = (settle, &counting) {
        let argument = match counting {
            Counting::Failures(_) => "count",
            Counting::If(_) => "count_if",
        };
        errors.push(
            span,
            format!(
                "`settle` and `{argument}` both decide what a call keeps after it ran; keep `settle`, and give \
                 back everything for a call that should not count by settling it at 0 (`settle = |out| match out \
                 {{ Ok(answer) => answer.tokens, Err(_) => 0 }}`)"
            ),
        );
    }
    let holds_result = match (&counting, &headers) {
        (Some(Counting::Failures(_)), _) => Some("count"),
        (Some(Counting::If(_)), _) => Some("count_if"),
        (None, Some(_)) => Some("headers"),
        (None, None) => in_flight
            .map(|_| "max_in_flight")
            .or(settle.map(|_| "settle")),
    };
    if let (Some(argument), ReturnType::Type(_, ty)) = (holds_result, &sig.output)
        && let Some(span) = impl_trait_span(ty.to_token_stream())
    {
        errors.push(
            span,
            format!(
                "`{argument}` keeps the function's result in a local before returning it, and a local cannot have \
                 an `impl Trait` type; return a concrete type (e.g. a `Box<dyn Trait>`), or remove `{argument}`"
            ),
        );
    }

    if let Some(wait) = &wait {
        check_wait(wait, &counting, &groups, in_flight.is_some(), &mut errors);
    }

    let output = match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    let borrows_self = sig.receiver().is_some_and(|receiver| match &receiver.kind {
        ReceiverKind::Reference(_, _, mutability) => mutability.is_some(),
        ReceiverKind::Typed(_, ty) => !matches!(
            **ty,
            Type::Reference(TypeReference {
                mutability: None,
                ..
            })
        ),
        _ => true,
    });

    let Some(groups) = groups.into_iter().collect::<Option<Vec<_>>>() else {
        return Err(errors.0.expect("an invalid group was reported"));
    };
    let config = Config {
        groups,
        limiter,
        on_error: on_error.map(|o| o.value),
        krate: krate.map(|k| k.value),
        error_type_span,
        counting,
        on_reject,
        headers: headers.map(|h| h.span),
        wait: wait.map(|w| w.value),
        output,
        borrows_self,
        in_flight,
    };
    errors.finish(config)
}

/// `wait`: longer than zero, every call counted (a tiered call waits on
/// its tier's limits), no `max_in_flight` (`in_flight`: in any group), and
/// every limit of the
/// call of one kind: GCRA and the buckets reserve one time for all their
/// limits, the window algorithms retry, and a call cannot do both.
fn check_wait(
    wait: &Arg<u64>,
    counting: &Option<Counting>,
    groups: &[Option<GroupConfig>],
    in_flight: bool,
    errors: &mut Errors,
) {
    if wait.value == 0 {
        errors.push(
            wait.span,
            "`wait` must be longer than zero: a call that may not wait is refused at once, which is what \
             leaving `wait` out does",
        );
    }
    if let Some(counting) = counting {
        let argument = match counting {
            Counting::Failures(_) => "count",
            Counting::If(_) => "count_if",
        };
        errors.push(
            wait.span,
            format!(
                "`wait` cannot be combined with `{argument}`: giving back a unit of a limit with queued callers \
                 would hand a reserved slot out twice; remove `wait` or `{argument}`"
            ),
        );
    }
    if in_flight {
        let group = groups
            .iter()
            .flatten()
            .find(|g| g.every_limit().any(|l| l.algorithm.is_in_flight()))
            .map_or_else(
                || "in the function".to_owned(),
                |g| match &g.name {
                    Some(name) => format!("in group {:?}", name.value()),
                    None => "in the function's own group".to_owned(),
                },
            );
        errors.push(
            wait.span,
            format!(
                "`wait` cannot be combined with `max_in_flight` ({group}): a slot of a concurrency limit frees \
                 when a running call ends, which no reserved time or retry can promise, and a waiting call would \
                 hold its other limits' units meanwhile; remove `wait` or `max_in_flight`"
            ),
        );
    }
    // Rate limits only: `max_in_flight` was reported above. A tiered
    // group's every tier counts: any of them may decide a call.
    let limits = groups.iter().flatten().flat_map(|g| {
        g.every_limit()
            .filter(|l| !l.algorithm.is_in_flight())
            .map(move |l| (g, l))
    });
    let queued = limits.clone().find(|(_, l)| l.algorithm.reserves());
    let windowed = limits.clone().find(|(_, l)| !l.algorithm.reserves());
    // A call with a limit that blocks retries, whatever its algorithms:
    // nothing to mix.
    let blocks = limits.clone().any(|(_, l)| l.block_us > 0);
    if let (Some((qg, ql)), Some((wg, wl)), false) = (queued, windowed, blocks) {
        let group = |g: &GroupConfig| match &g.name {
            Some(name) => format!("group {:?}", name.value()),
            None => "the function's own group".to_owned(),
        };
        errors.push(
            wait.span,
            format!(
                "`wait` cannot wait for `{}` ({}) and `{}` ({}) in one call: a waiting call reserves one time on \
                 `gcra`, `token_bucket` and `leaky_bucket` but retries the window algorithms, and the two \
                 cannot be done atomically together; give every limit of the function one kind, or remove `wait`",
                ql.algorithm.name(),
                group(qg),
                wl.algorithm.name(),
                group(wg),
            ),
        );
    }
}

/// Where a limit's threshold and period were written.
enum Source<'a> {
    /// `period = ..., threshold = ...`.
    Args { threshold: Span, period: Span },
    /// One string of `limits = [...]`, or of a tier's list.
    Text {
        rate: &'a Arg<Rate>,
        /// The tier's name, for a tier's limit.
        tier: Option<&'a str>,
    },
}

impl Source<'_> {
    /// What messages about this limit start with.
    fn prefix(&self) -> String {
        match self {
            Source::Args { .. } => String::new(),
            Source::Text {
                rate,
                tier: Some(tier),
            } => format!("tier `{tier}`: limit {:?}: ", rate.value.text),
            Source::Text { rate, tier: None } => format!("limit {:?}: ", rate.value.text),
        }
    }
}

/// A limit's threshold, period and where they were written.
type Written<'a> = (u64, u64, Source<'a>);

/// A tier's name and its limits as written (`None`: one is unusable).
type TierRates<'a> = (&'a str, Option<Vec<Written<'a>>>);

/// Checks one group's arguments; `None` when they cannot make limits
/// (the reasons are in `errors`). `also` is the `also` keyword's span for
/// an `also(...)` group.
fn validate_group(args: GroupArgs, also: Option<Span>, errors: &mut Errors) -> Option<GroupConfig> {
    let within = if also.is_some() {
        "in `also(...)`: "
    } else {
        ""
    };
    let algorithm = args.algorithm.as_ref().map_or(Algorithm::Gcra, |a| a.value);
    let rates = args.limits.is_some()
        || args.period.is_some()
        || args.threshold.is_some()
        || args.tiers.is_some();
    // Only `max_in_flight`: its own check says what the rate arguments are for.
    let rate_arguments_apply = rates || args.max_in_flight.is_none();

    for (arg, name) in [
        (&args.threshold, "threshold"),
        (&args.cost_units(), "cost"),
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
    // The lease's own rules first (zero, an algorithm that cannot lease);
    // its size against each limit's capacity below.
    let mut lease = args.lease.as_ref().map_or(0, |l| l.value);
    if let Some(arg) = &args.lease {
        let problem = if arg.value == 0 {
            Some(LeaseProblem::Zero)
        } else if !ratewall_grammar::can_lease(algorithm) {
            Some(LeaseProblem::Algorithm(algorithm))
        } else {
            None
        };
        if let Some(problem) = problem {
            errors.push(arg.span, problem.to_string());
            lease = 0;
        }
    }
    // The block's own rules (its bounds, never beside `lease`; a group
    // with only `max_in_flight` is told below): the grammar's.
    let mut block = args.block_for.as_ref().map_or(0, |b| b.value);
    if let Some(arg) = &args.block_for
        && let Err(problem) =
            ratewall_grammar::check_block(arg.value, algorithm, u64::from(args.lease.is_some()))
    {
        errors.push(arg.span, format!("{within}`block_for`: {problem}"));
        block = 0;
    }
    // The grammar's rule (shared with ratewall's configuration forms):
    // `burst` and `slots` only where the algorithm uses them.
    if let Some(burst) = &args.burst
        && rate_arguments_apply
        && let Err(problem) = ratewall_grammar::check_settings(algorithm, true, false)
    {
        errors.push(burst.span, problem.to_string());
    }
    if let Some(slots) = &args.slots
        && rate_arguments_apply
        && let Err(problem) = ratewall_grammar::check_settings(algorithm, false, true)
    {
        errors.push(slots.span, problem.to_string());
    }
    let in_flight = check_in_flight(&args, rates, within, errors);
    if let Some(settle) = &args.settle
        && rates
    {
        check_settle(settle.span, &args, algorithm, within, errors);
    }

    if let Some(name) = &args.name
        && name.value.value().is_empty()
    {
        errors.push(
            name.span,
            "`name` must not be empty: it scopes the keys and labels the metrics",
        );
    }

    let slots = args.slots.as_ref().map_or(DEFAULT_SLOTS, |s| s.value);
    let cost = args.cost_units().map_or(1, |c| c.value);
    let burst = args.burst.as_ref().map(|b| b.value);
    let valid_numbers = slots != 0 && cost != 0 && burst != Some(0);
    let mut cost_reported = false;

    if args.tier.is_some() || args.tiers.is_some() {
        let tiers = validate_tiers(&args, within, errors)?;
        // `max_in_flight` beside tiers: each tier holds its own slots (its
        // own state, `<group>@<tier>`), that many at once.
        let in_flight = in_flight?;
        let mut checked = Vec::with_capacity(tiers.len());
        let mut complete = valid_numbers;
        for (tier, limits) in tiers {
            match limits {
                Some(limits) if valid_numbers => {
                    let mut limits = check_limits(
                        &limits,
                        &args,
                        (algorithm, lease, block),
                        &mut cost_reported,
                        errors,
                    );
                    limits.extend(in_flight);
                    checked.push(TierConfig {
                        name: tier.to_owned(),
                        limits,
                    });
                }
                _ => complete = false,
            }
        }
        if !complete {
            return None;
        }
        return Some(GroupConfig {
            name: args.name.map(|n| n.value),
            key: args.key,
            limits: Vec::new(),
            cost,
            cost_expr: cost_expr(args.cost),
            settle: args.settle,
            reset_on_success: args.reset_on_success.is_some(),
            tier: args.tier,
            tiers: Some(checked),
        });
    }

    // Each limit with where it was written; zero ones are reported and left out.
    let mut limits: Vec<Written> = Vec::new();
    let mut complete = true;
    if let Some(list) = &args.limits {
        for (arg, name) in [(&args.period, "period"), (&args.threshold, "threshold")] {
            if let Some(arg) = arg {
                errors.push(
                    arg.span,
                    format!(
                        "`{name}` cannot be combined with `limits`, which gives each limit's threshold and period \
                         (`limits = [\"5/1m\", \"100/1d\"]`); remove `{name}`, or use `period` and `threshold` \
                         without `limits`"
                    ),
                );
            }
        }
        match read_rates(list, None, errors) {
            Some(rates) => limits = rates,
            None => complete = false,
        }
    } else if rates || args.max_in_flight.is_none() {
        if args.threshold.is_none() {
            errors.push(
                also.unwrap_or_else(Span::call_site),
                format!(
                    "{within}missing `threshold`: how many calls each key may make per `period`, e.g. \
                     `threshold = 10`; or give every limit as a string, e.g. `limits = [\"10/1m\", \"100/1d\"]`"
                ),
            );
        }
        if args.period.is_none() {
            errors.push(
                also.unwrap_or_else(Span::call_site),
                format!(
                    "{within}missing `period`: the window `threshold` applies to, in seconds (`period = 60`) or \
                     as a duration string (`period = \"1m\"`)"
                ),
            );
        }
        match (&args.threshold, &args.period) {
            (Some(threshold), Some(period)) if threshold.value > 0 && period.value > 0 => {
                limits.push((
                    threshold.value,
                    period.value,
                    Source::Args {
                        threshold: threshold.span,
                        period: period.span,
                    },
                ));
            }
            _ => complete = false,
        }
    }

    if !complete || !valid_numbers {
        return None;
    }
    let in_flight = in_flight?;
    let mut checked = check_limits(
        &limits,
        &args,
        (algorithm, lease, block),
        &mut cost_reported,
        errors,
    );
    checked.extend(in_flight);

    Some(GroupConfig {
        name: args.name.map(|n| n.value),
        key: args.key,
        limits: checked,
        cost,
        cost_expr: cost_expr(args.cost),
        settle: args.settle,
        reset_on_success: args.reset_on_success.is_some(),
        tier: None,
        tiers: None,
    })
}

/// `cost = <expr>`, when the cost is one.
fn cost_expr(cost: Option<Arg<Cost>>) -> Option<Arg<Expr>> {
    match cost {
        Some(Arg {
            value: Cost::Expr(expr),
            span,
        }) => Some(Arg { value: expr, span }),
        _ => None,
    }
}

/// Checks `settle` against the group's cost and algorithm: it needs an
/// estimate to settle, and an algorithm that can carry a real cost above
/// it as debt.
fn check_settle(
    span: Span,
    args: &GroupArgs,
    algorithm: Algorithm,
    within: &str,
    errors: &mut Errors,
) {
    if args.cost.is_none() {
        errors.push(
            span,
            format!(
                "{within}`settle` gives the real cost of a call whose `cost` is an estimate, but this group has no \
                 `cost`: add the estimate each call takes before its real cost is known, e.g. \
                 `cost = estimate_tokens(&request), settle = |out| out.usage.total_tokens`"
            ),
        );
    }
    if algorithm == Algorithm::SlidingLog {
        errors.push(
            args.algorithm.as_ref().map_or(span, |a| a.span),
            format!(
                "{within}`settle` needs an algorithm that can carry debt (a real cost above the estimate, paid by \
                 later calls): `gcra` (the default), `token_bucket` and `leaky_bucket` carry it unit for unit, \
                 `fixed_window` and `sliding_window` count it in the current window; `sliding_log` keeps one entry \
                 per unit and at most `threshold` of them at one time, so a cost above the estimate could not be \
                 counted in full; pick one of the others"
            ),
        );
    }
}

/// Checks `tier` and `tiers(...)` together and against the other
/// arguments; each tier's name with its limits as written (`None`: a
/// limit reported unusable). `None` when `tiers` is missing.
fn validate_tiers<'a>(
    args: &'a GroupArgs,
    within: &str,
    errors: &mut Errors,
) -> Option<Vec<TierRates<'a>>> {
    const EXAMPLE: &str =
        "e.g. `tier = user.plan(), tiers(free = [\"10/1m\"], pro = [\"1000/1m\"])`";
    match (&args.tier, &args.tiers) {
        (Some(tier), None) => {
            errors.push(
                tier.span,
                format!(
                    "{within}`tier` chooses one of the limits of `tiers(...)`, which is missing: give each tier's \
                     limits, {EXAMPLE}"
                ),
            );
            return None;
        }
        (None, Some(tiers)) => errors.push(
            tiers.span,
            format!(
                "{within}`tiers(...)` needs `tier = ...`, the expression giving each call's tier (over the \
                 function's arguments), {EXAMPLE}"
            ),
        ),
        _ => {}
    }
    let tiers = args.tiers.as_ref()?;
    for (arg, name) in [
        (args.limits.as_ref().map(|l| l.span), "limits"),
        (args.period.as_ref().map(|p| p.span), "period"),
        (args.threshold.as_ref().map(|t| t.span), "threshold"),
    ] {
        if let Some(span) = arg {
            errors.push(
                span,
                format!(
                    "`{name}` cannot be combined with `tiers(...)`, where each tier gives its own limits; move them \
                     into the tiers (`tiers(free = [\"10/1m\"], pro = [\"1000/1m\"])`), or remove `tiers`"
                ),
            );
        }
    }
    if let Some(name) = &args.name
        && name
            .value
            .value()
            .contains(ratewall_grammar::TIER_SEPARATOR)
    {
        errors.push(
            name.span,
            "the `name` of a group with `tiers` must not contain `@`: each tier is named `<name>@<tier>` \
             (e.g. `api@pro`) in `set_limits`, limits files, keys and metrics",
        );
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut checked = Vec::with_capacity(tiers.value.len());
    for tier in &tiers.value {
        let name = tier.name.value.as_str();
        if let Err(bad) = ratewall_grammar::check_tier_name(name) {
            errors.push(tier.name.span, bad);
        } else if seen.contains(&name) {
            errors.push(
                tier.name.span,
                format!("tier `{name}` is given twice; keep one (each tier has one set of limits)"),
            );
        }
        seen.push(name);
        checked.push((name, read_rates(&tier.limits, Some(name), errors)));
    }
    Some(checked)
}

/// The rates of a list (`limits = [...]` or a tier's), each checked on its
/// own; `None` when one is unusable (reported).
fn read_rates<'a>(
    list: &'a Arg<Vec<Arg<Rate>>>,
    tier: Option<&'a str>,
    errors: &mut Errors,
) -> Option<Vec<Written<'a>>> {
    let mut limits = Vec::with_capacity(list.value.len());
    let mut complete = true;
    for (index, rate) in list.value.iter().enumerate() {
        let Rate {
            threshold,
            period_us,
            ..
        } = &rate.value;
        let source = Source::Text { rate, tier };
        let prefix = source.prefix();
        if *threshold == 0 {
            errors.push(
                rate.span,
                format!("{prefix}`threshold` must be at least 1, got 0"),
            );
            complete = false;
        } else if *period_us == 0 {
            errors.push(
                rate.span,
                format!("{prefix}the period must be longer than zero"),
            );
            complete = false;
        } else if let Some(earlier) = list.value[..index]
            .iter()
            .find(|earlier| earlier.value.period_us == *period_us)
        {
            errors.push(
                rate.span,
                format!(
                    "{prefix}{:?} already limits this key over the same period; each limit needs its own \
                     period (state is kept per algorithm and period), so keep the stricter one",
                    earlier.value.text
                ),
            );
            complete = false;
        } else {
            limits.push((*threshold, *period_us, source));
        }
    }
    complete.then_some(limits)
}

/// Checks each limit against the group's algorithm, burst, slots and
/// cost; each gets the group's lease and block (`0`: none, or one already
/// reported).
fn check_limits(
    limits: &[Written<'_>],
    args: &GroupArgs,
    (algorithm, lease, block_us): (Algorithm, u64, u64),
    cost_reported: &mut bool,
    errors: &mut Errors,
) -> Vec<LimitConfig> {
    let slots = args.slots.as_ref().map_or(DEFAULT_SLOTS, |s| s.value);
    let cost = args.cost_units().map_or(1, |c| c.value);
    let burst = args.burst.as_ref().map(|b| b.value);
    let mut checked = Vec::with_capacity(limits.len());
    for (threshold, period_us, source) in limits {
        let (threshold, period_us) = (*threshold, *period_us);
        let burst = burst.unwrap_or(threshold);
        let prefix = source.prefix();
        let (threshold_span, period_span) = match source {
            Source::Args { threshold, period } => (*threshold, *period),
            Source::Text { rate, .. } => (rate.span, rate.span),
        };

        // Zero values were reported at their argument above.
        for problem in ratewall_grammar::problems(threshold, period_us, algorithm, burst, slots) {
            match problem {
                Problem::UnevenSlots { .. } => {
                    let span = match (source, &args.slots) {
                        (Source::Args { .. }, Some(slots)) => slots.span,
                        _ => period_span,
                    };
                    errors.push(span, format!("{prefix}{problem}"));
                }
                Problem::TooLarge { capacity, .. } => {
                    // The larger of threshold and burst, where it was written.
                    let span = match (&args.burst, source) {
                        (Some(b), Source::Args { .. })
                            if b.value == capacity && capacity > threshold =>
                        {
                            b.span
                        }
                        _ => threshold_span,
                    };
                    errors.push(span, format!("{prefix}{problem}"));
                }
                _ => errors.push(threshold_span, format!("{prefix}{problem}")),
            }
        }

        if let Some(arg) = &args.lease
            && lease > 0
            && let Err(problem) = ratewall_grammar::check_lease(threshold, algorithm, burst, lease)
        {
            errors.push(arg.span, format!("{prefix}{problem}"));
        }

        let (capacity, capacity_name) = if algorithm.uses_burst() {
            (burst, "burst")
        } else {
            (threshold, "threshold")
        };
        if let Some(cost_arg) = &args.cost_units()
            && cost > capacity
        {
            // The same explicit `burst` for every limit: one message, at `cost`.
            let (span, prefix) = match source {
                Source::Text { .. } if algorithm.uses_burst() && args.burst.is_some() => {
                    (cost_arg.span, String::new())
                }
                Source::Text { rate, .. } => (rate.span, prefix),
                Source::Args { .. } => (cost_arg.span, prefix),
            };
            if prefix.is_empty() && std::mem::replace(cost_reported, true) {
                continue;
            }
            errors.push(
                span,
                format!(
                    "{prefix}`cost = {cost}` exceeds the capacity of {capacity} (the `{capacity_name}` of `{}`), \
                     so every call would be refused; lower `cost` or raise `{capacity_name}`",
                    algorithm.name()
                ),
            );
        }

        checked.push(LimitConfig {
            threshold,
            period_us,
            algorithm,
            burst,
            slots,
            lease,
            block_us,
        });
    }
    checked
}

/// Checks `max_in_flight` and `in_flight_ttl` of a group that has rate
/// limits (`rates`) or not: the in-flight limit to add (`Some(None)`: none),
/// or `None` when they are invalid (the reasons are in `errors`).
fn check_in_flight(
    args: &GroupArgs,
    rates: bool,
    within: &str,
    errors: &mut Errors,
) -> Option<Option<LimitConfig>> {
    let Some(max) = &args.max_in_flight else {
        if let Some(ttl) = &args.in_flight_ttl {
            errors.push(
                ttl.span,
                format!(
                    "{within}`in_flight_ttl` is the lease of the slots `max_in_flight` hands out; add \
                     `max_in_flight = N`, or remove it"
                ),
            );
            return None;
        }
        return Some(None);
    };
    let mut valid = true;
    if max.value == 0 {
        errors.push(
            max.span,
            "`max_in_flight` must be at least 1, got 0 (it would refuse every call)",
        );
        valid = false;
    }
    if !rates {
        for (name, span) in [
            ("algorithm", args.algorithm.as_ref().map(|a| a.span)),
            ("burst", args.burst.as_ref().map(|a| a.span)),
            ("slots", args.slots.as_ref().map(|a| a.span)),
            ("cost", args.cost.as_ref().map(|a| a.span)),
            ("settle", args.settle.as_ref().map(|a| a.span)),
            ("lease", args.lease.as_ref().map(|a| a.span)),
            ("block_for", args.block_for.as_ref().map(|a| a.span)),
            (
                "reset_on_success",
                args.reset_on_success.as_ref().map(|a| a.span),
            ),
        ] {
            if let Some(span) = span {
                errors.push(
                    span,
                    format!(
                        "{within}`{name}` applies to rate limits (`period` and `threshold`, or `limits`), and this \
                         group has only `max_in_flight` (a call holds one slot, whatever its cost); remove `{name}`, \
                         or add a rate limit"
                    ),
                );
                valid = false;
            }
        }
    }
    let ttl = args
        .in_flight_ttl
        .as_ref()
        .map_or(ratewall_grammar::DEFAULT_LEASE_TTL_US, |t| t.value);
    if max.value > 0 {
        for problem in ratewall_grammar::problems(
            max.value,
            ttl,
            Algorithm::InFlight,
            max.value,
            DEFAULT_SLOTS,
        ) {
            let problem = match problem {
                Problem::ZeroPeriod => Problem::LeaseTtlOutOfRange { ttl_us: 0 },
                other => other,
            };
            let span = match (problem, &args.in_flight_ttl) {
                (Problem::LeaseTtlOutOfRange { .. }, Some(ttl)) => ttl.span,
                _ => max.span,
            };
            errors.push(span, format!("{within}{problem}"));
            valid = false;
        }
    }
    valid.then_some(Some(LimitConfig {
        threshold: max.value,
        period_us: ttl,
        algorithm: Algorithm::InFlight,
        burst: max.value,
        slots: DEFAULT_SLOTS,
        // Slots are held, not spent: no quota leasing, and no block.
        lease: 0,
        block_us: 0,
    }))
}

/// The span of the first `impl` in a type (`impl Display`,
/// `Result<impl Display, E>`), which no local can be declared with.
fn impl_trait_span(tokens: TokenStream) -> Option<Span> {
    tokens.into_iter().find_map(|token| match token {
        TokenTree::Ident(ident) if ident == "impl" => Some(ident.span()),
        TokenTree::Group(group) => impl_trait_span(group.stream()),
        _ => None,
    })
}

const MUST_RETURN: &str = "`#[rate_limit]` functions must return `Result<T, E>` with \
    `E: From<ratewall::Rejection>`, so that a refused call can return an error";

/// Whether the function returns a `Result` (or an alias named like one).
fn returns_result(sig: &Signature) -> bool {
    match &sig.output {
        ReturnType::Default => false,
        ReturnType::Type(_, ty) => result_error_type(ty).is_some(),
    }
}

/// The function must be `async` and, unless `on_reject` builds the refused
/// call's value (`needs_result` false), return a `Result`. Returns the span
/// of the error type, where a missing `From<Rejection>` is reported.
fn check_signature(sig: &Signature, needs_result: bool, errors: &mut Errors) -> Span {
    if sig.asyncness.is_none() {
        errors.push(
            sig.fn_token.span,
            "`#[rate_limit]` needs an `async fn`: the limiter is asked before the body runs; write `async fn`",
        );
    }
    match &sig.output {
        ReturnType::Default => {
            let span = sig.paren_token.span.close();
            if needs_result {
                errors.push(
                    span,
                    format!(
                        "{MUST_RETURN}; add e.g. `-> Result<(), ratewall::Rejection>`, or build the refused call's \
                         value with `on_reject = ...`"
                    ),
                );
            }
            span
        }
        ReturnType::Type(_, ty) => match result_error_type(ty) {
            Some(span) => span,
            None => {
                if needs_result {
                    errors.push(
                        ty.span(),
                        format!(
                            "{MUST_RETURN}; this type is not a `Result` (nor an alias whose name ends in \
                             `Result`); to return something else, build the refused call's value with \
                             `on_reject = |rejection| ...`"
                        ),
                    );
                }
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
        let group = &config.groups[0];
        assert_eq!(
            group.limits,
            [LimitConfig {
                threshold: 5,
                period_us: 60_000_000,
                algorithm: Algorithm::Gcra,
                burst: 5,
                slots: 10,
                lease: 0,
                block_us: 0
            }]
        );
        assert_eq!(group.cost, 1);
        assert!(group.key.is_none() && config.limiter.is_none() && group.name.is_none());
        assert!(config.on_error.is_none() && config.krate.is_none());
        assert!(!config.wraps_body());
    }

    #[test]
    fn a_lease_is_refused_at_zero_at_the_capacity_and_on_a_sliding_log() {
        assert!(
            single(quote!(period = 60, threshold = 100, lease = 0))
                .starts_with("lease must be at least 1, got 0")
        );
        assert!(
            single(quote!(period = 60, threshold = 100, lease = 100))
                .starts_with("lease 100 must be smaller than the capacity of 100 (the burst)")
        );
        assert!(
            single(quote!(limits = ["100/1m", "5/1h"], lease = 10))
                .starts_with("limit \"5/1h\": lease 10 must be smaller than the capacity of 5")
        );
        assert!(
            single(quote!(
                period = 60,
                threshold = 100,
                algorithm = sliding_log,
                lease = 10
            ))
            .starts_with("`sliding_log` cannot lease")
        );
        let config = check(
            quote!(
                period = 60,
                threshold = 100,
                lease = 10,
                also(
                    name = "ip",
                    key = ip,
                    period = 60,
                    threshold = 50,
                    lease = 5
                )
            ),
            quote!(async fn f() -> Result<(), E>),
        )
        .unwrap();
        assert_eq!(config.groups[0].limits[0].lease, 10);
        assert_eq!(config.groups[1].limits[0].lease, 5);
    }

    #[test]
    fn a_block_applies_to_every_rate_limit_of_its_group_and_tier_within_its_bounds() {
        let config = check(
            quote!(
                limits = ["5/1m", "20/1h"],
                block_for = "15m",
                max_in_flight = 2,
                also(
                    name = "ip",
                    key = ip,
                    tier = plan,
                    tiers(free = ["1/1s"]),
                    block_for = 30
                )
            ),
            quote!(async fn f(ip: u32, plan: &str) -> Result<(), E>),
        )
        .unwrap();
        let blocks: Vec<u64> = config.groups[0].limits.iter().map(|l| l.block_us).collect();
        // The in-flight slots never block.
        assert_eq!(blocks, [900_000_000, 900_000_000, 0]);
        let tier = &config.groups[1].tiers.as_ref().unwrap()[0];
        assert_eq!(tier.limits[0].block_us, 30_000_000);
        for (args, expected) in [
            (
                quote!(period = 60, threshold = 5, block_for = 0),
                "`block_for`: a block lasts from 1ms to 30d",
            ),
            (
                quote!(period = 60, threshold = 5, block_for = "31d"),
                "got 31d",
            ),
            (
                quote!(period = 60, threshold = 5, lease = 2, block_for = "1m"),
                "`block_for`: a limit cannot both lease and block",
            ),
            (
                quote!(max_in_flight = 2, block_for = "1m"),
                "`block_for` applies to rate limits",
            ),
        ] {
            let message = single(args);
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn wait_beside_a_block_retries_whatever_the_algorithms() {
        let config = check(
            quote!(
                period = 1,
                threshold = 5,
                block_for = "1m",
                wait = "2s",
                also(
                    name = "ip",
                    key = ip,
                    period = 1,
                    threshold = 50,
                    algorithm = fixed_window
                )
            ),
            quote!(async fn f(ip: u32) -> Result<(), E>),
        );
        assert!(config.is_ok());
    }

    #[test]
    fn a_lease_applies_to_the_rate_limits_of_a_group_never_to_its_in_flight_slots() {
        assert!(
            single(quote!(max_in_flight = 10, lease = 5))
                .starts_with("`lease` applies to rate limits"),
        );
        let config = check(
            quote!(period = 60, threshold = 100, lease = 10, max_in_flight = 5),
            quote!(async fn f() -> Result<(), E>),
        )
        .unwrap();
        let leases: Vec<(Algorithm, u64)> = config.groups[0]
            .limits
            .iter()
            .map(|l| (l.algorithm, l.lease))
            .collect();
        assert_eq!(
            leases,
            [(Algorithm::Gcra, 10), (Algorithm::InFlight, 0)],
            "{leases:?}"
        );
    }

    #[test]
    fn wait_is_a_positive_duration_on_limits_of_one_kind_counting_every_call() {
        let config = check(
            quote!(
                period = 1,
                threshold = 5,
                wait = "1500ms",
                also(name = "ip", limits = ["9/1s"], algorithm = leaky_bucket)
            ),
            quote!(async fn f() -> Result<(), E>),
        )
        .unwrap();
        assert_eq!(config.wait, Some(1_500_000));
        let windows = check(
            quote!(period = 1, threshold = 5, algorithm = sliding_log, wait = 2),
            quote!(async fn f() -> Result<(), E>),
        )
        .unwrap();
        assert_eq!(windows.wait, Some(2_000_000));
        assert!(
            single(quote!(period = 1, threshold = 5, wait = "0s"))
                .starts_with("`wait` must be longer than zero")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 5,
                wait = "1s",
                count = failures
            ))
            .starts_with("`wait` cannot be combined with `count`")
        );
        assert!(
            single(quote!(period = 1, threshold = 5, wait = "1s", count_if = f))
                .starts_with("`wait` cannot be combined with `count_if`")
        );
        let mixed = single(quote!(
            name = "sms",
            period = 1,
            threshold = 5,
            wait = "1s",
            also(name = "sms_ip", limits = ["9/1h"], algorithm = fixed_window)
        ));
        assert!(
            mixed.starts_with(
                "`wait` cannot wait for `gcra` (group \"sms\") and `fixed_window` (group \"sms_ip\") in one call"
            ),
            "{mixed}"
        );
    }

    #[test]
    fn wait_with_max_in_flight_in_any_group_is_one_error_at_wait() {
        let beside = single(quote!(
            name = "export",
            period = 1,
            threshold = 5,
            wait = "1s",
            also(name = "export_running", max_in_flight = 4)
        ));
        assert!(
            beside.starts_with(
                "`wait` cannot be combined with `max_in_flight` (in group \"export_running\")"
            ),
            "{beside}"
        );
        let alone = single(quote!(max_in_flight = 2, wait = "1s"));
        assert!(
            alone.starts_with(
                "`wait` cannot be combined with `max_in_flight` (in the function's own group)"
            ),
            "{alone}"
        );
        // In one group beside a gcra rate: the same single error (not also
        // one about mixing kinds of limits).
        let together = single(quote!(
            period = 1,
            threshold = 5,
            max_in_flight = 2,
            wait = "1s"
        ));
        assert!(
            together.starts_with("`wait` cannot be combined with `max_in_flight`"),
            "{together}"
        );
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
            message.starts_with("a period of 1001 µs cannot be split into 10 equal slots"),
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
            message.contains("use the sliding-window counter (`sliding_window`)"),
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
    fn values_beyond_two_to_the_52_are_refused_at_the_larger_of_threshold_and_burst() {
        // A day is 8.64e10 µs and 2^52 ≈ 4.504e15: up to 52 124 per day.
        assert!(
            single(quote!(period = "1d", threshold = 52_125))
                .starts_with("capacity × period = 52125 × ")
        );
        assert!(
            single(quote!(period = "1d", threshold = 1, burst = 52_125))
                .starts_with("capacity × period = 52125 × ")
        );
        assert!(
            check(
                quote!(period = "1d", threshold = 52_124),
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

    fn ok(args: TokenStream, sig: TokenStream) -> Config {
        match check(args, sig) {
            Ok(config) => config,
            Err(error) => panic!("refused: {error}"),
        }
    }

    fn messages_for(args: TokenStream, sig: TokenStream) -> Vec<String> {
        match check(args, sig) {
            Ok(_) => panic!("accepted"),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn limits_give_each_limit_the_algorithm_burst_and_slots() {
        let config = ok(
            quote!(
                limits = ["1/1m", "6/1h"],
                algorithm = sliding_window,
                slots = 6
            ),
            quote!(async fn f() -> Result<(), E>),
        );
        let limits = &config.groups[0].limits;
        assert_eq!(limits.len(), 2);
        assert_eq!((limits[0].threshold, limits[0].period_us), (1, 60_000_000));
        assert_eq!((limits[1].threshold, limits[1].burst), (6, 6));
        assert!(
            limits
                .iter()
                .all(|l| l.algorithm == Algorithm::SlidingWindow && l.slots == 6)
        );
        assert!(
            config.groups.len() == 1 && !config.wraps_body(),
            "several limits on one key are one group, and the body runs unchanged"
        );
        let config = ok(
            quote!(limits = ["1/1m", "6/1h"], burst = 3),
            quote!(async fn f() -> Result<(), E>),
        );
        assert!(config.groups[0].limits.iter().all(|l| l.burst == 3));
    }

    #[test]
    fn every_limit_string_is_checked_at_the_string() {
        assert_eq!(
            single(quote!(limits = ["1/1m", "0/1h"])),
            "limit \"0/1h\": `threshold` must be at least 1, got 0"
        );
        assert_eq!(
            single(quote!(limits = ["5/0s"])),
            "limit \"5/0s\": the period must be longer than zero"
        );
        assert!(single(quote!(limits = ["5/1h", "10/60m"])).starts_with(
            "limit \"10/60m\": \"5/1h\" already limits this key over the same period"
        ));
        assert!(
            single(quote!(limits = ["1/1m", "104250/1d"]))
                .starts_with("limit \"104250/1d\": capacity × period = 104250 × ")
        );
        assert!(
            single(quote!(limits = ["20000/1h"], algorithm = sliding_log))
                .starts_with("limit \"20000/1h\": a sliding log stores one entry")
        );
        assert!(
            single(quote!(limits = ["7/1001us"], algorithm = sliding_window))
                .starts_with("limit \"7/1001us\": a period of 1001 µs cannot be split")
        );
        assert!(
            single(quote!(
                limits = ["5/1m", "2/1h"],
                cost = 3,
                algorithm = fixed_window
            ))
            .starts_with("limit \"2/1h\": `cost = 3` exceeds the capacity of 2")
        );
        let all = messages(quote!(limits = ["5/1m", "2/1h"], cost = 3, burst = 2));
        assert_eq!(
            all,
            [
                "`cost = 3` exceeds the capacity of 2 (the `burst` of `gcra`), so every call would be refused; \
              lower `cost` or raise `burst`"
            ],
            "one message at `cost` for a `burst` shared by every limit"
        );
    }

    #[test]
    fn limits_exclude_period_and_threshold() {
        let all = messages(quote!(limits = ["5/1m"], period = 60, threshold = 5));
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all[0].starts_with("`period` cannot be combined with `limits`"));
        assert!(all[1].starts_with("`threshold` cannot be combined with `limits`"));
    }

    #[test]
    fn also_groups_are_checked_like_the_main_one_and_need_distinct_names() {
        let config = ok(
            quote!(
                limits = ["1/1m", "5/1h"],
                key = phone,
                name = "sms",
                also(
                    name = "sms_ip",
                    key = ip,
                    limits = ["20/1h"],
                    algorithm = fixed_window,
                    cost = 2
                ),
                also(name = "sms_all", period = 1, threshold = 100)
            ),
            quote!(async fn f() -> Result<(), E>),
        );
        assert!(!config.wraps_body());
        assert_eq!(config.groups.len(), 3);
        let ip = &config.groups[1];
        assert_eq!(ip.name.as_ref().unwrap().value(), "sms_ip");
        assert_eq!(ip.cost, 2);
        assert_eq!(ip.limits[0].algorithm, Algorithm::FixedWindow);
        assert_eq!(config.groups[0].limits[0].algorithm, Algorithm::Gcra);
        assert!(config.groups[2].key.is_none());

        assert!(
            single(quote!(
                period = 1,
                threshold = 1,
                also(key = ip, limits = ["1/s"])
            ))
            .starts_with("`also(...)` needs a `name`")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 1,
                name = "a",
                also(name = "a", limits = ["1/s"])
            ))
            .starts_with("the name \"a\" is already used by another group")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 1,
                also(name = "b", limits = ["1/s"]),
                also(name = "b", limits = ["2/s"])
            ))
            .starts_with("the name \"b\" is already used")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 1,
                also(name = "b", threshold = 5)
            ))
            .starts_with("in `also(...)`: missing `period`")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 1,
                also(name = "b", limits = ["5/1m"], cost = 6)
            ))
            .starts_with("limit \"5/1m\": `cost = 6` exceeds the capacity of 5")
        );
    }

    #[test]
    fn counting_needs_a_result_or_a_predicate_and_reset_needs_counting() {
        let config = ok(
            quote!(
                period = 1,
                threshold = 3,
                count = failures,
                reset_on_success
            ),
            quote!(async fn f(&self) -> Result<(), E>),
        );
        assert!(config.wraps_body() && !config.borrows_self);
        assert!(config.groups[0].reset_on_success);
        assert!(matches!(config.counting, Some(Counting::Failures(_))));

        assert!(
            single(quote!(period = 1, threshold = 3, reset_on_success))
                .starts_with("`reset_on_success` only applies when calls are counted selectively")
        );
        assert!(
            single(quote!(
                period = 1,
                threshold = 3,
                also(name = "ip", period = 1, threshold = 3, reset_on_success)
            ))
            .starts_with("`reset_on_success` only applies")
        );
        assert_eq!(
            single(quote!(
                period = 1,
                threshold = 3,
                count = failures,
                count_if = f
            )),
            "`count` and `count_if` both say which calls count; keep one"
        );
        let all = messages_for(
            quote!(period = 1, threshold = 3, count = failures, on_reject = f),
            quote!(async fn f() -> Response),
        );
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(all[0].starts_with("`count = failures` counts the calls that return `Err`"));
        ok(
            quote!(period = 1, threshold = 3, count_if = f, on_reject = f),
            quote!(async fn f() -> Response),
        );
    }

    #[test]
    fn count_failures_without_a_result_suggests_count_if_even_without_on_reject() {
        let all = messages_for(
            quote!(period = 1, threshold = 3, count = failures),
            quote!(async fn f() -> Response),
        );
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all[0].contains("must return `Result<T, E>`"), "{all:?}");
        assert!(all[1].contains("`count_if = |out: &T| ...`"), "{all:?}");
    }

    #[test]
    fn on_reject_lifts_the_result_requirement() {
        ok(
            quote!(period = 1, threshold = 3, on_reject = f),
            quote!(async fn f() -> Response),
        );
        ok(
            quote!(period = 1, threshold = 3, on_reject = f),
            quote!(async fn f()),
        );
        let all = messages_for(
            quote!(period = 1, threshold = 3),
            quote!(async fn f() -> Response),
        );
        assert!(
            all[0].contains("build the refused call's value with `on_reject"),
            "{all:?}"
        );
    }

    #[test]
    fn keeping_the_result_refuses_impl_trait_return_types() {
        for args in [
            quote!(period = 1, threshold = 3, count = failures),
            quote!(period = 1, threshold = 3, count_if = f),
            quote!(period = 1, threshold = 3, headers),
        ] {
            let all = messages_for(args, quote!(async fn f() -> Result<impl Display, E>));
            assert_eq!(all.len(), 1, "{all:?}");
            assert!(
                all[0].contains("a local cannot have an `impl Trait` type"),
                "{all:?}"
            );
        }
        ok(
            quote!(period = 1, threshold = 3, on_reject = f),
            quote!(async fn f() -> Result<impl Display, E>),
        );
    }

    #[test]
    fn the_body_borrows_self_only_for_mut_and_by_value_receivers() {
        let borrows = |sig: TokenStream| {
            ok(
                quote!(period = 1, threshold = 3, headers, on_reject = f),
                sig,
            )
            .borrows_self
        };
        assert!(!borrows(quote!(async fn f() -> R)));
        assert!(!borrows(quote!(async fn f(&self) -> R)));
        assert!(!borrows(quote!(async fn f(&'a self) -> R)));
        assert!(!borrows(quote!(async fn f(self: &Self) -> R)));
        assert!(borrows(quote!(async fn f(&mut self) -> R)));
        assert!(borrows(quote!(async fn f(mut self) -> R)));
        assert!(borrows(quote!(async fn f(self: Box<Self>) -> R)));
    }
}
