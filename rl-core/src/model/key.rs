//! Storage keys: a prefix, then a hash tag holding the scope and the identity.
//!
//! Layout: `prefix:{scope:identity}`; backends append their own suffix per
//! limit. Scope and identity are escaped so that no byte of user input can
//! end the hash tag early (moving the Redis Cluster slot) or make two
//! different identities render to the same key: `%`, `{`, `}` and `:` become
//! `%25`, `%7B`, `%7D` and `%3A`. The escaped parts contain no `:`, so the
//! split between scope and identity is unambiguous and the encoding is
//! injective.

use std::fmt::{self, Write};

use crate::model::memo::Memo;

/// The storage key of one identity under one scope.
///
/// ```
/// use ratewall::Key;
/// let a = Key::new("rl", "login", "al{ice}");
/// let b = Key::new("rl", "login", "al:ice");
/// assert_eq!(a.as_str(), "rl:{login:al%7Bice%7D}");
/// assert_ne!(a, b);
/// assert_eq!(a.hash_tag(), "login:al%7Bice%7D");
/// assert_eq!((a.head(), a.identity()), ("rl:{login:", "al%7Bice%7D"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    text: String,
    /// Where the escaped identity starts (after `prefix:{scope:`).
    identity_at: usize,
    /// The identity's typed form, when it has one (found once, when the
    /// key is built: a function of `text`, so equality and order are
    /// unchanged).
    typed: Typed,
    /// What the raw requests' lane found for this key ([`Memo`]).
    memo: Memo,
}

// At most a cache line: a slice of keys walked in order (as the raw
// requests' lane reads them) reads one new line per key.
const _: () = assert!(std::mem::size_of::<Key>() <= 64);

/// The typed form of a key's identity ([`IdentityRef`]'s non-text forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Typed {
    Text,
    Number(u64),
    Ipv4(u32),
}

impl Typed {
    fn of(identity: IdentityRef<'_>) -> Self {
        match identity {
            IdentityRef::Number(n) => Typed::Number(n),
            IdentityRef::Ipv4(ip) => Typed::Ipv4(ip),
            IdentityRef::Text(_) => Typed::Text,
        }
    }
}

impl Key {
    /// The key for `identity` under `scope`, with the limiter's `prefix`.
    pub fn new(prefix: &str, scope: &str, identity: &str) -> Self {
        let mut text = String::with_capacity(prefix.len() + scope.len() + identity.len() + 4);
        write_head(&mut text, prefix, scope);
        let identity_at = text.len();
        escape_into(&mut text, identity);
        text.push('}');
        Self::done(text, identity_at)
    }

    /// Like [`Key::new`], formatting the identity from any `Display` value
    /// without an intermediate string.
    pub fn from_display(prefix: &str, scope: &str, identity: &dyn fmt::Display) -> Self {
        let mut text = String::with_capacity(prefix.len() + scope.len() + 24);
        write_head(&mut text, prefix, scope);
        let identity_at = text.len();
        let _ = write!(Escaper(&mut text), "{identity}");
        text.push('}');
        Self::done(text, identity_at)
    }

    /// The key whose head ([`Key::head`]) and identity are given.
    pub(crate) fn from_parts(head: &str, identity: IdentityRef<'_>) -> Self {
        let mut text = String::with_capacity(head.len() + identity.text_len() + 1);
        text.push_str(head);
        identity.push_to(&mut text);
        text.push('}');
        Self {
            identity_at: head.len(),
            text,
            typed: Typed::of(identity),
            memo: Memo::default(),
        }
    }

    /// The key of `text`, whose identity starts at `identity_at`.
    fn done(text: String, identity_at: usize) -> Self {
        let typed = Typed::of(IdentityRef::of_escaped(&text[identity_at..text.len() - 1]));
        Self {
            text,
            identity_at,
            typed,
            memo: Memo::default(),
        }
    }

