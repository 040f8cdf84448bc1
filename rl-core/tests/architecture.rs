//! The crate's structure, held by a test: imports point down.
//!
//! `rl-core/src` is built in floors, each allowed to name only its own
//! floor and the ones below it:
//!
//! ```text
//! face        lib.rs, private/            the public surface, the macro's glue
//! wire        http.rs, tower/, actix.rs, reqwest/, refusal.rs, config.rs
//! limiter     limiter/                    the façade: resolve, target, run, permit
//! layer       layer/                      one concern each around the store
//! store       store/                      targets, memory tables, the Backend trait
//! algorithm   algorithm/                  pure State impls
//! model       model/                      limits, keys, decisions, errors, settings
//! ```
//!
//! and the integrations (wire) speak only through the limiter: they never
//! name a layer or a store. No file below the face names a type through the
//! crate root (`crate::Limiter`): that would hide an upward arrow behind a
//! re-export. The test reads the code (comments and doc comments are not
//! code; unit-test modules may reach anywhere), so a `use` that points up
//! fails it with the file, the line and the rule.
//!
//! It also holds the public surface `lib.rs` chooses: at most 20 items at
//! the crate root (what a newcomer uses first; modules and `#[doc(hidden)]`
//! glue not counted), the rest in modules named by use, each name at one
//! public path.

use std::fs;
use std::path::{Path, PathBuf};

/// A floor of the crate, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Floor {
    Model,
    Algorithm,
    Store,
    Layer,
    Limiter,
    Wire,
    Face,
}

/// The floor of the top-level module `name` (`crate::name`).
fn floor_of_module(name: &str) -> Option<Floor> {
    Some(match name {
        "model" => Floor::Model,
        "algorithm" => Floor::Algorithm,
        "store" => Floor::Store,
        "layer" => Floor::Layer,
        "limiter" => Floor::Limiter,
        "http" | "tower" | "actix" | "reqwest" | "refusal" | "config" => Floor::Wire,
        "__private" | "private" => Floor::Face,
        // Test support, compiled only into the unit tests.
        "testing" => return None,
        _ => return None,
    })
}

/// The floor of a source file, by its path under `src/`.
fn floor_of_file(relative: &Path) -> Floor {
    let first = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("");
    let module = first.strip_suffix(".rs").unwrap_or(first);
    match module {
        "lib" => Floor::Face,
        other => floor_of_module(other).unwrap_or(Floor::Face),
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code lines of a file: without comments, and without its unit-test
/// module (everything from `#[cfg(test)]` followed by `mod tests`).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            // A `//` inside a string literal (a URL) is rare in this crate;
            // cutting there only hides text, never adds a path.
            Some(at) => &line[..at],
            None => line,
        };
        out.push((i + 1, code.to_owned()));
    }
    out
}

/// Each top-level module a line names through `crate::`, or through the
/// crate root (`None` for a root re-export such as `crate::Limiter`).
fn named_modules(code: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `$crate::`, `ratewall::crate::` and the like are other crates'.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '{')
            .collect();
        if name.starts_with('{') {
            // `use crate::{a, b}`: every name of the group.
            let end = rest.find('}').unwrap_or(rest.len());
            for item in rest[1..end].split(',') {
                let item = item.trim().split("::").next().unwrap_or("").to_owned();
                out.push(module_or_root(&item));
            }
        } else {
            out.push(module_or_root(&name));
        }
    }
    out
}

fn module_or_root(name: &str) -> Option<String> {
    let lower = name.chars().next().is_some_and(|c| c.is_lowercase());
    lower.then(|| name.to_owned())
}

