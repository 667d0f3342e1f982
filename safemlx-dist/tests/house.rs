//! The house rules, checked on the crate's source: no two modules refer to
//! each other (directly or through a loop), the crate's own items are
//! reached through their defining modules rather than the crate root's
//! re-exports, and no file of the workspace (code, scripts, the book) is
//! over 500 lines.
//!
//! A module is a file. A reference is a `crate::a::b` or `super::a` path
//! in code or in a doc link, resolved to the deepest module it names; a
//! module's references to its own ancestors or descendants (a `mod.rs` and
//! the files it declares) are its facade, not an arrow between modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files still over the limit (paths from the workspace root), with the
/// change that shrinks them. The list may only get shorter (it is empty:
/// `models/llama.rs` left it when its float/quantized embedding dispatch
/// went; the tests, `peers.py` and the book's long chapters when the rule
/// came to cover the whole workspace).
const OVER_500_LINES: &[(&str, &str)] = &[];

fn sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("readable source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            (rel, text)
        })
        .collect()
}

/// `nn/moe/mod.rs` -> `nn::moe`, `lib.rs` -> ``.
fn module_of(file: &str) -> String {
    let stem = file.trim_end_matches(".rs");
    let parts: Vec<&str> = stem.split('/').collect();
    let parts = match parts.as_slice() {
        ["lib"] => &parts[..0],
        [.., "mod"] => &parts[..parts.len() - 1],
        _ => &parts[..],
    };
    parts.join("::")
}

/// The text outside `#[cfg(test)] mod tests { ... }` at the end of a file.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

/// Every path after `prefix` in `text`: `crate::a::b::{c, d}` gives `a::b`.
fn paths_after<'t>(text: &'t str, prefix: &str) -> Vec<Vec<&'t str>> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if len == 0 {
                break;
            }
            segments.push(&tail[..len]);
            tail = &tail[len..];
            match tail.strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        found.push(segments);
    }
    found
}

fn is_ancestor(a: &str, b: &str) -> bool {
    a.is_empty() || b.starts_with(&format!("{a}::"))
}

/// The arrows between modules (see the file's documentation).
fn arrows(files: &BTreeMap<String, String>) -> BTreeSet<(String, String)> {
    let modules: BTreeSet<String> = files.keys().map(|f| module_of(f)).collect();
    let deepest = |segments: &[&str]| -> Option<String> {
        (1..=segments.len())
            .rev()
            .map(|k| segments[..k].join("::"))
            .find(|m| modules.contains(m))
    };
    let mut arrows = BTreeSet::new();
    for (file, text) in files {
        let from = module_of(file);
        let text = without_tests(text);
        let parent: Vec<&str> = from.split("::").filter(|s| !s.is_empty()).collect();
        let mut targets: Vec<String> = paths_after(text, "crate::")
            .iter()
            .filter_map(|p| deepest(p))
            .collect();
        for p in paths_after(text, "super::") {
            // `super` of `a::b` (a file `a/b.rs`) is `a`.
            let mut base: Vec<&str> = parent[..parent.len().saturating_sub(1)].to_vec();
            let mut p = p.as_slice();
            while let Some((&"super", tail)) = p.split_first() {
                base.pop();
                p = tail;
            }
            base.extend_from_slice(p);
            targets.extend(deepest(&base));
        }
        for to in targets {
            if to != from && !is_ancestor(&to, &from) && !is_ancestor(&from, &to) {
                arrows.insert((from.clone(), to));
            }
        }
    }
    arrows
}

/// The modules on some loop of arrows, each loop as one sorted list.
fn loops(arrows: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in arrows {
        next.entry(a).or_default().push(b);
    }
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(m) = stack.pop() {
            for &n in next.get(m).map_or(&[][..], |v| v.as_slice()) {
                if n == to {
                    return true;
                }
                if seen.insert(n) {
                    stack.push(n);
                }
            }
        }
        false
    };
    let mut found: Vec<Vec<String>> = Vec::new();
    for m in next.keys() {
        if !reaches(m, m) || found.iter().any(|l| l.iter().any(|x| x == m)) {
            continue;
        }
        let mut members: Vec<String> = next
            .keys()
            .filter(|n| reaches(m, n) && reaches(n, m))
            .map(|n| n.to_string())
            .collect();
        members.sort();
        found.push(members);
    }
    found
}

