//! `safemlx generate` and `safemlx chat` on SmolLM2, alone, as 2 ranks
//! under `safemlx-launch` (whose stdin reaches rank 0) and as 2 pipeline
//! stages (`--mesh pp=2`), the split runs with `--check` against one
//! process; bad options name the flag.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn model() -> PathBuf {
    std::env::var_os("SAFEMLX_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/safemlx-dist/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// `safemlx ARGS` with `input` on stdin, as `ranks` ranks.
fn safemlx(ranks: usize, args: &[&str], input: &str) -> Output {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_safemlx"));
    let mut command = if ranks == 1 {
        Command::new(&exe)
    } else {
        let mut c = Command::new(exe.with_file_name("safemlx-launch"));
        c.args(["-n", &ranks.to_string(), "--timeout", "300", "--"])
            .arg(&exe);
        c
    };
    let mut child = command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("safemlx");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn generate_and_a_two_turn_chat_answer_alone_on_two_ranks_and_two_stages() {
    let path = model();
    let path = path.to_str().unwrap();
    for (ranks, layout) in [(1, &[][..]), (2, &[]), (2, &["--mesh", "pp=2"])] {
        let mut args = vec![
            "generate",
            "--model",
            path,
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "12",
        ];
        args.extend(layout);
        if ranks > 1 {
            // The split run against one process, as the example does.
            args.push("--check");
        }
        let out = safemlx(ranks, &args, "");
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("safemlx: prompt "), "{}", text(&out));
        if ranks > 1 {
            let checker = if layout.is_empty() { 0 } else { 1 };
            for line in [
                format!("rank {checker}/2: --check against one process ("),
                "(bound 1e-4 for float32); greedy tokens agree".to_owned(),
            ] {
                assert!(text(&out).contains(&line), "no `{line}`:\n{}", text(&out));
            }
        }
        assert!(
            text(&out).contains("The capital of France is Paris."),
            "{}",
            text(&out)
        );
        assert!(
            text(&out).contains(&format!("tokens/s on {ranks} ranks")),
            "{}",
            text(&out)
        );
        if !layout.is_empty() {
            // Every rank says what it holds.
            assert!(
                text(&out).contains("rank 1/2: stage 1 of 2, layers 15..30; query heads 0..9"),
                "{}",
                text(&out)
            );
        }
        // The second question needs the first: the conversation is kept.
        let mut chat = vec!["chat", "--model", path, "--max-tokens", "16"];
        chat.extend(layout);
        let out = safemlx(
            ranks,
            &chat,
            "What is the capital of France?\nAnd of Germany?\n\n",
        );
        assert!(out.status.success(), "{}", text(&out));
        let all = text(&out);
        assert!(all.contains("> The capital of France is Paris."), "{all}");
        assert!(all.contains("> The capital of Germany is Berlin."), "{all}");
        // The second turn computes only what is new: its prompt starts
        // with the first turn's prompt, which is in the cache.
        let turns = usage_lines(&String::from_utf8_lossy(&out.stderr));
        assert_eq!(turns.len(), 2, "{all}");
        let ((first_prompt, first_cached), (second_prompt, second_cached)) = (turns[0], turns[1]);
        assert_eq!(first_cached, 0, "{all}");
        assert!(
            second_cached >= first_prompt && second_cached < second_prompt,
            "{all}"
        );
    }
}

/// (prompt tokens, cached tokens) of each of chat's
/// `[N tokens in S s; prompt P tokens, C of them from the cache]` lines.
fn usage_lines(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|line| {
            let rest = line.split("; prompt ").nth(1)?;
            let (prompt, rest) = rest.split_once(" tokens, ")?;
            let cached = rest.strip_suffix(" of them from the cache]")?;
            Some((prompt.parse().ok()?, cached.parse().ok()?))
        })
        .collect()
}

#[test]
fn bad_options_name_the_flag() {
    let out = safemlx(1, &["serve", "--max-concurrent", "0"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("invalid value '0' for '--max-concurrent <MAX_CONCURRENT>'"),
        "{}",
        text(&out)
    );
    let out = safemlx(
        1,
        &["generate", "--prompt", "x", "--model", "/no/such.gguf"],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(
            "safemlx generate: model /no/such.gguf does not exist; give --model DIR|FILE.gguf"
        ),
        "{}",
        text(&out)
    );
    // A layout that does not fit the run stops before any weight is read.
    // A layout that cannot be is a usage error: exit 2, as clap's.
    let out = safemlx(1, &["generate", "--prompt", "x", "--mesh", "pp=3"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--mesh pp=3 needs 3 ranks (3 x 1) but the run has 1; launch it with -n 3 or change the axes"),
        "{}",
        text(&out)
    );
    let out = safemlx(1, &["serve", "--port", "0", "--split", "3:1"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--split 3:1 divides the layers into pipeline stages, but the mesh pp=1,tp=1 has one stage; give --mesh pp=P too"),
        "{}",
        text(&out)
    );
    // Flags are checked before anything loads (no --model is given here).
    for (flag, message) in [
        (
            "--temperature=-1",
            "-1 is not a temperature: give 0 (greedy) or a positive number",
        ),
        ("--temperature=nan", "nan is not a temperature"),
        ("--top-p=2", "2 is not a probability above 0 and at most 1"),
        (
            "--split=-1:2",
            "--split -1:2: `-1` is not a whole number in digits 0-9",
        ),
        (
            "--mesh=pp=+1",
            "`pp=+1` needs a positive size in digits 0-9",
        ),
        ("--mesh=", "--mesh \"\" names no axis"),
        ("--mesh=pp=1,", "is an empty axis (a comma too many)"),
    ] {
        let out = safemlx(1, &["generate", "--prompt", "x", flag], "");
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", text(&out));
        assert!(text(&out).contains(message), "{flag}: {}", text(&out));
    }
}