    /// The identity as the pipeline carries it.
    #[inline]
    pub(crate) fn identity_ref(&self) -> IdentityRef<'_> {
        match self.typed {
            Typed::Number(n) => IdentityRef::Number(n),
            Typed::Ipv4(ip) => IdentityRef::Ipv4(ip),
            Typed::Text => IdentityRef::Text(self.identity()),
        }
    }

    /// What the raw requests' lane found for this key.
    #[inline]
    pub(crate) fn memo(&self) -> &Memo {
        &self.memo
    }

    /// The rendered key.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The part between the braces: Redis Cluster hashes only this, so all
    /// keys of one identity share one slot.
    pub fn hash_tag(&self) -> &str {
        &self.text[scope_at(&self.text)..self.text.len() - 1]
    }

    /// Everything before the identity: `prefix:{scope:` (escaped). Keys of
    /// one scope under one prefix share it.
    #[inline]
    pub fn head(&self) -> &str {
        &self.text[..self.identity_at]
    }

    /// The escaped scope (`scope` of `prefix:{scope:identity}`): the name a
    /// raw request is counted and named by.
    #[inline]
    pub(crate) fn scope(&self) -> &str {
        self.text
            .get(scope_at(&self.text)..self.identity_at.saturating_sub(1))
            .unwrap_or("")
    }

    /// The escaped identity part of the hash tag (what logs mask).
    #[inline]
    pub fn identity(&self) -> &str {
        &self.text[self.identity_at..self.text.len() - 1]
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Where the hash tag of a key's `text` starts: after its first `{` (0
/// without one). A key's scope starts there too. Found when asked, not
/// kept: a key is 64 bytes (one new cache line per key of a slice walked
/// in order), and the raw requests' lane never asks.
fn scope_at(text: &str) -> usize {
    text.find('{').map_or(0, |i| i + 1)
}

/// `prefix:{scope:` with the scope escaped: the head of every key of one
/// scope ([`Key::head`]).
pub(crate) fn head(prefix: &str, scope: &str) -> String {
    let mut text = String::with_capacity(prefix.len() + scope.len() + 3);
    write_head(&mut text, prefix, scope);
    text
}

fn write_head(out: &mut String, prefix: &str, scope: &str) {
    out.push_str(prefix);
    out.push_str(":{");
    escape_into(out, scope);
    out.push(':');
}

/// An identity as the pipeline carries it: a number, an IPv4 address, or
/// escaped text.
///
/// An identity whose text is an unsigned integer in canonical decimal (no
/// sign, no leading zero, at most `u64::MAX`) is always a `Number`, one
/// whose text is an IPv4 address in canonical dotted decimal (four
/// octets, no leading zero, as `Ipv4Addr`'s `Display` writes it) always an
/// `Ipv4`, however it was given (an integer, an address, a string, a
/// `Display` value, a rendered [`Key`]), and every other identity is
/// `Text`: the forms are a bijection with the text, so an identity has
/// exactly one form, and the memory store keys a number's or an address'
/// state on the value itself (no rendering, a smaller entry) without two
/// identities ever sharing state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IdentityRef<'a> {
    /// An identity whose text is this number's decimal form.
    Number(u64),
    /// An identity whose text is this IPv4 address' dotted decimal form.
    Ipv4(u32),
    /// Any other identity, escaped (never a canonical number or address:
    /// build it with [`IdentityRef::of_escaped`]).
    Text(&'a str),
}

impl<'a> IdentityRef<'a> {
    /// The identity whose escaped text is `text`.
    #[inline]
    pub(crate) fn of_escaped(text: &'a str) -> Self {
        if let Some(n) = number(text) {
            return IdentityRef::Number(n);
        }
        match ipv4(text) {
            Some(ip) => IdentityRef::Ipv4(ip),
            None => IdentityRef::Text(text),
        }
    }

    /// Runs `f` with the escaped text.
    pub(crate) fn with_text<R>(self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            IdentityRef::Number(n) => f(itoa::Buffer::new().format(n)),
            IdentityRef::Ipv4(ip) => {
                let mut text = arrayvec::ArrayString::<15>::new();
                push_ipv4(&mut text, std::net::Ipv4Addr::from(ip));
                f(&text)
            }
            IdentityRef::Text(text) => f(text),
        }
    }

    /// Appends the escaped text to `out`.
    pub(crate) fn push_to(self, out: &mut String) {
        self.with_text(|text| out.push_str(text));
    }

    /// The length of the escaped text.
    pub(crate) fn text_len(self) -> usize {
        self.with_text(str::len)
    }
}

impl fmt::Display for IdentityRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_text(|text| f.write_str(text))
    }
}

