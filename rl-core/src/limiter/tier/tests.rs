//! Tiers on the memory store: choosing, state per tier, runtime tiers,
//! unknown tiers, inheritance from the group's name, names in rejections
//! and metrics.

use std::collections::HashMap;

use crate::testing::NowOrNever;

use crate::{
    Algorithm, CallSpec, FailurePolicy, GroupSpec, Limit, Limiter, RejectionReason,
    call::{Admission, Counting, Tier},
    error::LimitError,
};

fn limit(text: &str) -> Limit {
    text.parse().unwrap()
}

/// `api`: free 2/1m, pro 5/1m (and 20/1s), decided with `policy`.
fn api(policy: FailurePolicy) -> CallSpec {
    CallSpec::owned(
        "api",
        vec![GroupSpec::owned_tiered(
            "api",
            vec![
                Tier::owned("free", vec![limit("2/1m")]),
                Tier::owned("pro", vec![limit("5/1m"), limit("20/1s")]),
            ],
        )],
    )
    .with_policy(policy)
}

fn limiter() -> Limiter {
    Limiter::builder().memory().prefix("t").build().unwrap()
}

/// How many of `n` calls of `who` in `tier` are admitted.
fn admitted(limiter: &Limiter, spec: &CallSpec, who: &str, tier: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            limiter
                .call_with(spec, crate::Keys::new(&[&who]).tiers(&[tier]))
                .now()
                .unwrap()
                .is_ok()
        })
        .count()
}

#[test]
fn switching_an_identitys_tier_takes_effect_on_its_next_call() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    assert_eq!(admitted(&limiter, &spec, "alice", "free", 3), 2);
    // Upgraded between two calls: the very next one is decided by `pro`.
    assert_eq!(admitted(&limiter, &spec, "alice", "pro", 1), 1);
    assert_eq!(admitted(&limiter, &spec, "alice", "pro", 10), 4);
    // Downgraded: `free` again, whose state is still exhausted.
    let refused = limiter
        .call_with(&spec, crate::Keys::new(&[&"alice"]).tiers(&["free"]))
        .now()
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.name(), "api@free");
}

#[test]
fn each_tier_keeps_its_own_state() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    // Exhausting free leaves pro whole...
    assert_eq!(admitted(&limiter, &spec, "bob", "free", 5), 2);
    assert_eq!(admitted(&limiter, &spec, "bob", "pro", 10), 5);
    // ...and exhausting pro took nothing from free (a fresh identity shows it).
    assert_eq!(admitted(&limiter, &spec, "carol", "pro", 10), 5);
    assert_eq!(admitted(&limiter, &spec, "carol", "free", 5), 2);
    // The states are the tiers' own keys.
    let pro = [limit("5/1m")];
    let peeked = limiter
        .requests()
        .peek_identity("api@pro", &"carol", &pro)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert_eq!(peeked.binding().remaining(), 0);
    let untouched = limiter
        .requests()
        .peek_identity("api@pro", &"dave", &pro)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert_eq!(untouched.binding().remaining(), 5);
}

#[test]
fn a_tier_configured_at_run_time_applies_on_the_next_call() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    // Not declared: unknown until configured.
    assert!(admitted(&limiter, &spec, "erin", "gold", 1) == 0);
    limiter
        .settings()
        .set_limits("api@gold", vec![limit("3/1m")])
        .unwrap();
    assert_eq!(admitted(&limiter, &spec, "erin", "gold", 5), 3);
    // A declared tier changed at run time: the next call uses the new limit
    // (a threshold change applies to the existing state).
    assert_eq!(admitted(&limiter, &spec, "erin", "free", 5), 2);
    let window = |t| Limit::per_minute(t).and_then(|l| l.with_algorithm(Algorithm::FixedWindow));
    limiter
        .settings()
        .set_limits("api@free", vec![window(2).unwrap()])
        .unwrap();
    assert_eq!(admitted(&limiter, &spec, "erin", "free", 5), 2);
    limiter
        .settings()
        .set_limits("api@free", vec![window(4).unwrap()])
        .unwrap();
    assert_eq!(admitted(&limiter, &spec, "erin", "free", 5), 2);
    // Cleared: gold is unknown again, free back to its declared limits.
    limiter.settings().clear_limits("api@gold");
    assert_eq!(admitted(&limiter, &spec, "erin", "gold", 1), 0);
}

#[test]
fn an_unknown_tier_is_decided_by_the_default_tier_when_there_is_one() {
    let limiter = limiter();
    let spec = CallSpec::owned(
        "api",
        vec![GroupSpec::owned_tiered(
            "api",
            vec![
                Tier::owned("pro", vec![limit("5/1m")]),
                Tier::owned("default", vec![limit("1/1m")]),
            ],
        )],
    );
    assert_eq!(admitted(&limiter, &spec, "frank", "platinum", 3), 1);
    // Another unknown tier, and no tier at all: the same default state.
    assert_eq!(admitted(&limiter, &spec, "frank", "", 1), 0);
    let plain = limiter.call(&spec, &[&"frank"]).now().unwrap().unwrap_err();
    assert_eq!(plain.name(), "api@default");
    assert_eq!(admitted(&limiter, &spec, "frank", "pro", 1), 1);
}

