//! Tier names: the named sets of limits one group chooses from per call
//! (`free`, `pro`), and the registry names they are configured under
//! (`api@pro`).

use std::fmt;

/// The longest tier name, in bytes.
pub const TIER_NAME_MAX: usize = 64;

/// Between a group's name and a tier's in the tier's registry name:
/// `api@pro`.
pub const TIER_SEPARATOR: char = '@';

/// The tier used when a call's tier is not one of the group's.
pub const DEFAULT_TIER: &str = "default";

/// A text that is not a tier name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTierName(pub String);

impl fmt::Display for BadTierName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a tier name: use 1 to {TIER_NAME_MAX} ASCII letters, digits, `_`, `-` or `.` \
             (e.g. `free`, `pro`, `team-2`)",
            self.0
        )
    }
}

impl std::error::Error for BadTierName {}

/// Checks a tier name: 1 to [`TIER_NAME_MAX`] bytes of ASCII letters,
/// digits, `_`, `-` and `.` (so `<group>@<tier>` splits at its last `@`,
/// and a tier name needs no escaping anywhere).
///
/// ```
/// use ratewall_grammar::check_tier_name;
/// assert!(check_tier_name("pro").is_ok());
/// assert!(check_tier_name("team-2.eu").is_ok());
/// assert!(check_tier_name("").is_err());
/// assert!(check_tier_name("a@b").is_err());
/// assert!(check_tier_name("pro plan").is_err());
/// ```
///
/// # Errors
/// [`BadTierName`] with the name when it is empty, longer than
/// [`TIER_NAME_MAX`] bytes, or holds a character other than ASCII letters,
/// digits, `_`, `-` and `.`.
pub fn check_tier_name(name: &str) -> Result<(), BadTierName> {
    let valid = !name.is_empty()
        && name.len() <= TIER_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(BadTierName(name.to_owned()))
    }
}

/// The group and tier of a tier's registry name (`api@pro` → `("api",
/// "pro")`): split at the last `@`, when what follows is a tier name and
/// what precedes is not empty.
///
/// ```
/// use ratewall_grammar::split_tier;
/// assert_eq!(split_tier("api@pro"), Some(("api", "pro")));
/// assert_eq!(split_tier("app::api@free"), Some(("app::api", "free")));
/// assert_eq!(split_tier("api"), None);
/// assert_eq!(split_tier("@pro"), None);
/// assert_eq!(split_tier("api@"), None);
/// ```
pub fn split_tier(name: &str) -> Option<(&str, &str)> {
    let (group, tier) = name.rsplit_once(TIER_SEPARATOR)?;
    (!group.is_empty() && check_tier_name(tier).is_ok()).then_some((group, tier))
}

/// The names a setting of `name` is looked up under: `name`, then, for a
/// tier's registry name (`api@pro`), its group's (`api`): what a tier does
/// not set for itself it takes from its group.
///
/// ```
/// use ratewall_grammar::inherited;
/// assert_eq!(inherited("api@pro").collect::<Vec<_>>(), ["api@pro", "api"]);
/// assert_eq!(inherited("api").collect::<Vec<_>>(), ["api"]);
/// ```
pub fn inherited(name: &str) -> impl Iterator<Item = &str> {
    std::iter::once(name).chain(split_tier(name).map(|(group, _)| group))
}