#[test]
fn imports_point_down_and_integrations_speak_only_through_the_limiter() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut broken = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        if relative.file_name().is_some_and(|n| n == "tests.rs")
            || relative.components().any(|c| c.as_os_str() == "tests")
            || relative == Path::new("testing.rs")
        {
            continue;
        }
        let floor = floor_of_file(relative);
        let text = fs::read_to_string(file).expect("read");
        for (line, code) in code_lines(&text) {
            for named in named_modules(&code) {
                let shown = format!("{}:{line}: {}", relative.display(), code.trim());
                match named {
                    None if floor != Floor::Face => broken.push(format!(
                        "{shown}\n    names a type through the crate root: name its module instead"
                    )),
                    None => {}
                    Some(module) => {
                        let Some(target) = floor_of_module(&module) else {
                            continue;
                        };
                        if target > floor {
                            broken.push(format!(
                                "{shown}\n    {floor:?} names {module} ({target:?}), a floor above it"
                            ));
                        }
                        if floor == Floor::Wire && matches!(target, Floor::Layer | Floor::Store) {
                            broken.push(format!(
                                "{shown}\n    an integration names {module} ({target:?}): it speaks only through the limiter"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} import(s) point the wrong way:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_an_upward_import_a_root_path_and_a_grouped_use() {
    assert_eq!(
        named_modules("use crate::limiter::registry::Registry;"),
        [Some("limiter".to_owned())]
    );
    assert_eq!(named_modules("fn f(x: crate::Limiter) {}"), [None]);
    assert_eq!(
        named_modules("use crate::{model::key::Key, store::Store};"),
        [Some("model".to_owned()), Some("store".to_owned())]
    );
    assert!(named_modules("$crate::x; ratewall::y").is_empty());
    let lines = code_lines(
        "use a;\n/// crate::limiter\n// crate::x\nuse b; // crate::y\n#[cfg(test)]\nmod tests {\nuse crate::z;\n}",
    );
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(floor_of_file(Path::new("layer/lease.rs")) < floor_of_module("limiter").unwrap());
}

/// The `_ =>` arms of every `match` on an algorithm in `text`, as
/// `(line, code)`: such an arm would let a new algorithm compile and
/// silently take another's path.
fn wildcard_algorithm_arms(text: &str) -> Vec<(usize, String)> {
    let lines = code_lines(text);
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let (_, code) = &lines[i];
        let scrutinee = code
            .find("match ")
            .map(|at| &code[at + "match ".len()..])
            .map(|rest| rest.split('{').next().unwrap_or(rest));
        if !scrutinee.is_some_and(|s| s.to_lowercase().contains("algorithm")) {
            i += 1;
            continue;
        }
        // Inside the match: arms sit one brace deeper than its opening line.
        let open = code.matches('{').count() as i64 - code.matches('}').count() as i64;
        let mut depth = open;
        let mut j = i + 1;
        while j < lines.len() && depth > 0 {
            let (line, arm) = &lines[j];
            if depth == 1 && arm.trim_start().starts_with("_ =>") {
                found.push((*line, arm.trim().to_owned()));
            }
            depth += arm.matches('{').count() as i64 - arm.matches('}').count() as i64;
            j += 1;
        }
        i += 1;
    }
    found
}

#[test]
fn every_dispatch_on_an_algorithm_names_every_algorithm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["rl-core", "rl-redis", "rl-macros", "rl-grammar"] {
        sources(&root.join(krate).join("src"), &mut files);
    }
    files.sort();
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        for (line, arm) in wildcard_algorithm_arms(&text) {
            broken.push(format!("{}:{line}: {arm}", file.display()));
        }
    }
    assert!(
        broken.is_empty(),
        "a `match` on an algorithm has a wildcard arm (name each algorithm instead):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_dispatch_checker_sees_a_wildcard_arm_and_only_at_the_match_s_own_depth() {
    let wildcard = "match limit.algorithm() {\n    Algorithm::Gcra => 1,\n    _ => 2,\n}";
    assert_eq!(wildcard_algorithm_arms(wildcard).len(), 1);
    let nested = "match algorithm {\n    Algorithm::Gcra => match x {\n        _ => 1,\n    },\n    Algorithm::SlidingLog => 2,\n}";
    assert!(wildcard_algorithm_arms(nested).is_empty());
    let other = "match op {\n    _ => 1,\n}";
    assert!(wildcard_algorithm_arms(other).is_empty());
}

/// The longest a source file of `rl-core/src` may be: a file that grows
/// past it holds more than one thing (split it by what each part holds).
const MAX_LINES: usize = 800;

/// The most public methods `Limiter` itself may have: calling, and handles
/// for raw requests (`requests()`) and settings (`settings()`).
const MAX_LIMITER_METHODS: usize = 20;

#[test]
fn no_source_file_is_longer_than_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "the sources were found: {files:?}");
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = fs::read_to_string(file).expect("read").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

#[test]
fn the_limiter_keeps_a_small_facade() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut methods = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("impl Limiter {") {
                inside = true;
            } else if inside && line == "}" {
                inside = false;
            } else if inside {
                let signature = line.trim_start_matches("    ");
                if line.starts_with("    pub fn ") || line.starts_with("    pub async fn ") {
                    let name = signature
                        .trim_start_matches("pub async fn ")
                        .trim_start_matches("pub fn ");
                    let name = name.split(['(', '<']).next().unwrap_or(name);
                    methods.push(name.to_owned());
                }
            }
        }
    }
    assert!(
        methods.contains(&"call".to_owned()) && methods.contains(&"settings".to_owned()),
        "the checker sees the façade: {methods:?}"
    );
    assert!(
        methods.len() <= MAX_LIMITER_METHODS,
        "Limiter has {} public methods (at most {MAX_LIMITER_METHODS}): {methods:?}",
        methods.len()
    );
}

