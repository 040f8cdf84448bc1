use super::*;
use proptest::prelude::*;

#[test]
fn hostile_identities_cannot_leave_the_hash_tag() {
    let key = Key::new("rl", "sms", "}{x:y}%");
    assert_eq!(key.hash_tag(), "sms:%7D%7Bx%3Ay%7D%25");
    assert_eq!(key.as_str().matches('{').count(), 1);
    assert_eq!(key.as_str().matches('}').count(), 1);
}

#[test]
fn the_identity_part_excludes_the_scope() {
    assert_eq!(Key::new("rl", "sms:x", "+86:1").identity(), "+86%3A1");
}

#[test]
fn the_scope_is_the_escaped_scope_however_the_key_was_built() {
    let built = Key::new("rl", "sms:x{", "+86");
    assert_eq!(built.scope(), "sms%3Ax%7B");
    let shown = Key::from_display("rl", "sms:x{", &86u64);
    assert_eq!(shown.scope(), "sms%3Ax%7B");
    let parts = Key::from_parts(built.head(), IdentityRef::Number(86));
    assert_eq!(parts.scope(), "sms%3Ax%7B");
    assert_eq!(parts, shown);
    // A head that is no key's head still gives a scope, never a panic.
    assert_eq!(Key::from_parts("", IdentityRef::Number(1)).scope(), "");
}

#[test]
fn display_identities_are_escaped_like_strings() {
    assert_eq!(
        Key::from_display("p", "s", &"a:{b}"),
        Key::new("p", "s", "a:{b}")
    );
    assert_eq!(
        Key::from_display("p", "s", &42u64),
        Key::new("p", "s", "42")
    );
}

/// The escaped text of an identity.
fn text(identity: &Identity) -> String {
    identity.as_ref().to_string()
}

#[test]
fn rendered_identities_escape_like_keys_and_spill_past_the_inline_size() {
    let short = Identity::render(&"a:{b}%");
    assert_eq!(text(&short), Key::new("p", "s", "a:{b}%").identity());
    assert!(matches!(short, Identity::Inline(_)));
    let long = "x:".repeat(40);
    let rendered = Identity::render(&long);
    assert_eq!(text(&rendered), Key::new("p", "s", &long).identity());
    assert!(matches!(rendered, Identity::Spilled(_)));
    assert_eq!(text(&Identity::render(&42u64)), "42");
    for part in [
        Part::Unsigned(u64::MAX),
        Part::Signed(i64::MIN),
        Part::Signed(7),
        Part::Text("a:{b}"),
        Part::Text("42"),
        Part::Text("192.0.2.7"),
        Part::Ip("192.0.2.7".parse().unwrap()),
        Part::Ip("2001:db8::1".parse().unwrap()),
        Part::Ip("::ffff:192.0.2.7".parse().unwrap()),
    ] {
        let shown = match part {
            Part::Unsigned(n) => n.to_string(),
            Part::Signed(n) => n.to_string(),
            Part::Text(t) => t.to_owned(),
            Part::Display(d) => d.to_string(),
            Part::Ip(ip) => ip.to_string(),
        };
        assert_eq!(
            Identity::of(part).as_ref(),
            Identity::render(&shown).as_ref()
        );
    }
    let key = Key::from_parts(&head("p", "s:x"), Identity::render(&"i").as_ref());
    assert_eq!(key, Key::new("p", "s:x", "i"));
    assert_eq!(key.head(), "p:{s%3Ax:");
}

#[test]
fn an_identity_is_an_address_exactly_when_its_text_is_a_canonical_ipv4() {
    for (given, expected) in [
        ("0.0.0.0", Some(0)),
        ("192.0.2.7", Some(0xC000_0207)),
        ("255.255.255.255", Some(u32::MAX)),
        ("256.0.0.1", None),
        ("01.2.3.4", None),
        ("1.2.3.04", None),
        ("1.2.3", None),
        ("1.2.3.4.", None),
        ("1..2.3", None),
        (".1.2.3", None),
        ("1.2.3.4.5", None),
        ("1.2.3.-4", None),
        ("1.2.3.4 ", None),
        ("1000.2.3.4", None),
    ] {
        assert_eq!(ipv4(given), expected, "{given:?}");
        let identity = Identity::of(Part::Text(given));
        assert_eq!(matches!(identity, Identity::Ipv4(_)), expected.is_some());
        assert_eq!(text(&identity), Key::new("p", "s", given).identity());
        let key = Key::new("p", "s", given);
        assert_eq!(IdentityRef::of_escaped(key.identity()), identity.as_ref());
        assert_eq!(key.identity_ref(), identity.as_ref());
        assert_eq!(Identity::render(&given).as_ref(), identity.as_ref());
    }
}

