//! A model directory whose JSON files are not regular files: a FIFO in
//! place of `config.json`, the safetensors index, `tokenizer.json` or
//! `tokenizer_config.json` is refused at once, naming the file, instead of
//! blocking the read forever.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use safemlx_dist_tests::cpu;

/// A copy of the golden model `case` (under `tests/golden`) in which
/// `file` is a FIFO.
fn with_fifo(case: &str, file: &str) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(case);
    let tag = file.replace('.', "-");
    let dir = std::env::temp_dir().join(format!("safemlx-fifo-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::remove_file(dir.join(file)).unwrap();
    nix::unistd::mkfifo(&dir.join(file), nix::sys::stat::Mode::S_IRWXU).unwrap();
    dir
}

#[test]
fn a_fifo_in_place_of_a_json_file_is_refused_not_read() {
    let cases = [
        ("llama/llama3-kv1-sharded", "config.json", "JSON"),
        (
            "llama/llama3-kv1-sharded",
            "model.safetensors.index.json",
            "JSON",
        ),
        ("moe/mixtral", "tokenizer.json", "tokenizer JSON"),
        (
            "moe/mixtral",
            "tokenizer_config.json",
            "tokenizer_config.json",
        ),
    ];
    for (case, file, format) in cases {
        let dir = with_fifo(case, file);
        let (sent, received) = mpsc::channel();
        let path = dir.clone();
        // A thread, so that a read that blocks fails the test instead of
        // hanging it.
        std::thread::spawn(move || {
            let group = safemlx_dist::init(false, safemlx_dist::Backend::Ring).unwrap();
            let loaded = safemlx_dist::models::load(&group, &path, &cpu());
            let _ = sent.send(loaded.map(|_| ()).map_err(|e| e.to_string()));
        });
        let result = received
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{file}: loading blocked on the FIFO"));
        let error = result
            .expect_err("a FIFO is not a model file")
            .replace(&dir.display().to_string(), "DIR");
        assert_eq!(
            error,
            format!(
                "checkpoint DIR/{file}: is not a regular file (it is a FIFO); give a {format} file"
            )
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
