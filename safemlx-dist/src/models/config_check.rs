//! A configuration's values, checked where it is read, from a Hugging Face
//! `config.json` and GGUF metadata alike: a value that would otherwise
//! surface only as "the logits hold no finite value" is named here, with
//! the key it came from.

use super::config::{LlamaConfig, RopeScaling};
use crate::error::{Error, Result};

/// The largest RMSNorm epsilon accepted: real models use 1e-6 to 1e-5.
const MAX_EPS: f32 = 0.1;

impl LlamaConfig {
    /// Checks the values a format's keys gave: `keys` names, in order, the
    /// RoPE base, the RMSNorm epsilon, the RoPE scaling, the end and the
    /// beginning token ids, as the format calls them.
    ///
    /// # Errors
    /// A RoPE base that is not finite and above 0, an epsilon outside
    /// (0, 0.1], a scaling factor that is not finite and above 0, a token
    /// id outside the vocabulary, or an odd head dimension (RoPE rotates
    /// pairs); the message names the key and the value.
    pub(super) fn check_values(
        &self,
        [base, eps, scaling, eos, bos]: [&str; 5],
        fail: &dyn Fn(String) -> Error,
    ) -> Result<()> {
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if !positive(self.rope_theta) {
            return Err(fail(format!(
                "{base} is {}: the RoPE base must be a finite number above 0",
                self.rope_theta
            )));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps <= MAX_EPS) {
            return Err(fail(format!(
                "{eps} is {}: the RMSNorm epsilon must be above 0 and at most {MAX_EPS}",
                self.rms_norm_eps
            )));
        }
        let factors: Vec<(&str, f32)> = match &self.rope_scaling {
            RopeScaling::None => Vec::new(),
            RopeScaling::Linear { factor } => vec![("factor", *factor)],
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => vec![
                ("factor", *factor),
                ("low_freq_factor", *low_freq_factor),
                ("high_freq_factor", *high_freq_factor),
                (
                    "original_max_position_embeddings",
                    *original_max_position_embeddings,
                ),
            ],
            RopeScaling::Factors(values) => {
                values.iter().map(|&v| ("rope_freqs.weight", v)).collect()
            }
            RopeScaling::LongRope {
                long_factor,
                mscale,
            } => {
                if long_factor.len() != self.rotary_dim / 2 {
                    return Err(fail(format!(
                        "{scaling} (long_factor) has {} values; it needs one per rotated pair, {} ({} rotated dimensions)",
                        long_factor.len(),
                        self.rotary_dim / 2,
                        self.rotary_dim
                    )));
                }
                let mut all: Vec<(&str, f32)> =
                    long_factor.iter().map(|&v| ("long_factor", v)).collect();
                all.push(("long_mscale", *mscale));
                all
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                ..
            } => {
                if let Some((what, v)) = [("mscale", mscale), ("mscale_all_dim", mscale_all_dim)]
                    .into_iter()
                    .find(|&(_, v)| !(v.is_finite() && *v >= 0.0))
                {
                    return Err(fail(format!(
                        "{scaling} ({what}) is {v}: it must be a finite number, 0 or above"
                    )));
                }
                vec![
                    ("factor", *factor),
                    (
                        "original_max_position_embeddings",
                        *original_max_position_embeddings,
                    ),
                    ("beta_fast", *beta_fast),
                    ("beta_slow", *beta_slow),
                ]
            }
        };
        if let Some((what, v)) = factors.into_iter().find(|&(_, v)| !positive(v)) {
            return Err(fail(format!(
                "{scaling} ({what}) is {v}: a RoPE scaling factor must be a finite number above 0"
            )));
        }
        let ids = self
            .eos_token_ids
            .iter()
            .map(|&id| (eos, id))
            .chain(self.bos_token_id.map(|id| (bos, id)));
        for (key, id) in ids {
            if id as usize >= self.vocab_size {
                return Err(fail(format!(
                    "{key} is {id}, outside the vocabulary of {} tokens",
                    self.vocab_size
                )));
            }
        }
        if self.head_dim % 2 != 0 {
            return Err(fail(format!(
                "the head dimension is {}: RoPE rotates pairs of dimensions, so it must be even",
                self.head_dim
            )));
        }
        Ok(())
    }
}
