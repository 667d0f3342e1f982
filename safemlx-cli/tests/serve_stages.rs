//! `safemlx serve` through pipeline stages (`--mesh pp=2` on 2 ranks,
//! `--mesh pp=2,tp=2` on 4) on SmolLM2: each rank says its stage and
//! layers; curl's requests one by one (2 ranks) and 6 at once, and
//! OpenAI's Python client, get the texts one rank gives.

mod common;

use serde_json::json;

use common::{batched, openai, post, Server, QUESTIONS};

const CHAT: &str = "What is the capital of France?";

/// The greedy texts of every question, one request at a time.
fn alone(port: u16) -> Vec<String> {
    QUESTIONS
        .iter()
        .map(|q| {
            let body = json!({"prompt": q, "max_tokens": 12, "temperature": 0});
            let (status, body) = post(port, "/v1/completions", &body);
            assert_eq!(status, 200, "{body}");
            body["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// OpenAI's client: the chat answer, whole and streamed.
fn openai_chat(server: &Server) -> (String, String) {
    let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
messages = [{"role": "user", "content": sys.argv[2]}]
whole = client.chat.completions.create(model=sys.argv[3], messages=messages, max_tokens=16, temperature=0)
parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=sys.argv[3], messages=messages, max_tokens=16, temperature=0, stream=True) if c.choices]
print(json.dumps([whole.choices[0].message.content, "".join(parts)]))
"#;
    let answer = openai(
        script,
        &[&server.url(), CHAT, "SmolLM2-135M-Instruct.Q4_1.gguf"],
    );
    (
        answer[0].as_str().unwrap().to_owned(),
        answer[1].as_str().unwrap().to_owned(),
    )
}

#[test]
fn two_stages_and_two_by_two_serve_the_texts_of_one_rank() {
    let one = Server::start(1, &[]);
    let reference = alone(one.port);
    let chat = json!({"max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": CHAT}]});
    let (status, answer) = post(one.port, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{answer}");
    let answer = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(answer.contains("Paris"), "{answer}");
    drop(one);
    for (ranks, mesh, axes, holds) in [
        (
            2,
            "pp=2",
            "pp=2,tp=1",
            "rank 1/2: stage 1 of 2, layers 15..30; query heads 0..9, KV heads 0..3",
        ),
        (
            4,
            "pp=2,tp=2",
            "pp=2,tp=2",
            "rank 2/4: stage 1 of 2, layers 15..30; query heads 4..9 (head 4 shared by rows), KV heads 1..3",
        ),
    ] {
        let server = Server::start(ranks, &["--mesh", mesh]);
        // The launcher relays each rank's lines as they come (rank 0's
        // last one after /health answers).
        let serving = format!("({ranks} ranks, {axes};");
        let started = std::time::Instant::now();
        let seen = |log: &str| log.contains(holds) && log.contains(&serving);
        while !seen(&server.output()) && started.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let log = server.output();
        assert!(seen(&log), "{mesh}: {log}");
        if ranks == 2 {
            assert_eq!(alone(server.port), reference, "{mesh}: one by one");
        }
        // (At 4 ranks on 2 cores, MLX's ring is oversubscribed: one batch.)
        assert_eq!(
            batched(server.port, &QUESTIONS, 12),
            reference,
            "{mesh}: batched"
        );
        let (whole, streamed) = openai_chat(&server);
        assert_eq!(whole, answer, "{mesh}");
        assert_eq!(streamed, answer, "{mesh}");
    }
}
