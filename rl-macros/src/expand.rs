//! Generation only: turns a validated [`Config`] and the function into code.
//!
//! The function keeps its attributes, visibility and signature. Its body
//! becomes
//!
//! ```text
//! {
//!     #![inner attributes of the original body]
//!     {
//!         static __RL_SPEC: ::rl_core::__private::Spec = ::rl_core::__private::Spec { .. };
//!         match ::rl_core::__private::check(&__RL_SPEC, <limiter>, &(<key>)).await {
//!             Ok(_) => {}
//!             Err(__rl_rejection) => return Err(From::from(__rl_rejection)),
//!         }
//!     }
//!     <the original statements, unchanged>
//! }
//! ```
//!
//! The original statements stay in the function's own body rather than in
//! an `async move { .. }.await` block: `return` and `?` then mean exactly
//! what they meant (an async block's output type is not inferred from the
//! function's, so `?` in it fails with "type annotations needed"), no
//! argument is moved into a second future, and the future is not nested.
//! The check sits in a block of its own so `__RL_SPEC` is not in scope for
//! the user's code.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;

use crate::attr::{Function, OnError};
use crate::validate::Config;

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
        None => quote!(::rl_core::__private),
    };

    let name = match &config.name {
        Some(name) => quote!(#name),
        None => {
            let function_name = sig.ident.unraw().to_string();
            quote!(#private::core::concat!(#private::core::module_path!(), "::", #function_name))
        }
    };
    let algorithm = Ident::new(config.algorithm.variant(), Span::call_site());
    let threshold = Literal::u64_unsuffixed(config.threshold);
    let period_us = Literal::u64_unsuffixed(config.period_us);
    let burst = Literal::u64_unsuffixed(config.burst);
    let slots = Literal::u64_unsuffixed(config.slots);
    let cost = Literal::u64_unsuffixed(config.cost);
    let policy = match config.on_error {
        None => quote!(#private::core::option::Option::None),
        Some(OnError::FailOpen) => {
            quote!(#private::core::option::Option::Some(#private::FailurePolicy::FailOpen))
        }
        Some(OnError::FailClosed) => {
            quote!(#private::core::option::Option::Some(#private::FailurePolicy::FailClosed))
        }
    };

    // The user's expressions keep their spans, so type errors land on them.
    let limiter = match &config.limiter {
        Some(limiter) => {
            let (expr, span) = (&limiter.value, limiter.span);
            quote_spanned!(span=> #private::core::result::Result::Ok(#private::AsLimiter::as_limiter(&(#expr))))
        }
        None => quote!(#private::global()),
    };
    let key = match &config.key {
        Some(key) => {
            let (expr, span) = (&key.value, key.span);
            quote_spanned!(span=> &(#expr))
        }
        None => quote!(&""),
    };
    // A missing `From<Rejection>` is reported at the function's error type.
    let convert = quote_spanned! {config.error_type_span=>
        #private::core::convert::From::from(__rl_rejection)
    };

    let mut block = TokenStream::new();
    brace.surround(&mut block, |block| {
        block.extend(quote! {
            #(#inner_attrs)*
            {
                static __RL_SPEC: #private::Spec = #private::Spec {
                    name: #name,
                    limits: &[#private::limit(#threshold, #period_us, #private::Algorithm::#algorithm, #burst, #slots)],
                    cost: #cost,
                    policy: #policy,
                };
                match #private::check(&__RL_SPEC, #limiter, #key).await {
                    #private::core::result::Result::Ok(_) => {}
                    #private::core::result::Result::Err(__rl_rejection) => {
                        return #private::core::result::Result::Err(#convert);
                    }
                }
            }
        });
        block.extend(body);
    });

    quote! {
        #(#attrs)*
        #vis #sig #block
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
                    static __RL_SPEC: ::rl_core::__private::Spec = ::rl_core::__private::Spec {
                        name: ::rl_core::__private::core::concat!(::rl_core::__private::core::module_path!(), "::", "f"),
                        limits: &[::rl_core::__private::limit(5, 60000000, ::rl_core::__private::Algorithm::TokenBucket, 8, 10)],
                        cost: 2,
                        policy: ::rl_core::__private::core::option::Option::None,
                    };
                    match ::rl_core::__private::check(&__RL_SPEC, ::rl_core::__private::global(), &(user.id)).await {
                        ::rl_core::__private::core::result::Result::Ok(_) => {}
                        ::rl_core::__private::core::result::Result::Err(__rl_rejection) => {
                            return ::rl_core::__private::core::result::Result::Err(
                                ::rl_core::__private::core::convert::From::from(__rl_rejection)
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
        assert!(code.contains(r#"name : "sms""#), "{code}");
        assert!(
            code.contains("my :: rl :: __private :: AsLimiter :: as_limiter (& (self . limiter))"),
            "{code}"
        );
        assert!(
            code.contains("Some (my :: rl :: __private :: FailurePolicy :: FailClosed)"),
            "{code}"
        );
        assert!(
            code.contains("& \"\")"),
            "no key: the empty identity; {code}"
        );
        assert!(!code.contains("rl_core"), "{code}");
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
}