#[test]
fn an_identity_is_a_number_exactly_when_its_text_is_a_canonical_u64() {
    for (given, expected) in [
        ("0", Some(0)),
        ("42", Some(42)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("007", None),
        ("00", None),
        ("+5", None),
        ("-5", None),
        ("4 2", None),
        ("", None),
        ("٣", None),
    ] {
        assert_eq!(number(given), expected, "{given:?}");
        let identity = Identity::of(Part::Text(given));
        assert_eq!(matches!(identity, Identity::Number(_)), expected.is_some());
        assert_eq!(text(&identity), Key::new("p", "s", given).identity());
        let key = Key::new("p", "s", given);
        assert_eq!(IdentityRef::of_escaped(key.identity()), identity.as_ref());
    }
    assert_eq!(
        Identity::of(Part::Signed(-3)).as_ref(),
        IdentityRef::Text("-3")
    );
    assert_eq!(
        Identity::of(Part::Signed(3)).as_ref(),
        IdentityRef::Number(3)
    );
}

#[test]
fn prefixes_with_braces_or_spaces_are_invalid() {
    assert!(valid_prefix("rl"));
    assert!(valid_prefix("app:rl"));
    assert!(!valid_prefix(""));
    assert!(!valid_prefix("a{b"));
    assert!(!valid_prefix("a b"));
}

proptest! {
    #[test]
    fn distinct_scope_identity_pairs_never_share_a_key(
        s1 in ".{0,6}", i1 in ".{0,12}", s2 in ".{0,6}", i2 in ".{0,12}"
    ) {
        let a = Key::new("rl", &s1, &i1);
        let b = Key::new("rl", &s2, &i2);
        prop_assert_eq!(a == b, s1 == s2 && i1 == i2);
    }

    #[test]
    fn the_hash_tag_is_exactly_the_escaped_scope_and_identity(s in ".{0,6}", i in ".{0,20}") {
        let key = Key::new("rl", &s, &i);
        prop_assert_eq!(key.as_str(), format!("rl:{{{}}}", key.hash_tag()));
        let braces_inside = key.hash_tag().contains(['{', '}']);
        prop_assert!(!braces_inside);
    }

    #[test]
    fn a_rendered_identity_is_the_identity_of_its_key(s in ".{0,6}", i in ".{0,80}") {
        let key = Key::new("rl", &s, &i);
        let rendered = Identity::render(&i);
        prop_assert_eq!(text(&rendered), key.identity());
        prop_assert_eq!(IdentityRef::of_escaped(key.identity()), rendered.as_ref());
        prop_assert_eq!(key.identity_ref(), rendered.as_ref());
        prop_assert_eq!(Key::from_parts(&head("rl", &s), rendered.as_ref()), key);
    }

    #[test]
    fn every_ipv4_address_is_one_identity_however_it_is_given(ip in any::<u32>()) {
        let address = std::net::Ipv4Addr::from(ip);
        let shown = address.to_string();
        let typed = Identity::of(Part::Ip(address.into()));
        prop_assert_eq!(typed.as_ref(), IdentityRef::Ipv4(ip));
        let (of_text, rendered) = (Identity::of(Part::Text(&shown)), Identity::render(&address));
        prop_assert_eq!(of_text.as_ref(), typed.as_ref());
        prop_assert_eq!(rendered.as_ref(), typed.as_ref());
        prop_assert_eq!(text(&typed), shown.clone());
        let key = Key::new("rl", "s", &shown);
        prop_assert_eq!(key.identity_ref(), typed.as_ref());
        prop_assert_eq!(Key::from_parts(&head("rl", "s"), typed.as_ref()), key);
    }

    #[test]
    fn text_is_an_address_exactly_when_it_is_an_addresses_display(
        text in "[0-9.]{0,16}|(25[0-9]|2[0-4][0-9]|1?[0-9]?[0-9]|0[0-9])(\\.(25[0-9]|2[0-4][0-9]|1?[0-9]?[0-9]|0[0-9])){3}"
    ) {
        let canonical = text
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .filter(|a| a.to_string() == text)
            .map(u32::from);
        prop_assert_eq!(ipv4(&text), canonical);
    }

    #[test]
    fn two_identities_have_one_form_exactly_when_their_texts_are_equal(
        a in "[0-9]{0,21}|.{0,4}", b in "[0-9]{0,21}|.{0,4}"
    ) {
        let (x, y) = (Identity::of(Part::Text(&a)), Identity::of(Part::Text(&b)));
        prop_assert_eq!(x.as_ref() == y.as_ref(), a == b);
    }
}