#[test]
fn an_unknown_tier_without_a_default_is_answered_by_the_failure_policy() {
    let limiter = limiter();
    // Fail open: admitted, without a decision.
    let open = api(FailurePolicy::FailOpen);
    let permit = limiter
        .call_with(&open, crate::Keys::new(&[&"gina"]).tiers(&["gold"]))
        .now()
        .unwrap()
        .unwrap();
    assert_eq!(permit.admission(), &Admission::FailedOpen);
    assert!(permit.binding().is_none());
    // Fail closed and local(N): refused as unavailable, naming the tier.
    for policy in [FailurePolicy::FailClosed, FailurePolicy::local(2).unwrap()] {
        let refused = limiter
            .call_with(&api(policy), crate::Keys::new(&[&"gina"]).tiers(&["gold"]))
            .now()
            .unwrap()
            .unwrap_err();
        assert!(refused.is_unavailable(), "{policy:?}");
        assert_eq!(refused.name(), "api");
        match refused.reason() {
            RejectionReason::Unavailable(crate::model::error::Error::Limit(
                LimitError::UnknownTier { group, tier },
            )) => assert_eq!((group.as_str(), tier.as_str()), ("api", "gold")),
            other => panic!("{other:?}"),
        }
    }
    // A tier too long to be one is cut in the error, never a panic.
    let long = "é".repeat(100);
    let refused = limiter
        .call_with(
            &api(FailurePolicy::FailClosed),
            crate::Keys::new(&[&"gina"]).tiers(&[&long]),
        )
        .now()
        .unwrap()
        .unwrap_err();
    let RejectionReason::Unavailable(crate::model::error::Error::Limit(LimitError::UnknownTier {
        tier,
        ..
    })) = refused.reason()
    else {
        panic!("{refused:?}");
    };
    assert!(tier.len() <= 64 && tier.ends_with('…'), "{tier}");
}

#[test]
fn hostile_tiers_reach_no_other_scope() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    for hostile in ["pro:x", "pro}", "{pro}", "pro@free", "PRO", " pro", "pro\0"] {
        assert_eq!(
            admitted(&limiter, &spec, "hal", hostile, 1),
            0,
            "{hostile:?}"
        );
    }
    assert_eq!(admitted(&limiter, &spec, "hal", "pro", 10), 5);
}

#[test]
fn a_call_with_the_wrong_number_of_tiers_is_refused_as_misconfigured() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailOpen);
    for tiers in [&[][..], &["free", "pro"][..]] {
        let refused = limiter
            .call_with(&spec, crate::Keys::new(&[&"ivan"]).tiers(tiers))
            .now()
            .unwrap()
            .unwrap_err();
        assert!(
            refused.to_string().contains("1 of them tiered"),
            "{refused}"
        );
    }
}

#[test]
fn tiered_and_plain_groups_are_decided_together_all_or_nothing() {
    let limiter = limiter();
    let spec = CallSpec::owned(
        "send",
        vec![
            GroupSpec::owned("send_ip", vec![limit("3/1m")]),
            GroupSpec::owned_tiered(
                "send_user",
                vec![
                    Tier::owned("free", vec![limit("1/1m")]),
                    Tier::owned("pro", vec![limit("10/1m")]),
                ],
            ),
        ],
    );
    let call = |user: &str, tier: &str| {
        limiter
            .call_with(
                &spec,
                crate::Keys::new(&[&"10.0.0.1", &user]).tiers(&[tier]),
            )
            .now()
            .unwrap()
    };
    assert!(call("judy", "free").is_ok());
    // Refused by free: the IP limit keeps its units (2 left).
    assert_eq!(call("judy", "free").unwrap_err().name(), "send_user@free");
    assert!(call("judy", "pro").is_ok());
    assert!(call("judy", "pro").is_ok());
    assert_eq!(call("judy", "pro").unwrap_err().name(), "send_ip");
}

#[test]
fn the_binding_limit_of_a_tiered_call_is_its_tiers() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    let permit = limiter
        .call_with(&spec, crate::Keys::new(&[&"kim"]).tiers(&["pro"]))
        .now()
        .unwrap()
        .unwrap();
    let (name, decision, limit) = permit.binding().unwrap();
    assert_eq!(name, "api@pro");
    assert_eq!(limit.threshold(), 5);
    assert_eq!(decision.remaining(), 4);
}

#[test]
fn a_settled_tiered_call_gives_back_to_its_tiers_state() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed).with_counting(Counting::Settled);
    for _ in 0..5 {
        let permit = limiter
            .call_with(&spec, crate::Keys::new(&[&"leo"]).tiers(&["free"]))
            .now()
            .unwrap()
            .unwrap();
        permit.settle(false).now_or_never().unwrap();
    }
    assert_eq!(admitted(&limiter, &spec, "leo", "free", 3), 2);
}

