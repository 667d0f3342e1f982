//! `safemlx serve` on latent attention: the tiny DeepSeek-V3 of the
//! goldens (a query latent, YaRN, grouped routing, a shared expert) at 1
//! and 2 ranks, its latents in the server's slot cache. curl's greedy
//! completions one by one and 6 at once give the same texts, at both rank
//! counts, and OpenAI's Python client gets them too.

mod common;

use std::path::Path;

use serde_json::json;

use common::{batched, openai, post, Server, QUESTIONS};

#[test]
fn deepseek_v3_is_served_alone_batched_and_to_the_openai_client() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/moe/deepseek-v3");
    let mut by_ranks = Vec::new();
    for ranks in [1, 2] {
        let server = Server::start_model(ranks, &model, &[], 20);
        let alone: Vec<String> = QUESTIONS
            .iter()
            .map(|q| {
                let body = json!({"prompt": q, "max_tokens": 8, "temperature": 0});
                let (status, body) = post(server.port, "/v1/completions", &body);
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
                body["choices"][0]["text"].as_str().unwrap().to_owned()
            })
            .collect();
        assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
        let together = batched(server.port, &QUESTIONS, 8);
        assert_eq!(together, alone, "{ranks} ranks: batched and alone");
        let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
answer = client.completions.create(model=sys.argv[2], prompt=sys.argv[3], max_tokens=8, temperature=0)
print(json.dumps({"text": answer.choices[0].text}))
"#;
        let answer = openai(script, &[&server.url(), "deepseek-v3", QUESTIONS[0]]);
        assert_eq!(answer["text"], alone[0].as_str(), "{ranks} ranks");
        by_ranks.push(alone);
    }
    assert_eq!(by_ranks[0], by_ranks[1], "1 and 2 ranks");
}
