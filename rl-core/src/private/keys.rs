//! Key expressions in the forms the limiter takes: `(&&Probe(&key)).__rl_part()`
//! picks an integer, address or string form when the key's type has one
//! (autoref: method resolution tries the `&&Probe` receiver first), else
//! its `Display`.

use std::fmt::Display;

use crate::model::key::Part;

/// A key expression's value, for [`PartFast`] / [`PartDisplay`] to turn
/// into a [`Part`]: `(&&Probe(&key)).__rl_part()` picks an integer or
/// string form when the key's type has one (method resolution tries the
/// `&&Probe` receiver first), else its `Display`.
pub struct Probe<'a, T>(pub &'a T);

/// Keys with a fast form: integers and strings.
pub trait PartFast<'a> {
    /// The key's part.
    fn __rl_part(&self) -> Part<'a>;
}

/// Every other key: through its `Display` (a key that is not `Display` is
/// reported at the key, as "doesn't implement `Display`").
pub trait PartDisplay<'a, T> {
    /// The key's part.
    fn __rl_part(&self) -> Part<'a>
    where
        T: Display;
}

impl<'a, T> PartDisplay<'a, T> for Probe<'a, T> {
    fn __rl_part(&self) -> Part<'a>
    where
        T: Display,
    {
        Part::Display(self.0)
    }
}

macro_rules! fast {
    ($variant:ident as $wide:ty: $($int:ty),*) => {$(
        impl<'a> PartFast<'a> for &Probe<'a, $int> {
            fn __rl_part(&self) -> Part<'a> {
                Part::$variant(*self.0 as $wide)
            }
        }
    )*};
}

fast!(Unsigned as u64: u8, u16, u32, u64, usize);
fast!(Signed as i64: i8, i16, i32, i64, isize);

impl<'a> PartFast<'a> for &Probe<'a, std::net::IpAddr> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Ip(*self.0)
    }
}

impl<'a> PartFast<'a> for &Probe<'a, std::net::Ipv4Addr> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Ip((*self.0).into())
    }
}

impl<'a> PartFast<'a> for &Probe<'a, String> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Text(self.0)
    }
}

impl<'a, 'b: 'a> PartFast<'a> for &Probe<'a, &'b str> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Text(self.0)
    }
}
