//! How quantized values are packed: MLX's quantization modes as this
//! crate reads them. Affine (`scale * q + bias` per group: mlx-community's
//! directories, and the GGUF types that map onto it) and MXFP4 (4-bit
//! floats with one power-of-two scale per 32 values: gpt-oss's experts,
//! as OpenAI ships them and as mlx-lm saves them in its `mxfp4` mode).

use safemlx::ops::QuantizationMode;

/// How a packed matrix is stored: MLX's mode, values per scale, bits
/// per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedFormat {
    /// MLX's quantization mode.
    pub mode: QuantizationMode,
    /// Values per scale (and bias).
    pub group_size: usize,
    /// Bits per value.
    pub bits: usize,
}

impl PackedFormat {
    /// gpt-oss's MXFP4: 4-bit values, one power-of-two scale per 32.
    pub const MXFP4: Self = Self {
        mode: QuantizationMode::MxFp4,
        group_size: 32,
        bits: 4,
    };

    /// MLX's affine quantization (a scale and a bias per group).
    pub fn affine(group_size: usize, bits: usize) -> Self {
        Self {
            mode: QuantizationMode::Affine,
            group_size,
            bits,
        }
    }

    /// The format mlx-lm's `config.json` names (`"mode"`, `"group_size"`,
    /// `"bits"`) when this crate reads it: `affine`, or `mxfp4` in its one
    /// size (groups of 32, 4 bits). What is refused, in words, otherwise.
    ///
    /// # Errors
    /// Another mode (`nvfp4`, `mxfp8`, ...) or `mxfp4` of another size.
    pub fn from_mode(mode: &str, group_size: usize, bits: usize) -> Result<Self, String> {
        match (mode, group_size, bits) {
            ("affine", ..) => Ok(Self::affine(group_size, bits)),
            ("mxfp4", 32, 4) => Ok(Self::MXFP4),
            _ => Err(format!(
                "mode `{mode}` ({bits} bits in groups of {group_size}); read here: `affine`, and `mxfp4` (4 bits in groups of 32)"
            )),
        }
    }

    /// `uint32` words of packed values per group.
    pub fn words_per_group(&self) -> usize {
        self.group_size * self.bits / 32
    }

    /// In messages: `MXFP4`, `4-bit affine (groups of 64)`.
    pub fn label(&self) -> String {
        match self.mode {
            QuantizationMode::MxFp4 => "MXFP4".to_owned(),
            QuantizationMode::Affine => {
                format!("{}-bit affine (groups of {})", self.bits, self.group_size)
            }
        }
    }

    /// Stored bits per value, scales (8-bit for MXFP4, 16-bit scales and
    /// biases for affine) included.
    pub fn stored_bits(&self) -> f64 {
        let per_group = match self.mode {
            QuantizationMode::MxFp4 => 8.0,
            QuantizationMode::Affine => 32.0,
        };
        self.bits as f64 + per_group / self.group_size as f64
    }

    /// `(group_size, bits)` as MLX's operations take them.
    pub(crate) fn ints(&self) -> (i32, i32) {
        (self.group_size as i32, self.bits as i32)
    }
}
