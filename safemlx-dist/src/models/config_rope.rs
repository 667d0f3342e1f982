//! The rotation a Llama-family configuration asks for: RoPE frequencies
//! under Llama 3's and YaRN's scaling, YaRN's factors on q, k and the
//! softmax scale.

use super::config::{LlamaConfig, RopeScaling};
use super::config_keys::Keys;
use crate::error::Result;

impl LlamaConfig {
    /// The softmax scale of attention: `1 / sqrt(head_dim)`, and with
    /// YaRN on a latent-attention model also `m(mscale_all_dim)^2` (mlx-lm's
    /// `apply_yarn_mscale`; see [`rope_mscale`](Self::rope_mscale)).
    pub fn attention_scale(&self) -> f32 {
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        match self.rope_scaling {
            RopeScaling::Yarn {
                factor,
                mscale_all_dim,
                ..
            } if self.mla.is_some() && factor > 1.0 && mscale_all_dim != 0.0 => {
                let m = 0.1 * mscale_all_dim * factor.ln() + 1.0;
                scale * m * m
            }
            _ => scale,
        }
    }

    /// The factor YaRN puts on the rotated part of q and k:
    /// `m(mscale) / m(mscale_all_dim)` with `m(x) = 0.1 x ln(factor) + 1`
    /// (1 when `factor <= 1`); LongRoPE's `mscale`; 1 for the other
    /// scalings.
    pub fn rope_mscale(&self) -> f32 {
        if let RopeScaling::LongRope { mscale, .. } = self.rope_scaling {
            return mscale;
        }
        let RopeScaling::Yarn {
            factor,
            mscale,
            mscale_all_dim,
            ..
        } = self.rope_scaling
        else {
            return 1.0;
        };
        let m = |x: f32| match factor <= 1.0 {
            true => 1.0,
            false => 0.1 * x * factor.ln() + 1.0,
        };
        m(mscale) / m(mscale_all_dim)
    }

    /// RoPE frequencies for Llama 3, YaRN and LongRoPE scaling (`None` for
    /// the others): the wavelength divisor of each rotated pair, as
    /// `fast::rope` takes them.
    pub fn rope_freqs(&self) -> Option<Vec<f32>> {
        let dims = self.rotary_dim as f32;
        let base = |i: usize| self.rope_theta.powf(2.0 * i as f32 / dims);
        if let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } = self.rope_scaling
        {
            // The pair that turns `rotations` times over the original
            // context (in f64, as mlx-lm rounds it).
            let pair = |rotations: f32| {
                let turn = f64::from(rotations) * 2.0 * std::f64::consts::PI;
                f64::from(dims) * (f64::from(original) / turn).ln()
                    / (2.0 * f64::from(self.rope_theta).ln())
            };
            let (low, high) = match truncate {
                true => (pair(beta_fast).floor(), pair(beta_slow).ceil()),
                false => (pair(beta_fast), pair(beta_slow)),
            };
            let low = low.max(0.0) as f32;
            let mut high = high.min(f64::from(dims) - 1.0) as f32;
            if low == high {
                high += 0.001;
            }
            return Some(
                (0..self.rotary_dim / 2)
                    .map(|i| {
                        let extrapolated = base(i);
                        let interpolated = factor * extrapolated;
                        let keep = 1.0 - ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        interpolated * extrapolated
                            / (interpolated * keep + extrapolated * (1.0 - keep))
                    })
                    .collect(),
            );
        }
        if let RopeScaling::Factors(factors)
        | RopeScaling::LongRope {
            long_factor: factors,
            ..
        } = &self.rope_scaling
        {
            return Some(
                factors
                    .iter()
                    .enumerate()
                    .map(|(i, f)| base(i) * f)
                    .collect(),
            );
        }
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        } = self.rope_scaling
        else {
            return None;
        };
        let low_wavelen = original / low_freq_factor;
        let high_wavelen = original / high_freq_factor;
        Some(
            (0..self.rotary_dim / 2)
                .map(|i| {
                    let freq = base(i);
                    let wavelen = 2.0 * std::f32::consts::PI * freq;
                    if wavelen > low_wavelen {
                        freq * factor
                    } else if wavelen < high_wavelen {
                        freq
                    } else {
                        let smooth = (original / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        freq / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect(),
        )
    }
}

/// The dimensions of each head RoPE rotates: `head_dim *
/// partial_rotary_factor` (`default` when the key is absent), rounded down
/// as mlx-lm does.
///
/// # Errors
/// A factor outside (0, 1], or one that leaves an odd or empty rotated
/// part; the message names the key, its value and the head dimension.
pub(super) fn partial_rotary_dim(keys: &Keys, head_dim: usize, default: f32) -> Result<usize> {
    let factor = keys
        .float("partial_rotary_factor", keys.json)?
        .unwrap_or(default);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(keys.fail(format!(
            "\"partial_rotary_factor\" is {factor}; it must be above 0 and at most 1"
        )));
    }
    let dims = (head_dim as f64 * f64::from(factor)) as usize;
    if dims == 0 || dims % 2 != 0 {
        return Err(keys.fail(format!(
            "\"partial_rotary_factor\" {factor} of head_dim {head_dim} rotates {dims} dimensions; RoPE rotates pairs, so it must be an even number above 0"
        )));
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::super::config::LlamaConfig;

    #[test]
    fn llama3_frequencies_scale_only_long_wavelengths() {
        let mut j = serde_json::json!({
            "model_type": "llama", "vocab_size": 64, "hidden_size": 576,
            "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 9, "rope_theta": 100000.0
        });
        j["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let c = LlamaConfig::from_hf(&j, "m").unwrap();
        let freqs = c.rope_freqs().unwrap();
        assert_eq!(freqs.len(), 32);
        assert_eq!(freqs[0], 1.0); // the shortest wavelength is kept
        let last = 100000f32.powf(62.0 / 64.0);
        assert!((freqs[31] / last - 8.0).abs() < 1e-4); // the longest is scaled by 8
    }
}
