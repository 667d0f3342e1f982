//! The committed bindings must agree with the native declarations.
//!
//! Two independent checks:
//! - every function's pointer type equals `safemlx_sys`'s declaration of the
//!   same symbol (a compile error on any difference in parameter or return
//!   types, including the handle types);
//! - the set of `mlx_distributed_*` functions and their parameter names equal
//!   what the MLX-C headers shipped with the pinned `safemlx-sys` declare, so a
//!   function added to or changed in the headers fails until
//!   `cargo xtask bindgen` is rerun.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// `if`/`else` over the two fn items only compiles when both coerce to one
/// fn-pointer type, i.e. when the signatures are identical; at run time both
/// must also resolve to the same native symbol.
macro_rules! same_signature {
    ($($name:ident),* $(,)?) => {
        const GENERATED: &[&str] = &[$(stringify!($name)),*];
        #[test]
        fn function_pointer_types_match_safemlx_sys() {
            $(
                let ours = if std::hint::black_box(false) {
                    safemlx_sys::$name
                } else {
                    safemlx_dist_ffi::$name
                };
                let theirs = if std::hint::black_box(true) {
                    safemlx_sys::$name
                } else {
                    safemlx_dist_ffi::$name
                };
                assert_eq!(
                    ours as usize,
                    theirs as usize,
                    concat!(stringify!($name), " resolves to another symbol")
                );
            )*
        }
    };
}

same_signature!(
    mlx_distributed_group_new,
    mlx_distributed_group_free,
    mlx_distributed_init,
    mlx_distributed_group_rank,
    mlx_distributed_group_size,
    mlx_distributed_group_split,
    mlx_distributed_is_available,
    mlx_distributed_all_gather,
    mlx_distributed_all_to_all_v,
    mlx_distributed_all_max,
    mlx_distributed_all_min,
    mlx_distributed_all_sum,
    mlx_distributed_recv,
    mlx_distributed_recv_like,
    mlx_distributed_send,
    mlx_distributed_sum_scatter,
);

/// Function name -> parameter names, from C or Rust declarations: every
/// `mlx_distributed_*` name preceded by `before` and followed by `(`.
fn declarations(source: &str, before: &str) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    let mut rest = source;
    while let Some(start) = rest.find("mlx_distributed_") {
        let preceded = rest[..start].ends_with(before);
        let tail = &rest[start..];
        let name_end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..name_end];
        let after = tail[name_end..].trim_start();
        rest = &tail[name_end..];
        let Some(params) = after.strip_prefix('(').filter(|_| preceded) else {
            continue;
        };
        let Some(close) = params.find(')') else {
            continue;
        };
        let names = params[..close]
            .split(',')
            .map(|p| {
                // C: `const mlx_array x /* may be null */`; Rust: `x: mlx_array`.
                let p = p.split("/*").next().unwrap_or("").trim();
                let p = p.split(':').next().unwrap_or("").trim();
                p.rsplit(|c: char| c.is_whitespace() || c == '*')
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .filter(|p| !p.is_empty() && p != "void")
            .collect();
        found.insert(name.to_owned(), names);
    }
    found
}

fn mlx_c_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--manifest-path",
            manifest,
        ])
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata failed");
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let sys = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "safemlx-sys")
        .expect("safemlx-sys is a dependency");
    PathBuf::from(sys["manifest_path"].as_str().expect("manifest path"))
        .parent()
        .expect("package dir")
        .join("src/mlx-c/mlx/c")
}

#[test]
fn committed_bindings_declare_exactly_the_header_functions() {
    let dir = mlx_c_dir();
    let mut from_headers = BTreeMap::new();
    for header in ["distributed_group.h", "distributed.h"] {
        let text = std::fs::read_to_string(dir.join(header)).expect("MLX-C header is readable");
        // Skip the include guard and comments: declarations start at `mlx_distributed_`.
        from_headers.extend(declarations(&text, ""));
    }
    // `mlx_distributed_group` and `mlx_distributed_group_` are types, not calls.
    from_headers.retain(|name, _| !name.ends_with("group") && !name.ends_with("group_"));
    let bindings = include_str!("../src/bindings.rs");
    let generated = declarations(bindings, "pub fn ");
    assert_eq!(
        generated, from_headers,
        "ffi/src/bindings.rs is out of date: run `cargo xtask bindgen`"
    );
    let listed: Vec<&str> = GENERATED.to_vec();
    let mut names: Vec<&str> = generated.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort_unstable();
    assert_eq!(
        names, listed_sorted,
        "the signature check must cover every generated function"
    );
}
