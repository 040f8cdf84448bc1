use std::collections::{HashMap, HashSet};

use super::*;

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

// The laws below hold for all text. Each is checked on every case of a
// small domain chosen for what the code treats specially (the characters
// escaping rewrites and those its escapes are made of, digits and dots,
// lengths around `Identity::INLINE`), then on `SAMPLED` pseudo-random cases
// of the wide domain (any text of the length given), the same on every run.

/// Pseudo-random cases per law, beyond the exhaustive ones.
const SAMPLED: usize = 1024;

/// The characters escaping rewrites (`%`, `{`, `}`, `:`), those of their
/// escapes (`%3A`, `%7B`), and a multi-byte one.
const KEY_CHARS: &str = "%:{}37ABé";

/// The characters of numbers and dotted addresses, enough to build
/// canonical ones and every kind of non-canonical one (leading zero,
/// missing or extra dot).
const DOTTED: &str = "0129.";

/// A deterministic stream of pseudo-random numbers (xorshift64*).
struct Draws(u64);

impl Draws {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Any char but `\n` (as a regex's `.`): a quarter from [`KEY_CHARS`]
    /// and [`DOTTED`], a quarter printable ASCII, half any scalar value.
    fn char(&mut self) -> char {
        loop {
            let c = match self.below(4) {
                0 => {
                    let special: Vec<char> = KEY_CHARS.chars().chain(DOTTED.chars()).collect();
                    special[self.below(special.len())]
                }
                1 => char::from(b' ' + self.below(95) as u8),
                _ => match char::from_u32(self.below(0x11_0000) as u32) {
                    Some(c) => c,
                    None => continue,
                },
            };
            if c != '\n' {
                return c;
            }
        }
    }

    /// Text of 0 to `max` chars, each from `char` (`.{0,max}`).
    fn text(&mut self, max: usize) -> String {
        (0..self.below(max + 1)).map(|_| self.char()).collect()
    }

    /// Text of 0 to `max` chars from `alphabet` (`[alphabet]{0,max}`).
    fn text_of(&mut self, alphabet: &str, max: usize) -> String {
        let chars: Vec<char> = alphabet.chars().collect();
        (0..self.below(max + 1))
            .map(|_| chars[self.below(chars.len())])
            .collect()
    }
}

/// Every string of at most `max` chars from `alphabet`.
fn every(alphabet: &str, max: usize) -> Vec<String> {
    let mut all = vec![String::new()];
    let mut longest = vec![String::new()];
    for _ in 0..max {
        longest = longest
            .iter()
            .flat_map(|s| alphabet.chars().map(move |c| format!("{s}{c}")))
            .collect();
        all.extend(longest.iter().cloned());
    }
    all
}

/// Every (scope, identity) of at most 2 and 3 chars of [`KEY_CHARS`], or 3
/// and 2.
fn short_pairs() -> Vec<(String, String)> {
    let (two, three) = (every(KEY_CHARS, 2), every(KEY_CHARS, 3));
    let mut pairs = Vec::new();
    for s in &two {
        for i in &three {
            pairs.push((s.clone(), i.clone()));
            pairs.push((i.clone(), s.clone()));
        }
    }
    pairs
}

/// Identities the code treats specially: numbers and addresses near and
/// past their bounds, and text whose escaped form is near
/// `Identity::INLINE` bytes (escapes triple a byte, `é` is two).
fn notable_identities() -> Vec<String> {
    let mut all: Vec<String> = [
        "0",
        "00",
        "007",
        "42",
        "-5",
        "+5",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999",
        "0.0.0.0",
        "192.0.2.7",
        "255.255.255.255",
        "256.0.0.1",
        "01.2.3.4",
        "1.2.3",
        "::1",
        "2001:db8::1",
        "::ffff:192.0.2.7",
    ]
    .map(str::to_owned)
    .into();
    for n in 0..=Identity::INLINE + 5 {
        all.push("x".repeat(n));
        all.push(":".repeat(n));
        all.push("é".repeat(n));
        all.push(format!("{}:", "x".repeat(n)));
    }
    all
}

/// Every text of [`DOTTED`] of at most 8 chars, and every dotted quad of
/// octet texts (`25[0-9]|2[0-4][0-9]|1?[0-9]?[0-9]|0[0-9]`) with one octet
/// any of them and the other three among a few.
fn dotted_texts() -> Vec<String> {
    let mut octets: Vec<String> = (0..=259).map(|n: u32| n.to_string()).collect();
    octets.extend((0..=9).map(|n| format!("0{n}")));
    let others = ["0", "10", "255", "00", "09", "259"];
    let mut all = every(DOTTED, 8);
    for at in 0..4 {
        for octet in &octets {
            for a in others {
                for b in others {
                    for c in others {
                        let mut quad = vec![a, b, c];
                        quad.insert(at, octet);
                        all.push(quad.join("."));
                    }
                }
            }
        }
    }
    all
}

/// An octet text as `25[0-9]|2[0-4][0-9]|1?[0-9]?[0-9]|0[0-9]` draws it.
fn octet_text(draws: &mut Draws) -> String {
    match draws.below(4) {
        0 => format!("25{}", draws.below(10)),
        1 => format!("2{}{}", draws.below(5), draws.below(10)),
        2 => {
            let one = if draws.below(2) == 0 { "1" } else { "" };
            let tens = if draws.below(2) == 0 {
                draws.below(10).to_string()
            } else {
                String::new()
            };
            format!("{one}{tens}{}", draws.below(10))
        }
        _ => format!("0{}", draws.below(10)),
    }
}

#[test]
fn distinct_scope_identity_pairs_never_share_a_key() {
    // Keys are `Ord` and `Eq` alike: sorted, keys that are equal lie side
    // by side, and one equal to its neighbour with another pair is two
    // pairs sharing it. Nor do two pairs share a key's text (what a store
    // keys on; `==` also compares where the parts start).
    let mut keys: Vec<(Key, (String, String))> = Vec::new();
    let mut texts: HashMap<String, (String, String)> = HashMap::new();
    for (s, i) in short_pairs() {
        let key = Key::new("rl", &s, &i);
        assert_eq!(key, Key::new("rl", &s, &i));
        let pair = (s, i);
        if let Some(other) = texts.insert(key.as_str().to_owned(), pair.clone()) {
            assert_eq!(other, pair, "two pairs share a key's text");
        }
        keys.push((key, pair));
    }
    keys.sort();
    for side_by_side in keys.windows(2) {
        let ((a, pair_a), (b, pair_b)) = (&side_by_side[0], &side_by_side[1]);
        assert_eq!(a == b, pair_a == pair_b, "{pair_a:?} / {pair_b:?}");
    }
    let mut draws = Draws::new(1);
    for _ in 0..SAMPLED {
        let (s1, i1) = (draws.text(6), draws.text(12));
        let (s2, i2) = (draws.text(6), draws.text(12));
        let a = Key::new("rl", &s1, &i1);
        let b = Key::new("rl", &s2, &i2);
        assert_eq!(
            a == b,
            s1 == s2 && i1 == i2,
            "{s1:?} {i1:?} / {s2:?} {i2:?}"
        );
        assert_eq!(a.as_str() == b.as_str(), a == b);
        assert_eq!(a, Key::new("rl", &s1, &i1));
    }
}

#[test]
fn the_hash_tag_is_exactly_the_escaped_scope_and_identity() {
    let check = |s: &str, i: &str| {
        let key = Key::new("rl", s, i);
        assert_eq!(key.as_str(), format!("rl:{{{}}}", key.hash_tag()));
        assert!(!key.hash_tag().contains(['{', '}']), "{s:?} {i:?}");
    };
    for (s, i) in short_pairs() {
        check(&s, &i);
    }
    let mut draws = Draws::new(2);
    for _ in 0..SAMPLED {
        check(&draws.text(6), &draws.text(20));
    }
}

#[test]
fn a_rendered_identity_is_the_identity_of_its_key() {
    let check = |s: &str, i: &str| {
        let key = Key::new("rl", s, i);
        let rendered = Identity::render(&i);
        assert_eq!(text(&rendered), key.identity(), "{s:?} {i:?}");
        assert_eq!(IdentityRef::of_escaped(key.identity()), rendered.as_ref());
        assert_eq!(key.identity_ref(), rendered.as_ref());
        assert_eq!(Key::from_parts(&head("rl", s), rendered.as_ref()), key);
    };
    for (s, i) in short_pairs() {
        check(&s, &i);
    }
    for i in notable_identities() {
        for s in ["", "s", "a:{b}%", "é"] {
            check(s, &i);
        }
    }
    let mut draws = Draws::new(3);
    for _ in 0..SAMPLED {
        check(&draws.text(6), &draws.text(80));
    }
}

#[test]
fn every_ipv4_address_is_one_identity_however_it_is_given() {
    let check = |ip: u32| {
        let address = std::net::Ipv4Addr::from(ip);
        let shown = address.to_string();
        let typed = Identity::of(Part::Ip(address.into()));
        assert_eq!(typed.as_ref(), IdentityRef::Ipv4(ip));
        let (of_text, rendered) = (Identity::of(Part::Text(&shown)), Identity::render(&address));
        assert_eq!(of_text.as_ref(), typed.as_ref(), "{shown}");
        assert_eq!(rendered.as_ref(), typed.as_ref(), "{shown}");
        assert_eq!(text(&typed), shown);
        let key = Key::new("rl", "s", &shown);
        assert_eq!(key.identity_ref(), typed.as_ref(), "{shown}");
        assert_eq!(Key::from_parts(&head("rl", "s"), typed.as_ref()), key);
    };
    // Every address of octets at the bounds of one, two and three digits.
    let edges = [0u8, 1, 9, 10, 99, 100, 199, 200, 249, 250, 255];
    for a in edges {
        for b in edges {
            for c in edges {
                for d in edges {
                    check(u32::from_be_bytes([a, b, c, d]));
                }
            }
        }
    }
    // Every octet in every place.
    for at in 0..4 {
        for octet in 0..=255 {
            let mut octets = [7u8; 4];
            octets[at] = octet;
            check(u32::from_be_bytes(octets));
        }
    }
    let mut draws = Draws::new(4);
    for _ in 0..SAMPLED {
        check(draws.next() as u32);
    }
}

#[test]
fn text_is_an_address_exactly_when_it_is_an_addresses_display() {
    let check = |text: &str| {
        let canonical = text
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .filter(|a| a.to_string() == text)
            .map(u32::from);
        assert_eq!(ipv4(text), canonical, "{text:?}");
    };
    for text in dotted_texts() {
        check(&text);
    }
    let mut draws = Draws::new(5);
    for _ in 0..SAMPLED {
        check(&draws.text_of("0123456789.", 16));
        let octets: Vec<String> = (0..4).map(|_| octet_text(&mut draws)).collect();
        check(&octets.join("."));
    }
}

#[test]
fn two_identities_have_one_form_exactly_when_their_texts_are_equal() {
    let mut texts: HashSet<String> = every(KEY_CHARS, 3).into_iter().collect();
    texts.extend(every(DOTTED, 7));
    texts.extend(notable_identities());
    texts.extend(
        [
            "00000000000000000000",
            "10000000000000000000",
            "018446744073709551615",
        ]
        .map(str::to_owned),
    );
    texts.extend(["9".repeat(20), "9".repeat(21), "1".repeat(21)]);
    let mut draws = Draws::new(6);
    for _ in 0..SAMPLED {
        texts.insert(draws.text_of("0123456789", 21));
        texts.insert(draws.text(4));
    }
    let forms: Vec<(&str, Identity)> = texts
        .iter()
        .map(|text| (text.as_str(), Identity::of(Part::Text(text))))
        .collect();
    // Forms are `Eq` and `Hash` alike: a form met again with another text
    // is two texts sharing it.
    let mut seen: HashMap<IdentityRef<'_>, &str> = HashMap::new();
    for (text, form) in &forms {
        assert_eq!(form.as_ref(), Identity::of(Part::Text(text)).as_ref());
        if let Some(other) = seen.insert(form.as_ref(), text) {
            panic!("{other:?} and {text:?} have one form, {:?}", form.as_ref());
        }
    }
}
