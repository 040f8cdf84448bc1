//! Generation only: turns a validated [`Config`] and the function into code.
//!
//! The function keeps its attributes, visibility and signature. Its body
//! asks the limiter through the public call API first: one `static`
//! [`CallSpec`](https://docs.rs/ratewall) (the groups, their limits, the
//! counting mode and the failure policy, all constant), one
//! `Limiter::call` (one round trip, all-or-nothing). For calls that every
//! admission counts, without `headers`, the body then follows unchanged:
//!
//! ```text
//! {
//!     #![inner attributes of the original body]
//!     {
//!         let __rl_limiter = <the global limiter, or Ok(&limiter)>;
//!         static __RL_SPEC: ::ratewall::__private::CallSpec =
//!             ::ratewall::__private::CallSpec::new(<name>, &[GroupSpec::new(<group>, &[<limits>]).with_cost(..), ..])
//!                 .with_policy(..);                                // `on_error`
//!         let __rl_call = ::ratewall::__private::admit(&__RL_SPEC, __rl_limiter, &[&(<key>), ..]);
//!         // The admission only (no permit kept), awaited only when it is
//!         // not decided already (a remote store):
//!         let __rl_decided = match __rl_call {
//!             Ok(__rl_decided) => __rl_decided,
//!             Err(__rl_later) => __rl_later.await,
//!         };
//!         match __rl_decided {
//!             Ok(()) => {}
//!             Err(__rl_rejection) => return <Err(From::from(..)) or (on_reject)(..)>,
//!         }
//!     }
//!     <the original statements, unchanged>
//! }
//! ```
//!
//! A tiered group (`tier` + `tiers(..)`) is `GroupSpec::tiered(<name>,
//! &__RL_LIMITS_i)`, where `__RL_LIMITS_i` holds its `Tier::new(<tier>,
//! &__RL_LIMITS_i_j)`s, and the call is `__private::call_tiered(.., &[keys],
//! &[tiers])` (in `__private::admitted(..)` when no permit is kept) with
//! each tiered group's `tier` expression, in the order of the groups, in
//! the forms keys take.
//!
//! The original statements stay in the function's own body rather than in
//! an `async move { .. }.await` block: `return` and `?` then mean exactly
//! what they meant, no argument is moved into a second future, and the
//! future is not nested. The check sits in a block of its own so
//! `__RL_SPEC` is not in scope for the user's code. `__rl_call` is a
//! statement of its own so the identities (`&dyn Display`, not `Send`) are
//! dropped before the first await: the future is `Send` whenever the
//! arguments are.
//!
//! With `count`, `count_if` or `headers` the body's result is needed as a
//! value, and the permit outlives the body:
//!
//! ```text
//! {
//!     #![inner attributes]
//!     let __rl_limiter = <limiter>;
//!     let __rl_permit = {
//!         static __RL_SPEC: .. = CallSpec::new(..).with_counting(Counting::Settled);
//!         let __rl_call = ::ratewall::__private::call(&__RL_SPEC, __rl_limiter, &[&(<key>), ..]);
//!         match __rl_call.await {
//!             Ok(__rl_permit) => __rl_permit,
//!             Err(__rl_rejection) => return <Err(From::from(..)) or (on_reject)(..)>,
//!         }
//!     };
//!     let mut __rl_out: <Output> = async move {
//!         #[allow(unreachable_code)]
//!         if false { let __rl_never: <Output> = loop {}; return __rl_never; }
//!         { <the original statements> }
//!     }
//!     .await;
//!     let __rl_counted: bool = <is_err(&__rl_out) or (count_if)(&__rl_out)>;
//!     ::ratewall::__private::Permit::add_headers(&__rl_permit, &mut __rl_out);   // `headers`
//!     ::ratewall::__private::Permit::settle(__rl_permit, __rl_counted).await;     // `count`
//!     __rl_out
//! }
//! ```
//!
//! With `cost = <expr>` in any group, the call is
//! `__private::call_costed(&__RL_SPEC, __rl_limiter, &[keys], &[tiers],
//! &[costs])`, each group's cost its expression (`__private::cost(<expr>)`,
//! any unsigned integer) or its number. With `settle` the groups it names
//! are `GroupSpec::settled()`, the body's result is kept as above, and
//! after it (and `headers`) each settled group's expression is applied to
//! `&__rl_out` through a generic `__rl_settle` (an unannotated closure gets
//! its argument type), 0 for the others:
//! `Permit::settle_costs(__rl_permit, &[..]).await`.
//!
//! In the block, `return` and `?` leave the block with the function's
//! result, as they left the function: the never-taken `return` of a value
//! of the output type fixes the block's output type before the body is
//! checked, so `?` conversions and coercions in early returns work as in
//! the function. The block is `async move` (arguments move in, so the
//! future is `Send` whenever they are), except for `&mut self` and `self`
//! methods, where a plain `async` block captures the fields of `self` the
//! body uses, leaving a limiter borrowed from another field usable. A
//! limiter built by the expression (`self.limiter.clone()`) is bound to
//! `__rl_limiter` so it lives as long as the permit borrowing it.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;