#[test]
fn a_tiers_name_inherits_its_groups_lists_and_shadow_mode() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    limiter
        .settings()
        .deny(Some("api"), &"mia", None)
        .now_or_never()
        .unwrap()
        .unwrap();
    let denied = limiter
        .call_with(&spec, crate::Keys::new(&[&"mia"]).tiers(&["pro"]))
        .now()
        .unwrap()
        .unwrap_err();
    assert!(denied.is_denied());
    assert_eq!(denied.name(), "api@pro");
    // An allow entry of one tier bypasses that tier only.
    limiter
        .settings()
        .allow(Some("api@free"), &"ned", None)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert_eq!(admitted(&limiter, &spec, "ned", "free", 10), 10);
    assert_eq!(admitted(&limiter, &spec, "ned", "pro", 10), 5);
    // Shadow mode of the group: every tier decides, none refuses.
    limiter.settings().set_shadow("api", true);
    assert_eq!(admitted(&limiter, &spec, "ned", "pro", 3), 3);
    let permit = limiter
        .call_with(&spec, crate::Keys::new(&[&"ned"]).tiers(&["pro"]))
        .now()
        .unwrap()
        .unwrap();
    assert!(matches!(permit.admission(), Admission::Shadowed(_)));
}

#[test]
fn invalid_tiers_are_refused_up_front() {
    let check = |group: &str, tiers: Vec<Tier>| {
        CallSpec::owned("c", vec![GroupSpec::owned_tiered(group, tiers)])
            .check()
            .unwrap_err()
            .to_string()
    };
    let one = || vec![limit("1/1m")];
    assert!(check("api", vec![Tier::owned("pro plan", one())]).contains("is not a tier name"));
    assert!(check("api", vec![Tier::owned("", one())]).contains("is not a tier name"));
    assert!(
        check(
            "api",
            vec![Tier::owned("pro", one()), Tier::owned("pro", one())]
        )
        .contains("declares tier `pro` twice")
    );
    assert!(
        check("api@x", vec![Tier::owned("pro", one())])
            .contains("must not be empty nor contain `@`")
    );
    assert!(check("api", vec![Tier::owned("pro", vec![])]).contains("`api@pro` has no limit"));
    let costly = CallSpec::owned(
        "c",
        vec![GroupSpec::owned_tiered("api", vec![Tier::owned("pro", one())]).with_cost(2)],
    );
    assert!(costly.check().is_err());
    // No declared tier: every tier comes from the runtime limits.
    let empty = CallSpec::owned("c", vec![GroupSpec::owned_tiered("api", vec![])])
        .with_policy(FailurePolicy::FailClosed);
    assert!(empty.check().is_ok());
    let limiter = limiter();
    assert!(
        limiter
            .call_with(&empty, crate::Keys::new(&[&1]).tiers(&["x"]))
            .now()
            .unwrap()
            .is_err()
    );
    limiter.settings().set_limits("api@x", one()).unwrap();
    assert!(
        limiter
            .call_with(&empty, crate::Keys::new(&[&1]).tiers(&["x"]))
            .now()
            .unwrap()
            .is_ok()
    );
}

#[test]
fn runtime_limits_that_break_one_tier_refuse_that_tier_only() {
    let limiter = limiter();
    let spec = CallSpec::owned(
        "api",
        vec![
            GroupSpec::owned_tiered(
                "api",
                vec![
                    Tier::owned("free", vec![limit("2/1m")]),
                    Tier::owned("pro", vec![limit("5/1m")]),
                ],
            )
            .with_cost(2),
        ],
    )
    .with_policy(FailurePolicy::FailOpen);
    limiter
        .settings()
        .set_limits("api@free", vec![limit("1/1m")])
        .unwrap();
    let refused = limiter
        .call_with(&spec, crate::Keys::new(&[&"oz"]).tiers(&["free"]))
        .now()
        .unwrap()
        .unwrap_err();
    assert!(refused.is_unavailable());
    assert!(
        limiter
            .call_with(&spec, crate::Keys::new(&[&"oz"]).tiers(&["pro"]))
            .now()
            .unwrap()
            .is_ok()
    );
}

#[test]
fn the_limit_label_is_the_call_with_its_tier() {
    let limiter = limiter();
    let spec = api(FailurePolicy::FailClosed);
    let labels = crate::testing::Counters::default();
    metrics::with_local_recorder(&labels, || {
        admitted(&limiter, &spec, "pat", "free", 3);
        admitted(&limiter, &spec, "pat", "pro", 1);
        admitted(&limiter, &spec, "pat", "gold", 1);
    });
    let seen = labels.by("ratewall_decisions_total", &["limit", "outcome"]);
    let expected: HashMap<String, u64> = [
        ("api@free allowed", 2),
        ("api@free rejected", 1),
        ("api@pro allowed", 1),
        // An unknown tier must not become a label: the call's own name.
        ("api unavailable", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(seen, expected);
}