/// The most public items the crate root may hold besides modules: what a
/// newcomer uses first. The rest lives in modules named by use.
const MAX_ROOT_ITEMS: usize = 20;

/// `text` without its comments (doc comments included): `//` to the end of
/// the line, outside string literals.
fn without_comments(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut in_string = false;
        let mut cut = line.len();
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if in_string => i += 1,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    cut = i;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// The index just past the bracket that closes the one at `open`.
fn closing(text: &str, open: usize) -> usize {
    let (up, down) = match text.as_bytes()[open] {
        b'[' => (b'[', b']'),
        b'(' => (b'(', b')'),
        _ => (b'{', b'}'),
    };
    let mut depth = 0;
    for (i, b) in text.bytes().enumerate().skip(open) {
        if b == up {
            depth += 1;
        } else if b == down {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
    }
    text.len()
}

/// One item of a module's code: its attributes (joined) and the item
/// itself, up to its `;` or through its `{ .. }` block.
#[derive(Debug)]
struct SourceItem {
    attributes: String,
    item: String,
}

/// The items of `code` (comments already removed), at its own depth.
fn source_items(code: &str) -> Vec<SourceItem> {
    let mut items = Vec::new();
    let mut rest = code.trim_start();
    let mut attributes = String::new();
    while !rest.is_empty() {
        if rest.starts_with("#![") || rest.starts_with("#[") {
            let open = rest.find('[').expect("an attribute's bracket");
            let end = closing(rest, open);
            attributes.push_str(&rest[..end]);
            rest = rest[end..].trim_start();
            continue;
        }
        // The item ends at the first `;` or at the end of its first block.
        let semicolon = rest.find(';').unwrap_or(rest.len());
        let end = match rest.find('{') {
            Some(open) if open < semicolon => {
                let end = closing(rest, open);
                // `pub use a::{b, c};`: the block is a use tree, the `;` follows.
                if rest[end..].trim_start().starts_with(';') {
                    end + rest[end..].find(';').expect("the `;`") + 1
                } else {
                    end
                }
            }
            _ => (semicolon + 1).min(rest.len()),
        };
        items.push(SourceItem {
            attributes: std::mem::take(&mut attributes),
            item: rest[..end].trim().to_owned(),
        });
        rest = rest[end..].trim_start();
    }
    items
}

/// The names a use tree brings in: `a::{b, c::d as e}` gives `b` and `e`;
/// a glob gives `*`.
fn use_leaves(tree: &str) -> Vec<String> {
    let tree = tree.trim().trim_end_matches(';').trim();
    if tree.ends_with('}') {
        let open = tree.find('{').expect("a use group");
        let inner = &tree[open + 1..tree.len() - 1];
        let mut leaves = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    leaves.extend(use_leaves(&inner[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
        leaves.extend(use_leaves(&inner[start..]));
        return leaves;
    }
    if tree.is_empty() {
        return Vec::new();
    }
    let name = match tree.split_once(" as ") {
        Some((_, alias)) => alias.trim(),
        None => tree.rsplit("::").next().unwrap_or(tree).trim(),
    };
    vec![name.to_owned()]
}

/// What a public item names: `Some(names)` for a public item that is not a
/// module (a `pub use` may name several), `None` otherwise.
fn public_names(item: &str) -> Option<Vec<String>> {
    let rest = item.strip_prefix("pub ")?;
    if let Some(tree) = rest.strip_prefix("use ") {
        return Some(use_leaves(tree));
    }
    // `pub const fn f`, `pub async fn f`, `pub unsafe trait T`: the kind of
    // item is the first of these words, its name the word after it; else
    // `pub const N: ..` or `pub static N: ..`.
    let words: Vec<&str> = rest.split_whitespace().take(4).collect();
    const KINDS: [&str; 7] = ["fn", "struct", "enum", "trait", "type", "union", "mod"];
    let at = words
        .iter()
        .position(|w| KINDS.contains(w))
        .or_else(|| matches!(words.first(), Some(&"const" | &"static")).then_some(0))?;
    if words[at] == "mod" {
        return None;
    }
    let name: String = words
        .get(at + 1)?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    Some(vec![name])
}

/// The public items of a crate root that are not modules and not
/// `#[doc(hidden)]`, by the name each brings in.
fn root_items(lib: &str) -> Vec<String> {
    source_items(&without_comments(lib))
        .iter()
        .filter(|i| !i.attributes.replace(' ', "").contains("doc(hidden)"))
        .filter_map(|i| {
            // An exported `macro_rules!` is public without `pub`.
            match i.item.strip_prefix("macro_rules!") {
                Some(rest) if i.attributes.contains("macro_export") => {
                    Some(vec![rest.split(['{', '(', '[']).next()?.trim().to_owned()])
                }
                _ => public_names(&i.item),
            }
        })
        .flatten()
        .collect()
}

/// Every name re-exported by a public module declared inline in the crate
/// root (`pub mod x { pub use ..; }`), as `x::Name`.
fn module_items(lib: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in source_items(&without_comments(lib)) {
        let Some(rest) = item.item.strip_prefix("pub mod ") else {
            continue;
        };
        let Some(open) = rest.find('{') else { continue };
        let module = rest[..open].trim();
        let body = &rest[open + 1..rest.len() - 1];
        for inner in source_items(body) {
            for name in public_names(&inner.item).unwrap_or_default() {
                out.push(format!("{module}::{name}"));
            }
        }
    }
    out
}

#[test]
fn the_crate_root_holds_at_most_20_items_and_each_name_one_path() {
    let lib = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read lib.rs");
    let root = root_items(&lib);
    // The checker sees the root: these are there, modules and glue are not.
    for expected in ["Limiter", "Limit", "Decision", "Rejection", "rate_limit"] {
        assert!(
            root.iter().any(|n| n == expected),
            "{expected} not seen: {root:?}"
        );
    }
    assert!(
        !root.iter().any(|n| n == "*"),
        "a glob re-export at the root: {root:?}"
    );
    assert!(
        root.len() <= MAX_ROOT_ITEMS,
        "the crate root holds {} public items (at most {MAX_ROOT_ITEMS}); move the rest into a module named by use:\n{}",
        root.len(),
        root.join("\n")
    );
    let modules = module_items(&lib);
    assert!(
        modules.iter().any(|n| n == "backend::MemoryBackend"),
        "the checker sees the modules: {modules:?}"
    );
    let mut seen = std::collections::BTreeMap::new();
    let mut twice = Vec::new();
    for path in root.iter().cloned().chain(modules.iter().cloned()) {
        let name = path.rsplit("::").next().unwrap_or(&path).to_owned();
        if let Some(first) = seen.insert(name, path.clone()) {
            twice.push(format!("{first} and {path}"));
        }
    }
    assert!(
        twice.is_empty(),
        "names reachable at two public paths: {twice:?}"
    );
}

#[test]
fn the_root_checker_counts_re_exports_and_items_and_skips_modules_and_hidden_ones() {
    let lib = r#"
//! Docs naming `pub use fake::Thing;`.
#![forbid(unsafe_code)]
mod private;
pub mod open;
#[doc(hidden)]
pub mod __glue;
#[doc(hidden)]
pub use private::Hidden;
pub use private::{A, b::{C, D as E}};
// pub use private::Commented;
pub use private::F;
#[cfg(feature = "x")]
pub use other::g;
pub fn h() {}
pub const fn i() {}
pub const J: u8 = 1;
pub(crate) use private::K;
pub struct L { field: u8 }
#[macro_export]
macro_rules! m { () => {}; }
macro_rules! local { () => {}; }
pub mod inline {
    //! Inside.
    pub use crate::private::{M, N};
}
"#;
    assert_eq!(
        root_items(lib),
        ["A", "C", "E", "F", "g", "h", "i", "J", "L", "m"]
    );
    assert_eq!(module_items(lib), ["inline::M", "inline::N"]);
}
