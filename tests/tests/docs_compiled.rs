//! The docs are compiled: every Rust block of the README and of the guide
//! (`rl-core/docs/guide/*.md`, `ratewall::guide`) is a doctest that
//! `cargo test --workspace` (and `cargo test --doc`) builds, none is
//! `ignore`d, and the README stays a front door (at most 300 lines). The
//! macro's arguments are listed once, in its own docs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The guide's pages, by file name.
fn guide_pages() -> BTreeMap<String, String> {
    let dir = root().join("rl-core/docs/guide");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

/// The info strings of the fenced code blocks rustdoc reads as Rust, with
/// their line numbers: no info string, or only rustdoc's own attributes.
fn rust_blocks(markdown: &str) -> Vec<(usize, String)> {
    const ATTRIBUTES: [&str; 7] = [
        "rust",
        "ignore",
        "no_run",
        "should_panic",
        "compile_fail",
        "test_harness",
        "standalone_crate",
    ];
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for (number, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(fence) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) else {
            continue;
        };
        match &open {
            Some(opened) if trimmed.trim_end() == opened => open = None,
            Some(_) => {}
            None => {
                let info = trimmed[fence.len()..].trim();
                let rust = info.split(',').map(str::trim).all(|token| {
                    token.is_empty()
                        || ATTRIBUTES.contains(&token)
                        || token.starts_with("edition")
                        || token.starts_with("ignore-")
                });
                if rust {
                    blocks.push((number + 1, info.to_owned()));
                }
                open = Some(fence.to_owned());
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    blocks
}

/// How `rl-core/src/guide.rs` includes each page: the file name and the
/// condition under which `ratewall` doctests it (`page!(.. = "x.md",
/// tested if COND)`), `all()` for the pages it includes unconditionally.
fn guide_inclusions() -> BTreeMap<String, String> {
    let guide = read("rl-core/src/guide.rs");
    let mut included = BTreeMap::new();
    for line in guide.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("page!(") {
            let file = rest.split('"').nth(1).expect("a page's file").to_owned();
            let condition = rest
                .split("tested if ")
                .nth(1)
                .and_then(|c| c.strip_suffix(");"))
                .expect("a page's condition")
                .to_owned();
            included.insert(file, condition);
        } else if let Some(rest) = line.strip_prefix("#![doc = include_str!(\"../docs/guide/") {
            included.insert(rest.split('"').next().unwrap().to_owned(), "all()".into());
        } else if let Some(rest) = line.strip_prefix("#[doc = include_str!(\"../docs/guide/") {
            included.insert(rest.split('"').next().unwrap().to_owned(), "all()".into());
        }
    }
    included
}

/// The workspace files `ratewall-redis` doctests (its `workspace_docs`).
fn redis_doctested() -> Vec<String> {
    read("rl-redis/src/lib.rs")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("#[doc = include_str!(\"../../"))
        .map(|rest| rest.split('"').next().unwrap().to_owned())
        .collect()
}

/// The features CI's doctest run turns on for `ratewall` (those
/// `ratewall-tests` asks for, unified over the workspace).
const TESTED_FEATURES: [&str; 7] = [
    "macros", "axum", "tower", "tonic", "config", "serde", "actix",
];

#[test]
fn every_rust_block_of_the_readme_and_the_guide_is_compiled_and_none_is_ignored() {
    let pages = guide_pages();
    assert!(pages.len() >= 15, "the guide's pages: {:?}", pages.keys());
    let included = guide_inclusions();
    let in_redis = redis_doctested();
    let mut files: Vec<(String, String)> = vec![("README.md".into(), read("README.md"))];
    files.extend(
        pages
            .iter()
            .map(|(name, text)| (format!("rl-core/docs/guide/{name}"), text.clone())),
    );
    for (path, text) in &files {
        for (line, info) in rust_blocks(text) {
            assert!(
                !info
                    .split(',')
                    .any(|t| t.trim() == "ignore" || t.trim().starts_with("ignore-")),
                "{path}:{line}: an ignored Rust block (```{info}): every example compiles"
            );
        }
        if rust_blocks(text).is_empty() {
            continue;
        }
        if path == "README.md" {
            assert!(
                in_redis.iter().any(|f| f == "README.md"),
                "the README's Rust blocks are not doctested (rl-redis/src/lib.rs)"
            );
            continue;
        }
        let name = path.rsplit('/').next().unwrap();
        let condition = included.get(name).unwrap_or_else(|| {
            panic!("{path} is not a page of ratewall::guide (rl-core/src/guide.rs)")
        });
        if condition == "any()" {
            assert!(
                in_redis
                    .iter()
                    .any(|f| f.ends_with(&format!("docs/guide/{name}"))),
                "{path} is doctested neither by ratewall nor by ratewall-redis"
            );
        } else {
            for feature in condition.split("feature = \"").skip(1) {
                let feature = feature.split('"').next().unwrap();
                assert!(
                    TESTED_FEATURES.contains(&feature),
                    "{path} is doctested only with feature `{feature}`, which CI does not turn on"
                );
            }
        }
    }
    for name in included.keys() {
        assert!(
            pages.contains_key(name),
            "guide.rs includes a missing page {name}"
        );
    }
}

#[test]
fn the_readme_is_a_front_door_of_at_most_300_lines() {
    let lines = read("README.md").lines().count();
    assert!(lines <= 300, "README.md has {lines} lines");
}

#[test]
fn the_macros_arguments_are_listed_only_in_its_own_docs() {
    let mut files: Vec<(String, String)> = vec![("README.md".into(), read("README.md"))];
    files.extend(
        guide_pages()
            .into_iter()
            .map(|(n, t)| (format!("rl-core/docs/guide/{n}"), t)),
    );
    files.push(("rl-core/src/lib.rs".into(), read("rl-core/src/lib.rs")));
    for (path, text) in files {
        let rows = text
            .lines()
            .filter(|l| {
                let l = l.trim_start_matches("//!").trim();
                l.starts_with("| `threshold` |") || l.starts_with("| `period` |")
            })
            .count();
        assert_eq!(
            rows, 0,
            "{path} lists the macro's arguments: link to `ratewall::rate_limit` instead"
        );
    }
}

#[test]
fn the_block_reader_tells_rust_from_other_languages() {
    let text = "```\nfn a() {}\n```\n```rust,no_run\nx\n```\n```text\nno\n```\n```toml\n[a]\n```\n```sh\nls\n```\n```rust,ignore\ny\n```\n";
    let blocks = rust_blocks(text);
    assert_eq!(
        blocks,
        vec![
            (1, String::new()),
            (4, "rust,no_run".into()),
            (16, "rust,ignore".into())
        ]
    );
}
