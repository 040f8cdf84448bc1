//! A limits file written back through serde, in the forms its reader
//! takes: each limit in [`Limit`](crate::model::limit::Limit)'s shortest
//! form, `on_error` and `shadow` where set, the lists with each identity
//! as written. What is written reads back to the same file.

use std::collections::BTreeMap;

use serde_core::ser::{Error as _, Serialize, SerializeMap, SerializeStruct, Serializer};

use super::read::policy_text;
use super::{LimitsEntry, LimitsFile};
use crate::model::lists::{ListEntry, written_form};

/// `{ rates = [...], on_error = "local:4", shadow = true }`, the last two
/// only when set.
impl Serialize for LimitsEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 1 + usize::from(self.policy.is_some()) + usize::from(self.shadow);
        let mut entry = serializer.serialize_struct("LimitsEntry", len)?;
        entry.serialize_field("rates", &self.limits)?;
        if let Some(policy) = self.policy {
            entry.serialize_field("on_error", &policy_text(policy))?;
        }
        if self.shadow {
            entry.serialize_field("shadow", &true)?;
        }
        entry.end()
    }
}

/// `{ limits = { <name> = <entry>, ... }, lists = { allow = [...],
/// deny = [...], <name> = { allow = [...], deny = [...] } } }`, each part
/// only when it holds something; reads back to the same file.
impl Serialize for LimitsFile {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = usize::from(!self.entries.is_empty()) + usize::from(!self.lists.is_empty());
        let mut file = serializer.serialize_struct("LimitsFile", len)?;
        if !self.entries.is_empty() {
            file.serialize_field("limits", &self.entries)?;
        }
        if !self.lists.is_empty() {
            file.serialize_field("lists", &Lists(&self.lists))?;
        }
        file.end()
    }
}

/// The `lists` table: the lists of every name first (plain values before
/// tables, as TOML wants them), then each name's.
struct Lists<'a>(&'a [ListEntry]);

impl Serialize for Lists<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        type ByKind = BTreeMap<&'static str, Vec<String>>;
        let mut every = ByKind::new();
        let mut per_name: BTreeMap<&str, ByKind> = BTreeMap::new();
        for entry in self.0 {
            let lists = match &entry.name {
                None => &mut every,
                Some(name) => per_name.entry(name).or_default(),
            };
            lists
                .entry(entry.kind.name())
                .or_default()
                .push(written_form(&entry.identity));
        }
        if let Some(name) = per_name.keys().find(|name| every.contains_key(*name)) {
            return Err(S::Error::custom(format!(
                "the lists of a limit named `{name}` cannot be written beside the `{name}` list of every limit"
            )));
        }
        let mut map = serializer.serialize_map(Some(every.len() + per_name.len()))?;
        for (kind, identities) in &every {
            map.serialize_entry(kind, identities)?;
        }
        for (name, lists) in &per_name {
            map.serialize_entry(name, lists)?;
        }
        map.end()
    }
}
