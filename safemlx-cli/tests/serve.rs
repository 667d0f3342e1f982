//! `safemlx serve` on SmolLM2 under `safemlx-launch` at 1 and 2 ranks,
//! driven by real clients: curl and OpenAI's Python package (its
//! environment comes from `cargo xtask test`, `SAFEMLX_OPENAI_PYTHON`).
//! Streaming and not; 16 concurrent greedy requests give the texts they
//! give one by one; a repeated prompt is found in the cache; bad requests get OpenAI's error bodies and the server
//! keeps serving; a client that leaves frees its place.

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{batched, curl, open_stream, openai, post, Server};

const QUESTIONS: [&str; 16] = [
    "The capital of France is",
    "Water boils at",
    "The largest planet in the solar system is",
    "A haiku about the sea:",
    "def fibonacci(n):",
    "The three primary colors are",
    "Once upon a time, a dragon",
    "The chemical symbol for gold is",
    "My favourite season is",
    "SELECT name FROM",
    "The speed of light is",
    "Dear diary, today",
    "Photosynthesis is the process",
    "In 1969, astronauts",
    "A good breakfast includes",
    "The opposite of hot is",
];

fn completion(question: &str) -> Value {
    json!({"prompt": question, "max_tokens": 16, "temperature": 0})
}

#[test]
fn one_and_two_ranks_answer_curl_and_the_openai_client_alone_and_batched() {
    for ranks in [1, 2] {
        // At 2 ranks without the prompt cache: the batch below then
        // computes every prompt, where at 1 rank it finds most of each in
        // the caches the requests one by one left.
        let server = Server::start(
            ranks,
            if ranks == 1 {
                &[]
            } else {
                &["--no-prompt-cache"]
            },
        );
        let port = server.port;
        let chat = json!({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "max_tokens": 24,
            "temperature": 0, "messages": [{"role": "user", "content": "What is the capital of France?"}]});
        let (status, whole) = post(port, "/v1/chat/completions", &chat);
        assert_eq!(status, 200, "{whole}");
        assert_eq!(whole["object"], "chat.completion");
        let content = whole["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(content.contains("Paris"), "{ranks} ranks: {content}");
        let usage = &whole["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(
                usage["prompt_tokens"].as_u64().unwrap()
                    + usage["completion_tokens"].as_u64().unwrap()
            )
        );
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
        // The same again: all but the prompt's last token come from the
        // cache the first left, and the text is the same.
        let (status, again) = post(port, "/v1/chat/completions", &chat);
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["choices"][0]["message"]["content"], content.as_str());
        let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
            Some(if ranks == 1 { prompt_tokens - 1 } else { 0 }),
            "{again}"
        );
        // One by one, then all 16 at once: the same greedy texts.
        let alone: Vec<String> = QUESTIONS
            .iter()
            .map(|q| {
                let (status, body) = post(port, "/v1/completions", &completion(q));
                assert_eq!(status, 200, "{body}");
                body["choices"][0]["text"].as_str().unwrap().to_owned()
            })
            .collect();
        let together = batched(port, &QUESTIONS, 16);
        assert_eq!(together, alone, "{ranks} ranks: batched and alone");
        // OpenAI's client, whole and streamed.
        let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
messages = [{"role": "user", "content": "What is the capital of France?"}]
whole = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=24, temperature=0)
parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=sys.argv[2], messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices]
models = [m.id for m in client.models.list()]
print(json.dumps({"whole": whole.choices[0].message.content, "streamed": "".join(parts),
                  "usage": whole.usage.completion_tokens, "models": models}))
"#;
        let answer = openai(script, &[&server.url(), "SmolLM2-135M-Instruct.Q4_1.gguf"]);
        assert_eq!(answer["whole"], content.as_str(), "{ranks} ranks");
        assert_eq!(answer["streamed"], content.as_str(), "{ranks} ranks");
        assert_eq!(
            answer["models"],
            json!([
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                "SmolLM2-135M-Instruct.Q4_1",
                "default_model"
            ])
        );
    }
}

#[test]
fn bad_requests_get_openai_errors_and_a_client_that_leaves_frees_its_place() {
    let server = Server::start(
        1,
        &[
            "--api-key",
            "k3y",
            "--max-concurrent",
            "1",
            "--max-queue",
            "0",
            "--max-body",
            "100000",
            "--max-cache",
            "64",
        ],
    );
    let port = server.port;
    let key = ["-H", "authorization: Bearer k3y"];
    let ask = |body: &str| {
        let (status, text) = curl(port, "POST", "/v1/chat/completions", Some(body), &key);
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(json!({"raw": text})),
        )
    };
    let hello = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#;
    let (status, body) = curl(port, "POST", "/v1/chat/completions", Some(hello), &[]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("authentication_error"), "{body}");
    let cases: [(&str, u16, &str, &str); 10] = [
        (
            "{\"messages\": [",
            400,
            "",
            "the request body is not valid JSON",
        ),
        ("{}", 400, "messages", "`messages` is missing"),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}"#,
            400,
            "temperature",
            "`temperature` is \"hot\"; give a number",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "n": 2}"#,
            400,
            "n",
            "`n` is 2",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "tools": []}"#,
            400,
            "tools",
            "`tools` is not supported",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "model": "gpt-4"}"#,
            404,
            "model",
            "the model `gpt-4` does not exist here",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9000}"#,
            400,
            "",
            "give max_tokens at most",
        ),
        (
            // 64 MiB hold 1456 positions of SmolLM2's float32 cache.
            r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3000}"#,
            400,
            "",
            "more than its --max-cache of 67108864 bytes",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 3}]}"#,
            400,
            "messages[0].content",
            "must be a string",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}], "stop": [1]}"#,
            400,
            "stop",
            "`stop` is [1]",
        ),
    ];
    for (body, want, param, message) in cases {
        let (status, got) = ask(body);
        assert_eq!(status, want, "{body}: {got}");
        let error = &got["error"];
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains(message),
            "{body}: {got}"
        );
        if !param.is_empty() {
            assert_eq!(error["param"], param, "{body}: {got}");
        }
    }
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(9000)}]});
    let (status, got) = ask(&long.to_string());
    assert_eq!(status, 400, "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the model's context is 8192"),
        "{got}"
    );
    let huge = json!({"messages": [{"role": "user", "content": "x".repeat(200_000)}]});
    assert_eq!(ask(&huge.to_string()).0, 413);

    // A long stream holds the only place: another request gets 429; when
    // its client leaves, the place is free again.
    let long_stream = json!({"messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 1000, "stream": true});
    let (mut client, lines) = open_stream(
        port,
        "/v1/chat/completions",
        &long_stream,
        &["-H", "authorization: Bearer k3y"],
    );
    let (status, got) = ask(hello);
    assert_eq!(status, 429, "{got}");
    assert_eq!(got["error"]["type"], "rate_limit_error");
    client.kill().unwrap();
    client.wait().unwrap();
    drop(lines);
    let left = Instant::now();
    loop {
        let (status, got) = ask(hello);
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{got}");
        assert!(
            left.elapsed() < Duration::from_secs(10),
            "the place was not freed in 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server
        .output()
        .contains("safemlx serve: SmolLM2-135M-Instruct.Q4_1.gguf on http://127.0.0.1:"));
}