use crate::attr::{Function, OnError};
use crate::validate::{Config, Counting, GroupConfig, LimitConfig};

/// The function with the limiter check in front of its body.
pub(crate) fn expand(config: Config, function: Function) -> TokenStream {
    let Function {
        attrs,
        vis,
        sig,
        brace,
        inner_attrs,
        body,
    } = function;
    let private = match &config.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::ratewall::__private),
    };
    let default_name = {
        let function_name = sig.ident.unraw().to_string();
        quote!(#private::core::concat!(#private::core::module_path!(), "::", #function_name))
    };

    let mut block = TokenStream::new();
    brace.surround(&mut block, |block| {
        block.extend(quote!(#(#inner_attrs)*));
        block.extend(call(&config, &private, &default_name, brace, body));
    });

    quote! {
        #(#attrs)*
        #vis #sig #block
    }
}

/// `.with_policy(..)` for `on_error`, or nothing.
fn policy(config: &Config, private: &TokenStream) -> TokenStream {
    let policy = match config.on_error {
        None => return quote!(),
        Some(OnError::FailOpen) => quote!(#private::FailurePolicy::FailOpen),
        Some(OnError::FailClosed) => quote!(#private::FailurePolicy::FailClosed),
        Some(OnError::Local(share)) => {
            let share = Literal::u64_unsuffixed(share);
            quote!(#private::local(#share))
        }
    };
    quote!(.with_policy(#policy))
}

/// `Limit::from_parts_const(..)` for each limit of a list (with
/// `.with_lease_const(..)` when it leases, `.with_block_const(..)` when it
/// blocks).
fn limits(limits: &[LimitConfig], private: &TokenStream) -> Vec<TokenStream> {
    limits
        .iter()
        .map(|limit| {
            let algorithm = Ident::new(limit.algorithm.variant(), Span::call_site());
            let threshold = Literal::u64_unsuffixed(limit.threshold);
            let period_us = Literal::u64_unsuffixed(limit.period_us);
            let burst = Literal::u64_unsuffixed(limit.burst);
            let slots = Literal::u64_unsuffixed(limit.slots);
            let mut built = quote!(#private::Limit::from_parts_const(#threshold, #period_us, #private::Algorithm::#algorithm, #burst, #slots));
            if limit.lease > 0 {
                let lease = Literal::u64_unsuffixed(limit.lease);
                built = quote!(#built.with_lease_const(#lease));
            }
            if limit.block_us > 0 {
                let block = Literal::u64_unsuffixed(limit.block_us);
                built = quote!(#built.with_block_const(#block));
            }
            built
        })
        .collect()
}

/// A group's name: as given, or the function's default name.
fn group_name(group: &GroupConfig, default_name: &TokenStream) -> TokenStream {
    match &group.name {
        Some(name) => quote!(#name),
        None => default_name.clone(),
    }
}

/// The key as a `Part` (an integer or string form when its type has one,
/// else its `Display`), spanned on the user's expression; the empty
/// identity without a key.
fn key(group: &GroupConfig, private: &TokenStream) -> TokenStream {
    match &group.key {
        Some(key) => {
            let (expr, span) = (&key.value, key.span);
            quote_spanned!(span=> (&&#private::Probe(&(#expr))).__rl_part())
        }
        None => quote!(#private::Part::Text("")),
    }
}

/// What a refused call returns: `Err(From::from(rejection))`, or what
/// `on_reject` makes of it.
fn refused(config: &Config, private: &TokenStream) -> TokenStream {
    match &config.on_reject {
        Some(on_reject) => {
            let (expr, span) = (&on_reject.value, on_reject.span);
            // Through a generic function so an unannotated closure
            // (`|rejection| ...`) gets its argument type.
            let call = quote_spanned! {span=>
                __rl_on_reject(#expr, __rl_rejection)
            };
            quote! {{
                fn __rl_on_reject<__RlOut, __RlOnReject>(
                    on_reject: __RlOnReject,
                    rejection: #private::Rejection,
                ) -> __RlOut
                where
                    __RlOnReject: #private::core::ops::FnOnce(#private::Rejection) -> __RlOut,
                {
                    on_reject(rejection)
                }
                return #call;
            }}
        }
        None => {
            // A missing `From<Rejection>` is reported at the function's error type.
            let convert = quote_spanned! {config.error_type_span=>
                #private::core::convert::From::from(__rl_rejection)
            };
            quote! {{
                return #private::core::result::Result::Err(#convert);
            }}
        }
    }
}

/// The limiter check, then the body (as a value when counting or adding
/// headers).
fn call(
    config: &Config,
    private: &TokenStream,
    default_name: &TokenStream,
    brace: syn::token::Brace,
    body: TokenStream,
) -> TokenStream {
    let name = group_name(&config.groups[0], default_name);
    // One `static` per group's limits and one for the groups: a `static`'s
    // value may point to another `static`, not to temporaries.
    let limit_statics: Vec<Ident> = (0..config.groups.len())
        .map(|i| Ident::new(&format!("__RL_LIMITS_{i}"), Span::call_site()))
        .collect();
    let limit_arrays = config
        .groups
        .iter()
        .zip(&limit_statics)
        .map(|(group, ident)| match &group.tiers {
            None => {
                let limits = limits(&group.limits, private);
                let count = limits.len();
                quote!(static #ident: [#private::Limit; #count] = [#(#limits),*];)
            }
            // `__RL_LIMITS_i`: the group's tiers, each pointing to its limits.
            Some(tiers) => {
                let mut statics = TokenStream::new();
                let mut entries = Vec::with_capacity(tiers.len());
                for (j, tier) in tiers.iter().enumerate() {
                    let tier_ident = Ident::new(&format!("{ident}_{j}"), Span::call_site());
                    let limits = limits(&tier.limits, private);
                    let count = limits.len();
                    statics.extend(
                        quote!(static #tier_ident: [#private::Limit; #count] = [#(#limits),*];),
                    );
                    let name = &tier.name;
                    entries.push(quote!(#private::Tier::new(#name, &#tier_ident)));
                }
                let count = tiers.len();
                quote! {
                    #statics
                    static #ident: [#private::Tier; #count] = [#(#entries),*];
                }
            }
        });
    let groups = config
        .groups
        .iter()
        .zip(&limit_statics)
        .map(|(group, limits)| {
            let name = group_name(group, default_name);
            let cost = (group.cost != 1).then(|| {
                let cost = Literal::u64_unsuffixed(group.cost);
                quote!(.with_cost(#cost))
            });
            let reset = group.reset_on_success.then(|| quote!(.reset_on_success()));
            let settled = group.settle.as_ref().map(|_| quote!(.settled()));
            let constructor = match group.tiers {
                None => quote!(new),
                Some(_) => quote!(tiered),
            };
            quote! {
                #private::GroupSpec::#constructor(#name, &#limits)#cost #reset #settled
            }
        });
    let group_count = config.groups.len();
    let keys = config.groups.iter().map(|group| key(group, private));
    // Each tiered group's tier, in the order of the groups.
    let tiers: Vec<TokenStream> = config
        .groups
        .iter()
        .filter_map(|group| group.tier.as_ref())
        .map(|tier| {
            let (expr, span) = (&tier.value, tier.span);
            quote_spanned!(span=> (&&#private::Probe(&(#expr))).__rl_part())
        })
        .collect();
    // Without a permit to keep, only the admission is awaited: untiered
    // calls on the memory store drop the permit where it is made.
    let admits = !config.wraps_body();
    // Each group's cost when one is computed per call (`cost = <expr>`):
    // the expression's, or the group's number.
    let costs: Option<Vec<TokenStream>> =
        config
            .groups
            .iter()
            .any(|g| g.cost_expr.is_some())
            .then(|| {
                config
                    .groups
                    .iter()
                    .map(|group| match &group.cost_expr {
                        Some(cost) => {
                            let (expr, span) = (&cost.value, cost.span);
                            quote_spanned!(span=> #private::cost(#expr))
                        }
                        None => {
                            let cost = Literal::u64_unsuffixed(group.cost);
                            quote!(#cost)
                        }
                    })
                    .collect()
            });
    let call_fn = match (tiers.is_empty(), admits) {
        _ if costs.is_some() => {
            let costs = costs.as_deref().unwrap_or_default();
            let call = quote!(#private::call_costed(
                &__RL_SPEC, __rl_limiter, &[#(#keys),*], &[#(#tiers),*], &[#(#costs),*]
            ));
            if admits {
                quote!(#private::admitted(#call))
            } else {
                call
            }
        }
        (true, false) => quote!(#private::call(&__RL_SPEC, __rl_limiter, &[#(#keys),*])),
        (true, true) => quote!(#private::admit(&__RL_SPEC, __rl_limiter, &[#(#keys),*])),
        (false, false) => quote!(#private::call_tiered(
            &__RL_SPEC, __rl_limiter, &[#(#keys),*], &[#(#tiers),*]
        )),
        (false, true) => quote!(#private::admitted(#private::call_tiered(
            &__RL_SPEC, __rl_limiter, &[#(#keys),*], &[#(#tiers),*]
        ))),
    };
    // The user's expressions keep their spans, so type errors land on them.
    let limiter = match &config.limiter {
        Some(limiter) => {
            let (expr, span) = (&limiter.value, limiter.span);
            quote_spanned! {span=>
                let __rl_limiter = &(#expr);
                let __rl_limiter = #private::core::result::Result::Ok(#private::AsLimiter::as_limiter(__rl_limiter));
            }
        }
        None => quote!(let __rl_limiter = #private::global();),
    };
    let policy = policy(config, private);
    let counting = config
        .counting
        .as_ref()
        .map(|_| quote!(.with_counting(#private::Counting::Settled)));
    let wait = config.wait.map(|micros| {
        let micros = Literal::u64_unsuffixed(micros);
        quote!(.with_wait(#private::core::time::Duration::from_micros(#micros)))
    });
    let refused = refused(config, private);
    let check = quote! {
        #(#limit_arrays)*
        static __RL_GROUPS: [#private::GroupSpec; #group_count] = [#(#groups),*];
        static __RL_SPEC: #private::CallSpec =
            #private::CallSpec::new(#name, &__RL_GROUPS)#policy #counting #wait;
        #[allow(unused_imports)]
        use #private::{PartDisplay as _, PartFast as _};
        let __rl_call = #call_fn;
    };

    if !config.wraps_body() {
        return quote! {
            {
                #limiter
                #check
                let __rl_decided = match __rl_call {
                    #private::core::result::Result::Ok(__rl_decided) => __rl_decided,
                    #private::core::result::Result::Err(__rl_later) => __rl_later.await,
                };
                match __rl_decided {
                    #private::core::result::Result::Ok(()) => {}
                    #private::core::result::Result::Err(__rl_rejection) => #refused
                }
            }
            #body
        };
    }

    let output = &config.output;
    let mut statements = TokenStream::new();
    brace.surround(&mut statements, |statements| statements.extend(body));
    let capture = if config.borrows_self {
        quote!()
    } else {
        quote!(move)
    };
    let mutability = config.headers.map(|_| quote!(mut));
    let counted = match &config.counting {
        None => quote!(),
        Some(Counting::Failures(span)) => {
            let is_err = quote_spanned! {*span=>
                #private::core::result::Result::is_err(&__rl_out)
            };
            quote!(let __rl_counted: bool = #is_err;)
        }
        Some(Counting::If(count_if)) => {
            let (expr, span) = (&count_if.value, count_if.span);
            // Through a generic function so an unannotated closure
            // (`|out| ...`) gets its argument type.
            let call = quote_spanned! {span=>
                __rl_count_if(&__rl_out, #expr)
            };
            quote! {
                let __rl_counted: bool = {
                    fn __rl_count_if<__RlOut: ?Sized, __RlCountIf>(
                        out: &__RlOut,
                        count_if: __RlCountIf,
                    ) -> bool
                    where
                        __RlCountIf: #private::core::ops::FnOnce(&__RlOut) -> bool,
                    {
                        count_if(out)
                    }
                    #call
                };
            }
        }
    };
    let headers = config.headers.map(|span| {
        quote_spanned! {span=>
            #private::Permit::add_headers(&__rl_permit, &mut __rl_out);
        }
    });
    let settle = config.counting.as_ref().map(|_| {
        quote! {
            #private::Permit::settle(__rl_permit, __rl_counted).await;
        }
    });
    let settle_costs = config.settles().then(|| settle_costs(config, private));
    quote! {
        #limiter
        let __rl_permit = {
            #check
            match __rl_call.await {
                #private::core::result::Result::Ok(__rl_permit) => __rl_permit,
                #private::core::result::Result::Err(__rl_rejection) => #refused
            }
        };
        let #mutability __rl_out: #output = async #capture {
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value
            )]
            if false {
                let __rl_never: #output = loop {};
                return __rl_never;
            }
            #statements
        }
        .await;
        #counted
        #headers
        #settle
        #settle_costs
        __rl_out
    }
}

/// The settlement of each group's cost from the body's result (`settle`):
/// each settled group's expression applied to `&__rl_out` through a
/// generic function, so an unannotated closure (`|out| ...`) gets its
/// argument type; 0 for the others, which ignore theirs.
fn settle_costs(config: &Config, private: &TokenStream) -> TokenStream {
    let actuals = config.groups.iter().map(|group| match &group.settle {
        Some(settle) => {
            let (expr, span) = (&settle.value, settle.span);
            quote_spanned!(span=> __rl_settle(&__rl_out, #expr))
        }
        None => quote!(0),
    });
    quote! {
        {
            fn __rl_settle<__RlOut: ?Sized, __RlSettle, __RlCost>(
                out: &__RlOut,
                settle: __RlSettle,
            ) -> #private::core::primitive::u64
            where
                __RlSettle: #private::core::ops::FnOnce(&__RlOut) -> __RlCost,
                __RlCost: #private::Cost,
            {
                #private::cost(settle(out))
            }
            let __rl_actuals = [#(#actuals),*];
            #private::Permit::settle_costs(__rl_permit, &__rl_actuals).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    fn expand(args: TokenStream, function: TokenStream) -> String {
        let config = crate::validate::validate(
            syn::parse2(args).unwrap(),
            &syn::parse2::<crate::attr::Function>(function.clone())
                .unwrap()
                .sig,
        )
        .unwrap();
        super::expand(config, syn::parse2(function).unwrap()).to_string()
    }

    #[test]
    fn the_check_precedes_the_unchanged_body_with_every_value_const() {
        let code = expand(
            quote!(
                period = "1m",
                threshold = 5,
                key = user.id,
                algorithm = token_bucket,
                burst = 8,
                cost = 2
            ),
            quote! {
                #[doc = "docs"]
                pub async fn f(user: User) -> Result<u8, E> { #![allow(unused)] let x = 1; Ok(x) }
            },
        );
        let expected = quote! {
            #[doc = "docs"]
            pub async fn f(user: User) -> Result<u8, E> {
                #![allow(unused)]
                {
                    let __rl_limiter = ::ratewall::__private::global();
                    static __RL_LIMITS_0: [::ratewall::__private::Limit; 1usize] = [
                        ::ratewall::__private::Limit::from_parts_const(5, 60000000, ::ratewall::__private::Algorithm::TokenBucket, 8, 10)
                    ];
                    static __RL_GROUPS: [::ratewall::__private::GroupSpec; 1usize] = [
                        ::ratewall::__private::GroupSpec::new(
                            ::ratewall::__private::core::concat!(::ratewall::__private::core::module_path!(), "::", "f"),
                            &__RL_LIMITS_0
                        ).with_cost(2)
                    ];
                    static __RL_SPEC: ::ratewall::__private::CallSpec = ::ratewall::__private::CallSpec::new(
                        ::ratewall::__private::core::concat!(::ratewall::__private::core::module_path!(), "::", "f"),
                        &__RL_GROUPS
                    );
                    #[allow(unused_imports)]
                    use ::ratewall::__private::{PartDisplay as _, PartFast as _};
                    let __rl_call = ::ratewall::__private::admit(
                        &__RL_SPEC,
                        __rl_limiter,
                        &[(&&::ratewall::__private::Probe(&(user.id))).__rl_part()]
                    );
                    let __rl_decided = match __rl_call {
                        ::ratewall::__private::core::result::Result::Ok(__rl_decided) => __rl_decided,
                        ::ratewall::__private::core::result::Result::Err(__rl_later) => __rl_later.await,
                    };
                    match __rl_decided {
                        ::ratewall::__private::core::result::Result::Ok(()) => {}
                        ::ratewall::__private::core::result::Result::Err(__rl_rejection) => {
                            return ::ratewall::__private::core::result::Result::Err(
                                ::ratewall::__private::core::convert::From::from(__rl_rejection)
                            );
                        }
                    }
                }
                let x = 1;
                Ok(x)
            }
        };
        assert_eq!(code, expected.to_string());
    }

    #[test]
    fn name_limiter_policy_and_crate_replace_the_defaults() {
        let code = expand(
            quote!(
                period = 1,
                threshold = 1,
                name = "sms",
                limiter = self.limiter,
                on_error = fail_closed,
                crate = "my::rl"
            ),
            quote!(
                async fn r#f(&self) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(code.contains(r#"CallSpec :: new ("sms" ,"#), "{code}");
        assert!(
            code.contains(
                "let __rl_limiter = & (self . limiter) ; let __rl_limiter = my :: rl :: __private :: core :: result \
                 :: Result :: Ok (my :: rl :: __private :: AsLimiter :: as_limiter (__rl_limiter))"
            ),
            "{code}"
        );
        assert!(
            code.contains(". with_policy (my :: rl :: __private :: FailurePolicy :: FailClosed)"),
            "{code}"
        );
        assert!(
            code.contains("& [my :: rl :: __private :: Part :: Text (\"\")])"),
            "no key: the empty identity; {code}"
        );
        assert!(!code.contains("ratewall"), "{code}");
    }

    #[test]
    fn wait_sets_the_specs_longest_wait_and_nothing_else() {
        let function = quote!(
            async fn f(id: u64) -> Result<(), E> {
                Ok(())
            }
        );
        let waiting = expand(
            quote!(period = 1, threshold = 5, key = id, wait = "2s"),
            function.clone(),
        );
        let plain = expand(quote!(period = 1, threshold = 5, key = id), function);
        let setting = ". with_wait (:: ratewall :: __private :: core :: time :: Duration :: from_micros (2000000))";
        assert!(
            waiting.contains(&format!("& __RL_GROUPS) {setting} ;")),
            "{waiting}"
        );
        assert_eq!(waiting.replace(&format!(" {setting}"), ""), plain);
    }

    #[test]
    fn tiered_groups_point_to_their_tiers_and_the_call_passes_each_tier() {
        let code = expand(
            quote!(
                name = "api",
                key = user,
                tier = plan,
                tiers(free = ["1/1m"], "pro-2" = ["5/1m", "20/1s"]),
                also(name = "ip", key = ip, limits = ["9/1h"])
            ),
            quote!(
                async fn f(user: u64, plan: &str, ip: &str) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        for part in [
            "static __RL_LIMITS_0_0 : [:: ratewall :: __private :: Limit ; 1usize]",
            "static __RL_LIMITS_0_1 : [:: ratewall :: __private :: Limit ; 2usize]",
            "static __RL_LIMITS_0 : [:: ratewall :: __private :: Tier ; 2usize] = [:: ratewall :: __private :: Tier \
             :: new (\"free\" , & __RL_LIMITS_0_0) , :: ratewall :: __private :: Tier :: new (\"pro-2\" , & \
             __RL_LIMITS_0_1)] ;",
            ":: ratewall :: __private :: GroupSpec :: tiered (\"api\" , & __RL_LIMITS_0)",
            ":: ratewall :: __private :: GroupSpec :: new (\"ip\" , & __RL_LIMITS_1)",
            ":: ratewall :: __private :: call_tiered (& __RL_SPEC , __rl_limiter , & [(&& :: ratewall :: __private :: \
             Probe (& (user))) . __rl_part () , (&& :: ratewall :: __private :: Probe (& (ip))) . __rl_part ()] , & \
             [(&& :: ratewall :: __private :: Probe (& (plan))) . __rl_part ()])",
        ] {
            assert!(code.contains(part), "{part}\nin\n{code}");
        }
    }

    #[test]
    fn the_default_name_uses_the_unraw_function_name() {
        let code = expand(
            quote!(period = 1, threshold = 1),
            quote!(
                async fn r#match() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(code.contains(r#""::" , "match""#), "{code}");
    }

    #[test]
    fn a_leasing_limit_is_built_with_its_lease() {
        let code = expand(
            quote!(period = 60, threshold = 1000, key = tenant, lease = 50),
            quote!(
                async fn f(tenant: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            code.contains(
                ":: ratewall :: __private :: Limit :: from_parts_const (1000 , 60000000 , :: ratewall :: __private :: \
                 Algorithm :: Gcra , 1000 , 10) . with_lease_const (50)"
            ),
            "{code}"
        );
    }

    #[test]
    fn a_blocking_limit_is_built_with_its_block() {
        let code = expand(
            quote!(period = 60, threshold = 5, key = user, block_for = "15m"),
            quote!(
                async fn f(user: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            code.contains(
                ":: ratewall :: __private :: Limit :: from_parts_const (5 , 60000000 , :: ratewall :: __private :: \
                 Algorithm :: Gcra , 5 , 10) . with_block_const (900000000)"
            ),
            "{code}"
        );
    }

    #[test]
    fn several_limits_on_one_key_are_one_group_before_the_unchanged_body() {
        let code = expand(
            quote!(
                limits = ["1/1m", "5/1h"],
                key = phone,
                algorithm = sliding_log
            ),
            quote!(
                async fn f(phone: &str) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            code.contains(
                "static __RL_LIMITS_0 : [:: ratewall :: __private :: Limit ; 2usize] = [:: ratewall :: __private :: \
                 Limit :: from_parts_const (1 , 60000000 , :: ratewall :: __private :: Algorithm :: SlidingLog , 1 , \
                 10) , :: ratewall :: __private :: Limit :: from_parts_const (5 , 3600000000 , :: ratewall :: \
                 __private :: Algorithm :: SlidingLog , 5 , 10)] ;"
            ),
            "one group with both limits: {code}"
        );
        assert!(
            code.contains("[:: ratewall :: __private :: GroupSpec ; 1usize]"),
            "{code}"
        );
        assert!(
            code.ends_with("} Ok (()) }"),
            "the body follows unchanged: {code}"
        );
    }

    #[test]
    fn also_and_on_reject_check_every_group_in_one_call_before_the_unchanged_body() {
        let code = expand(
            quote!(
                name = "sms",
                key = phone,
                period = 60,
                threshold = 1,
                also(name = "sms_ip", key = ip, limits = ["20/1h"], cost = 2),
                limiter = self.limiter.clone(),
                on_reject = reject
            ),
            quote! {
                async fn f(&self, ip: Ip, phone: &str) -> Reply { let x = 1; x }
            },
        );
        let expected = quote! {
            async fn f(&self, ip: Ip, phone: &str) -> Reply {
                {
                    let __rl_limiter = &(self.limiter.clone());
                    let __rl_limiter = ::ratewall::__private::core::result::Result::Ok(
                        ::ratewall::__private::AsLimiter::as_limiter(__rl_limiter)
                    );
                    static __RL_LIMITS_0: [::ratewall::__private::Limit; 1usize] = [
                        ::ratewall::__private::Limit::from_parts_const(1, 60000000, ::ratewall::__private::Algorithm::Gcra, 1, 10)
                    ];
                    static __RL_LIMITS_1: [::ratewall::__private::Limit; 1usize] = [
                        ::ratewall::__private::Limit::from_parts_const(20, 3600000000, ::ratewall::__private::Algorithm::Gcra, 20, 10)
                    ];
                    static __RL_GROUPS: [::ratewall::__private::GroupSpec; 2usize] = [
                        ::ratewall::__private::GroupSpec::new("sms", &__RL_LIMITS_0),
                        ::ratewall::__private::GroupSpec::new("sms_ip", &__RL_LIMITS_1).with_cost(2)
                    ];
                    static __RL_SPEC: ::ratewall::__private::CallSpec =
                        ::ratewall::__private::CallSpec::new("sms", &__RL_GROUPS);
                    #[allow(unused_imports)]
                    use ::ratewall::__private::{PartDisplay as _, PartFast as _};
                    let __rl_call = ::ratewall::__private::admit(
                        &__RL_SPEC,
                        __rl_limiter,
                        &[
                            (&&::ratewall::__private::Probe(&(phone))).__rl_part(),
                            (&&::ratewall::__private::Probe(&(ip))).__rl_part()
                        ]
                    );
                    let __rl_decided = match __rl_call {
                        ::ratewall::__private::core::result::Result::Ok(__rl_decided) => __rl_decided,
                        ::ratewall::__private::core::result::Result::Err(__rl_later) => __rl_later.await,
                    };
                    match __rl_decided {
                        ::ratewall::__private::core::result::Result::Ok(()) => {}
                        ::ratewall::__private::core::result::Result::Err(__rl_rejection) => {
                            fn __rl_on_reject<__RlOut, __RlOnReject>(
                                on_reject: __RlOnReject,
                                rejection: ::ratewall::__private::Rejection,
                            ) -> __RlOut
                            where
                                __RlOnReject: ::ratewall::__private::core::ops::FnOnce(::ratewall::__private::Rejection) -> __RlOut,
                            {
                                on_reject(rejection)
                            }
                            return __rl_on_reject(reject, __rl_rejection);
                        }
                    }
                }
                let x = 1;
                x
            }
        };
        assert_eq!(code, expected.to_string());
    }

    #[test]
    fn counting_and_headers_settle_the_permit_after_the_body_returns_a_value() {
        let code = expand(
            quote!(
                period = 60,
                threshold = 3,
                count = failures,
                reset_on_success,
                headers
            ),
            quote! {
                async fn f(id: u8) -> Result<u8, E> { let x = id; Ok(x) }
            },
        );
        let expected_tail = quote! {
            let mut __rl_out: Result<u8, E> = async move {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value
                )]
                if false {
                    let __rl_never: Result<u8, E> = loop {};
                    return __rl_never;
                }
                { let x = id; Ok(x) }
            }
            .await;
            let __rl_counted: bool = ::ratewall::__private::core::result::Result::is_err(&__rl_out);
            ::ratewall::__private::Permit::add_headers(&__rl_permit, &mut __rl_out);
            ::ratewall::__private::Permit::settle(__rl_permit, __rl_counted).await;
            __rl_out
        };
        assert!(code.ends_with(&format!("{expected_tail} }}")), "{code}");
        assert!(
            code.contains("& __RL_LIMITS_0) . reset_on_success ()] ;"),
            "{code}"
        );
        assert!(
            code.contains(". with_counting (:: ratewall :: __private :: Counting :: Settled) ;"),
            "{code}"
        );
        assert!(
            code.contains(
                "let __rl_limiter = :: ratewall :: __private :: global () ; let __rl_permit = { static __RL_LIMITS_0"
            ),
            "{code}"
        );
        assert!(code.contains("Ok (__rl_permit) => __rl_permit"), "{code}");
    }

    #[test]
    fn mut_self_methods_borrow_into_the_body_block_instead_of_moving() {
        let function = |receiver: TokenStream| {
            quote! {
                async fn f(#receiver) -> Result<u8, E> { Ok(1) }
            }
        };
        let args = || quote!(period = 60, threshold = 3, count_if = |r| r.is_err());
        assert!(expand(args(), function(quote!(&self))).contains("async move {"));
        assert!(expand(args(), function(quote!())).contains("async move {"));
        let code = expand(args(), function(quote!(&mut self)));
        assert!(!code.contains("async move"), "{code}");
        assert!(code.contains("= async {"), "{code}");
        assert!(
            code.contains("__rl_count_if (& __rl_out , | r | r . is_err ())"),
            "{code}"
        );
    }
}
