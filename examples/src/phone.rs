//! Phone numbers as the `sms` service accepts them: parsed and validated
//! with libphonenumber's metadata (the `phonenumber` crate), and known by
//! their E.164 form, so that every way of writing one number is one identity.

use std::fmt;

use phonenumber::{Mode, ParseError};

/// The longest input looked at (the longest E.164 number is 16 characters;
/// room is left for spaces, punctuation and a `tel:` prefix).
const MAX_INPUT: usize = 64;

/// A phone number valid for its region, in E.164 form (`+8613800000000`).
///
/// Accepted, in international form only (there is no default region):
/// - `+` and the country calling code, then the number, with any spaces,
///   dashes, dots or parentheses: `+86 138-0000-0000`, `+1 (202) 555-0123`;
/// - `00` (the international call prefix) instead of or after the `+`:
///   `0086 138 0000 0000`, `+0086…`;
/// - the national trunk prefix after the country code, which is dropped:
///   `+86 0 138 0000 0000`, `+33 (0)6 12 34 56 78`;
/// - a `tel:` URI (RFC 3966) without parameters: `tel:+86-138-0000-0000`.
///
/// Refused: no `+` or `00` in front, an unknown country calling code, too
/// few or too many digits, a number that is not valid in its region (e.g.
/// an unallocated range), an extension.
///
/// ```
/// use ratewall_examples::phone::Phone;
/// let real = Phone::parse("+8613800000000").unwrap();
/// for variant in ["+008613800000000", "+86 0 13800000000", "0086 138 0000 0000", "tel:+86-138-0000-0000"] {
///     assert_eq!(Phone::parse(variant).unwrap(), real);
/// }
/// assert_eq!(real.to_string(), "+8613800000000");
/// assert!(Phone::parse("+00000000").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Phone(String);

/// Why a phone number was refused; its `Display` is the reason sent back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadPhone {
    /// Not in international form.
    #[error(
        "a phone number must be in international form: `+` (or `00`) and the country calling code, e.g. +86 138 0000 0000"
    )]
    NotInternational,
    /// Longer than anything worth parsing.
    #[error("a phone number has at most {MAX_INPUT} characters")]
    TooLongInput,
    /// No digits that make a number.
    #[error("not a phone number")]
    NotANumber,
    /// The country calling code is not assigned.
    #[error("unknown country calling code")]
    UnknownCountryCode,
    /// Too few digits.
    #[error("too few digits for a phone number")]
    TooShort,
    /// Too many digits.
    #[error("too many digits for a phone number")]
    TooLong,
    /// Parsed, but not a valid number where it belongs.
    #[error("not a valid phone number for {region}")]
    NotValid {
        /// `region CN`, or `calling code +1` when no region has such a
        /// number.
        region: String,
    },
    /// Carries an extension, which cannot receive an SMS.
    #[error("a number with an extension cannot receive SMS")]
    Extension,
}

impl Phone {
    /// Parses, validates and normalises `text` (see the type's docs).
    pub fn parse(text: &str) -> Result<Self, BadPhone> {
        let text = text.trim();
        if text.len() > MAX_INPUT {
            return Err(BadPhone::TooLongInput);
        }
        let international = international(text).ok_or(BadPhone::NotInternational)?;
        let number = phonenumber::parse(None, &international).map_err(|error| match error {
            ParseError::InvalidCountryCode => BadPhone::UnknownCountryCode,
            ParseError::TooShortAfterIdd | ParseError::TooShortNsn => BadPhone::TooShort,
            ParseError::TooLong => BadPhone::TooLong,
            _ => BadPhone::NotANumber,
        })?;
        if number.extension().is_some() {
            return Err(BadPhone::Extension);
        }
        if !number.is_valid() {
            let region = number.country().id().map_or_else(
                || format!("calling code +{}", number.code().value()),
                |id| format!("region {}", id.as_ref()),
            );
            return Err(BadPhone::NotValid { region });
        }
        Ok(Self(number.format().mode(Mode::E164).to_string()))
    }

    /// The E.164 form, e.g. `+8613800000000`.
    pub fn e164(&self) -> &str {
        &self.0
    }
}

/// `text` with a leading `00`, `+00` or `tel:` turned into `+`; `None` when
/// it does not start with `+` or `00`.
fn international(text: &str) -> Option<String> {
    let text = text
        .strip_prefix("tel:")
        .or_else(|| text.strip_prefix("TEL:"))
        .unwrap_or(text);
    let rest = if let Some(rest) = text.strip_prefix('+') {
        rest.trim_start()
    } else if text.starts_with("00") {
        text
    } else {
        return None;
    };
    let rest = rest.strip_prefix("00").unwrap_or(rest);
    Some(format!("+{rest}"))
}

impl fmt::Display for Phone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_of_writing_a_number_is_its_e164_form() {
        let e164 = |text: &str| Phone::parse(text).map(|p| p.0);
        for text in [
            "+8613800000000",
            " +86 138 0000 0000 ",
            "+86-138-0000-0000",
            "+86 0 13800000000",
            "+86 (0) 138 0000 0000",
            "+008613800000000",
            "+00 86 13800000000",
            "0086 13800000000",
            "tel:+86-138-0000-0000",
        ] {
            assert_eq!(e164(text).as_deref(), Ok("+8613800000000"), "{text}");
        }
        assert_eq!(e164("+33 (0)6 12 34 56 78").as_deref(), Ok("+33612345678"));
        assert_eq!(e164("+1 (202) 555-0123").as_deref(), Ok("+12025550123"));
    }

    #[test]
    fn invalid_numbers_are_refused_with_the_reason() {
        let reason = |text: &str| Phone::parse(text).unwrap_err();
        assert_eq!(reason("8613800000000"), BadPhone::NotInternational);
        assert_eq!(reason("13800000000"), BadPhone::NotInternational);
        assert_eq!(reason("+00000000"), BadPhone::UnknownCountryCode);
        assert_eq!(reason("+999123456789"), BadPhone::UnknownCountryCode);
        assert_eq!(reason("+8612345"), BadPhone::TooShort);
        assert_eq!(reason("+86abc00000000"), BadPhone::NotANumber);
        assert_eq!(reason("+８６１３８００００００００"), BadPhone::NotANumber);
        assert_eq!(
            reason("+3361234567801"),
            BadPhone::NotValid {
                region: "region FR".into()
            }
        );
        assert_eq!(
            reason("+15550000001"),
            BadPhone::NotValid {
                region: "calling code +1".into()
            }
        );
        assert_eq!(reason("+8613800000000 x12"), BadPhone::Extension);
        assert_eq!(
            reason(&format!("+86{}", "1".repeat(70))),
            BadPhone::TooLongInput
        );
        assert!(reason("+1234567890123456").to_string().contains("valid"));
    }
}