/// The IPv4 address whose canonical dotted decimal form (as `Ipv4Addr`'s
/// `Display` writes it) `text` is, if any: four octets of 1 to 3 ASCII
/// digits, no leading zero (but `0` itself), each at most 255.
#[inline]
fn ipv4(text: &str) -> Option<u32> {
    let bytes = text.as_bytes();
    // Most text is not an address: reject it at the first byte or length.
    if !(7..=15).contains(&bytes.len()) || !bytes[0].is_ascii_digit() {
        return None;
    }
    let (mut address, mut octet, mut digits, mut dots) = (0u32, 0u32, 0u32, 0u32);
    for &byte in bytes {
        if byte == b'.' {
            if digits == 0 || dots == 3 {
                return None;
            }
            address = address << 8 | octet;
            (octet, digits) = (0, 0);
            dots += 1;
            continue;
        }
        let digit = byte.wrapping_sub(b'0');
        // Not a digit, or a digit after a leading zero.
        if digit > 9 || (digits == 1 && octet == 0) {
            return None;
        }
        octet = octet * 10 + u32::from(digit);
        digits += 1;
        if octet > 255 {
            return None;
        }
    }
    if dots != 3 || digits == 0 {
        return None;
    }
    Some(address << 8 | octet)
}

/// Appends `ip` in dotted decimal (as its `Display` does), digit by digit:
/// no `core::fmt`.
pub(crate) fn push_ipv4<const N: usize>(
    out: &mut arrayvec::ArrayString<N>,
    ip: std::net::Ipv4Addr,
) {
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            text[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            text[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        text[len] = b'0' + octet % 10;
        len += 1;
    }
    // ASCII digits and dots: always UTF-8.
    if let Ok(text) = std::str::from_utf8(&text[..len]) {
        let _ = out.try_push_str(text);
    }
}

/// The number whose canonical decimal form `text` is, if any: 1 to 20
/// ASCII digits, no leading zero (but `0` itself), at most `u64::MAX`.
#[inline]
fn number(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    match bytes {
        [] => return None,
        [b'0', _, ..] => return None,
        _ if bytes.len() > 20 => return None,
        _ => {}
    }
    let mut n: u64 = 0;
    for &byte in bytes {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(digit))?;
    }
    Some(n)
}

/// An identity rendered and escaped for a key: a number as is, short text
/// on the stack (at most [`Identity::INLINE`] bytes, e.g. an IPv6 address
/// or a phone number), longer text on the heap. What a decision in memory
/// needs, without allocating for the common identities.
#[derive(Debug, Clone)]
pub(crate) enum Identity {
    Number(u64),
    Ipv4(u32),
    Inline(arrayvec::ArrayString<{ Identity::INLINE }>),
    Spilled(Box<str>),
}

/// The identities of one call (two inline: most calls have one or two keys).
pub(crate) type Identities = smallvec::SmallVec<[Identity; 2]>;

/// An identity as a call passes it: an integer or a string, rendered
/// without `core::fmt`, or anything `Display`. `#[rate_limit]` picks the
/// first two where the key's type allows; every form renders exactly as the
/// value's `Display` does.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum Part<'a> {
    /// An unsigned integer.
    Unsigned(u64),
    /// A signed integer.
    Signed(i64),
    /// Text.
    Text(&'a str),
    /// Anything else, through its `Display`.
    Display(&'a dyn fmt::Display),
    /// An IP address (as its `Display` form; an IPv4 address without
    /// rendering it).
    Ip(std::net::IpAddr),
}

impl fmt::Debug for Part<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Unsigned(n) => write!(f, "Unsigned({n})"),
            Part::Signed(n) => write!(f, "Signed({n})"),
            Part::Text(t) => write!(f, "Text({t:?})"),
            Part::Display(d) => write!(f, "Display({d})"),
            Part::Ip(ip) => write!(f, "Ip({ip})"),
        }
    }
}

/// Text being escaped into an [`Identity`].
struct Building {
    inline: arrayvec::ArrayString<{ Identity::INLINE }>,
    spilled: Option<String>,
}

impl Building {
    fn new() -> Self {
        Self {
            inline: arrayvec::ArrayString::new(),
            spilled: None,
        }
    }

    /// The identity built from text known not to be a number or an IPv4
    /// address.
    fn finish_text(self) -> Identity {
        match self.spilled {
            Some(text) => Identity::Spilled(text.into_boxed_str()),
            None => Identity::Inline(self.inline),
        }
    }

    /// The identity built, a number when its text is one.
    fn finish(self) -> Identity {
        match self.spilled {
            Some(text) => Identity::Spilled(text.into_boxed_str()),
            None => match IdentityRef::of_escaped(&self.inline) {
                IdentityRef::Number(n) => Identity::Number(n),
                IdentityRef::Ipv4(ip) => Identity::Ipv4(ip),
                IdentityRef::Text(_) => Identity::Inline(self.inline),
            },
        }
    }
}

impl Identity {
    /// Bytes held without allocating (an IPv6 address, a UUID).
    pub(crate) const INLINE: usize = 40;

