//! The quick start is written once and shown three times: the README's first
//! Rust block, `ratewall`'s crate documentation (a doctest) and
//! `rl-core/examples/quickstart.rs` (run by CI) must be the same code.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the first fenced block opened by `fence` in `lines`.
fn first_block<'a>(lines: impl IntoIterator<Item = &'a str>, fence: &str) -> Vec<String> {
    let mut lines = lines.into_iter().skip_while(|l| l.trim_end() != fence);
    assert!(lines.next().is_some(), "no {fence} block");
    let block: Vec<String> = lines
        .take_while(|l| l.trim_end() != "```")
        .map(|l| l.trim_end().to_owned())
        .collect();
    assert!(!block.is_empty(), "an empty {fence} block");
    block
}

#[test]
fn the_readme_the_crate_docs_and_the_example_hold_the_same_quick_start() {
    let example = read("rl-core/examples/quickstart.rs");
    // The example without its leading `//!` comment.
    let example: Vec<String> = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| l.trim_end().to_owned())
        .collect();

    let readme = read("README.md");
    let readme = first_block(readme.lines(), "```rust");

    let lib = read("rl-core/src/lib.rs");
    let docs: Vec<&str> = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            l.strip_prefix("//! ")
                .or(l.strip_prefix("//!"))
                .unwrap_or(l)
        })
        .collect();
    let docs = first_block(docs, "```");

    assert_eq!(
        readme, example,
        "README.md's first rust block vs rl-core/examples/quickstart.rs"
    );
    assert_eq!(
        docs, example,
        "rl-core/src/lib.rs's first doc example vs rl-core/examples/quickstart.rs"
    );
}