#[test]
fn no_two_modules_refer_to_each_other() {
    let files = sources();
    let arrows = arrows(&files);
    assert!(
        arrows.len() > 50,
        "the check sees the crate's arrows: {}",
        arrows.len()
    );
    let found = loops(&arrows);
    let explain: Vec<String> = found
        .iter()
        .map(|members| {
            let inside: Vec<String> = arrows
                .iter()
                .filter(|(a, b)| members.contains(a) && members.contains(b))
                .map(|(a, b)| format!("{a} -> {b}"))
                .collect();
            format!("[{}]: {}", members.join(", "), inside.join(", "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "modules on a loop: {}",
        explain.join("; ")
    );
}

#[test]
fn a_loop_is_found_when_there_is_one() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a.rs", "use crate::b::X;"),
        ("b.rs", "fn f() { crate::c::g() }"),
        ("c/mod.rs", "/// [`x`](crate::a::X)\nmod d;"),
        ("c/d.rs", "use super::super::b; use super::Y;"),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_owned(), t.to_owned()))
    .collect();
    let arrows = arrows(&files);
    assert!(arrows.contains(&("c::d".to_owned(), "b".to_owned())));
    assert!(!arrows.iter().any(|(a, b)| a == "c::d" && b == "c"));
    assert_eq!(loops(&arrows), [vec!["a", "b", "c"]]);
}

#[test]
fn the_crates_items_are_reached_through_their_modules() {
    let files = sources();
    let modules: BTreeSet<String> = files.keys().map(|f| module_of(f)).collect();
    let mut through_root = Vec::new();
    for (file, text) in &files {
        for path in paths_after(without_tests(text), "crate::") {
            let first = path.first().copied().unwrap_or("");
            if !first.is_empty() && !modules.contains(first) {
                through_root.push(format!("{file}: crate::{}", path.join("::")));
            }
        }
        for line in text.lines().filter(|l| l.contains("crate::{")) {
            let inside = line.split("crate::{").nth(1).unwrap_or("");
            let inside = inside.split('}').next().unwrap_or("");
            let items = inside
                .split(',')
                .map(|e| e.trim())
                .filter(|e| !e.is_empty());
            for item in items {
                let first = item.split("::").next().unwrap_or("");
                if !modules.contains(first) {
                    through_root.push(format!("{file}: crate::{{{item}}}"));
                }
            }
        }
    }
    assert!(
        through_root.is_empty(),
        "items reached through the crate root: {through_root:?}"
    );
}

/// Every file of the workspace we write (Rust, Python, Markdown, TOML,
/// shell), relative to the workspace root, with its text; build outputs,
/// the rendered book and Python's caches left out.
fn workspace_files() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("readable workspace directory") {
            let path = entry.expect("entry").path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                let skipped = ["target", "book/book"].contains(&rel.as_str())
                    || name.starts_with('.') && name != ".ci"
                    || name == "__pycache__";
                if !skipped {
                    walk(&path, root, out);
                }
            } else if path
                .extension()
                .is_some_and(|e| ["rs", "py", "md", "toml", "sh"].contains(&&*e.to_string_lossy()))
                || rel == ".ci/run"
            {
                out.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = BTreeMap::new();
    walk(root, root, &mut files);
    files
}

#[test]
fn no_file_is_over_500_lines() {
    let files = workspace_files();
    for file in [
        "safemlx-dist/src/lib.rs",
        "book/src/SUMMARY.md",
        "xtask/bench/peers.py",
    ] {
        assert!(files.contains_key(file), "{file} is checked");
    }
    let over: Vec<String> = files
        .iter()
        .filter(|(_, text)| text.lines().count() > 500)
        .map(|(file, text)| format!("{file} ({} lines)", text.lines().count()))
        .collect();
    let allowed: Vec<String> = OVER_500_LINES.iter().map(|(f, _)| f.to_string()).collect();
    let unexpected: Vec<&String> = over
        .iter()
        .filter(|o| !allowed.iter().any(|a| o.starts_with(&format!("{a} "))))
        .collect();
    assert!(
        unexpected.is_empty(),
        "files over 500 lines: {unexpected:?}"
    );
    // An exception that no longer applies leaves the list.
    for (file, why) in OVER_500_LINES {
        assert!(
            over.iter().any(|o| o.starts_with(&format!("{file} "))),
            "{file} is no longer over 500 lines ({why}): remove it from OVER_500_LINES"
        );
    }
}