    /// Renders `identity` (its `Display` form), escaped like [`Key`]'s.
    pub(crate) fn render(identity: &dyn fmt::Display) -> Self {
        Self::of(Part::Display(identity))
    }

    /// Renders one part, escaped like [`Key`]'s (digits need no escaping).
    #[inline(always)]
    pub(crate) fn of(part: Part<'_>) -> Self {
        // The typed forms inline, the rest out of line.
        match part {
            Part::Unsigned(n) => Identity::Number(n),
            Part::Ip(std::net::IpAddr::V4(ip)) => Identity::Ipv4(u32::from(ip)),
            part => Self::rendered(part),
        }
    }

    /// [`Identity::of`] for the parts that take rendering or checking.
    #[inline(never)]
    fn rendered(part: Part<'_>) -> Self {
        match part {
            Part::Unsigned(n) => Identity::Number(n),
            Part::Signed(n) => match u64::try_from(n) {
                Ok(n) => Identity::Number(n),
                Err(_) => {
                    let mut out = Building::new();
                    out.push_str(itoa::Buffer::new().format(n));
                    out.finish()
                }
            },
            Part::Text(text) => {
                match IdentityRef::of_escaped(text) {
                    IdentityRef::Number(n) => return Identity::Number(n),
                    IdentityRef::Ipv4(ip) => return Identity::Ipv4(ip),
                    IdentityRef::Text(_) => {}
                }
                // Neither a number nor an address, and escaping only adds
                // `%XX`: the result is text (no second check).
                if text.len() <= Identity::INLINE
                    && !needs_escape(text)
                    && let Ok(inline) = arrayvec::ArrayString::from(text)
                {
                    return Identity::Inline(inline);
                }
                let mut out = Building::new();
                let _ = Escaper(&mut out).write_str(text);
                out.finish_text()
            }
            Part::Display(identity) => {
                let mut out = Building::new();
                let _ = write!(Escaper(&mut out), "{identity}");
                out.finish()
            }
            Part::Ip(std::net::IpAddr::V4(ip)) => Identity::Ipv4(u32::from(ip)),
            Part::Ip(ip) => Identity::of(Part::Display(&ip)),
        }
    }

    /// The identity as the pipeline carries it.
    #[inline]
    pub(crate) fn as_ref(&self) -> IdentityRef<'_> {
        match self {
            Identity::Number(n) => IdentityRef::Number(*n),
            Identity::Ipv4(ip) => IdentityRef::Ipv4(*ip),
            Identity::Inline(text) => IdentityRef::Text(text),
            Identity::Spilled(text) => IdentityRef::Text(text),
        }
    }
}

/// Where escaped text goes.
trait Sink {
    fn push_str(&mut self, s: &str);
}

impl Sink for String {
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
}

impl Sink for Building {
    fn push_str(&mut self, s: &str) {
        if let Some(spilled) = &mut self.spilled {
            spilled.push_str(s);
        } else if self.inline.try_push_str(s).is_err() {
            let mut spilled = String::with_capacity(self.inline.len() + s.len() + 16);
            spilled.push_str(&self.inline);
            spilled.push_str(s);
            self.spilled = Some(spilled);
        }
    }
}

/// Checks a key prefix: non-empty, no braces (they would become the hash tag)
/// and no whitespace.
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && !prefix.contains(['{', '}']) && !prefix.contains(char::is_whitespace)
}

fn escape_into(out: &mut String, part: &str) {
    let _ = Escaper(out).write_str(part);
}

/// Escapes what is written through it: `%`, `{`, `}` and `:` become `%25`,
/// `%7B`, `%7D` and `%3A`.
struct Escaper<'a, S: Sink>(&'a mut S);

/// Whether `text` has a byte that [`Escaper`] rewrites.
#[inline]
fn needs_escape(text: &str) -> bool {
    text.bytes().any(|b| matches!(b, b'%' | b'{' | b'}' | b':'))
}

impl<S: Sink> Write for Escaper<'_, S> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // A scan over bytes: the four escaped characters are ASCII, so a
        // byte match is a char boundary (cheaper than a `char` pattern).
        let mut start = 0;
        for (at, byte) in s.bytes().enumerate() {
            let escaped = match byte {
                b'%' => "%25",
                b'{' => "%7B",
                b'}' => "%7D",
                b':' => "%3A",
                _ => continue,
            };
            self.0.push_str(&s[start..at]);
            self.0.push_str(escaped);
            start = at + 1;
        }
        self.0.push_str(&s[start..]);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
