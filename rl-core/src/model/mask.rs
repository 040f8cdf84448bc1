//! Masking of identities in logs: phone numbers and user names are personal data.

use std::fmt;

/// Displays an identity with all but its first two and last two characters
/// replaced by `*` (short identities are fully masked).
///
/// ```
/// use ratewall::key::Masked;
/// assert_eq!(Masked("sms:+8613800000000").to_string(), "sm**************00");
/// assert_eq!(Masked("bob").to_string(), "***");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Masked<'a>(pub &'a str);

impl fmt::Display for Masked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.chars().count();
        for (i, c) in self.0.chars().enumerate() {
            let keep = count > 6 && (i < 2 || i + 2 >= count);
            if keep {
                write!(f, "{c}")?;
            } else {
                f.write_str("*")?;
            }
        }
        Ok(())
    }
}
