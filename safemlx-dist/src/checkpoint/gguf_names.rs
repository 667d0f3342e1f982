//! llama.cpp's tensor names (`blk.0.attn_q.weight`) of the Hugging Face
//! names a model reads (`model.layers.0.self_attn.q_proj.weight`): one
//! table for every GGUF architecture read here, as llama.cpp's converter
//! names them nearly alike across architectures (an architecture's own
//! names are its family's renames, see
//! [`GgufWeights::renamed`](super::GgufWeights::renamed)).

/// llama.cpp's name of the Hugging Face tensor `name`, as its converter
/// writes it for every architecture read here.
pub(super) fn gguf_name(name: &str) -> Option<String> {
    const TOP: [(&str, &str); 3] = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    const LAYER: [(&str, &str); 36] = [
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        // A mixture of experts: the router, the stacked experts (read
        // as mlx-lm's `switch_mlp`), the shared expert and its gate.
        ("mlp.gate", "ffn_gate_inp"),
        ("mlp.switch_mlp.gate_proj", "ffn_gate_exps"),
        ("mlp.switch_mlp.up_proj", "ffn_up_exps"),
        ("mlp.switch_mlp.down_proj", "ffn_down_exps"),
        ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
        ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
        ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
        ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
        // DeepSeek's shared experts, its router's correction bias and
        // latent attention (`kv_b_proj` split per head as llama.cpp's
        // converter writes it: `attn_k_b` [H, r, nope] is mlx-lm's
        // `embed_q`, `attn_v_b` [H, v, r] its `unembed_out`).
        ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"),
        ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
        ("mlp.shared_experts.down_proj", "ffn_down_shexp"),
        ("self_attn.q_a_proj", "attn_q_a"),
        ("self_attn.q_a_layernorm", "attn_q_a_norm"),
        ("self_attn.q_b_proj", "attn_q_b"),
        ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
        ("self_attn.kv_a_layernorm", "attn_kv_a_norm"),
        ("self_attn.kv_b_proj", "attn_kv_b"),
        ("self_attn.embed_q", "attn_k_b"),
        ("self_attn.unembed_out", "attn_v_b"),
        // Phi-3's fused q/k/v and gate/up (gate rows first).
        ("self_attn.qkv_proj", "attn_qkv"),
        ("mlp.gate_up_proj", "ffn_up"),
        // gpt-oss's router and its experts under mlx-lm's names (with
        // biases: `ffn_gate_exps.bias`).
        ("mlp.router", "ffn_gate_inp"),
        ("mlp.experts.gate_proj", "ffn_gate_exps"),
        ("mlp.experts.up_proj", "ffn_up_exps"),
        ("mlp.experts.down_proj", "ffn_down_exps"),
    ];
    if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == name) {
        return Some((*g).to_owned());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    if rest == "mlp.gate.e_score_correction_bias" {
        return Some(format!("blk.{layer}.exp_probs_b.bias"));
    }
    if rest == "self_attn.sinks" {
        return Some(format!("blk.{layer}.attn_sinks.weight"));
    }
    let (module, suffix) = rest.rsplit_once('.')?;
    let (_, g) = LAYER.iter().find(|(h, _)| *h == module)?;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn hugging_face_names_map_to_llama_cpp_names() {
        let g = gguf_name;
        assert_eq!(
            g("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            g("model.layers.12.self_attn.o_proj.weight").as_deref(),
            Some("blk.12.attn_output.weight")
        );
        assert_eq!(
            g("model.layers.0.self_attn.q_proj.bias").as_deref(),
            Some("blk.0.attn_q.bias")
        );
        assert_eq!(
            g("model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.ffn_norm.weight")
        );
        assert_eq!(
            g("model.layers.2.mlp.switch_mlp.down_proj.weight").as_deref(),
            Some("blk.2.ffn_down_exps.weight")
        );
        assert_eq!(
            g("model.layers.1.mlp.gate.e_score_correction_bias").as_deref(),
            Some("blk.1.exp_probs_b.bias")
        );
        assert_eq!(
            g("model.layers.0.self_attn.embed_q.weight").as_deref(),
            Some("blk.0.attn_k_b.weight")
        );
        assert_eq!(g("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(g("something.else"), None);
    }
}
