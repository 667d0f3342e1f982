//! Weights that stay quantized: MLX's affine quantization.
//!
//! A `[rows, columns]` weight is stored as `bits`-bit unsigned values
//! packed `32 / bits` to a `uint32` (the first value in the lowest bits),
//! and per group of `group_size` consecutive values of a row a `scale` and
//! a `bias`: value = `scale * q + bias`. This is the layout of MLX's
//! `quantize`, `dequantize` and `quantized_matmul`, and of mlx-community's
//! checkpoints (`weight`, `scales`, `biases`).
//!
//! Splitting the rows (a layer's outputs) is free; splitting the columns (a
//! layer's inputs) must fall on group boundaries: [`AffineWeight::groups`]
//! takes whole groups.

use safemlx::ops::indexing::TryIndexOp;
use safemlx::ops::{dequantize, quantize, quantized_matmul};
use safemlx::{Array, Dtype, Stream};

use crate::error::{Error, Result};

/// A quantized `[rows, columns]` weight (see the module docs).
#[derive(Debug, Clone)]
pub struct AffineWeight {
    /// `uint32` `[rows, columns * bits / 32]`.
    pub weight: Array,
    /// `[rows, columns / group_size]`.
    pub scales: Array,
    /// `[rows, columns / group_size]`.
    pub biases: Array,
    /// Values per scale and bias.
    pub group_size: usize,
    /// Bits per value: 2, 3, 4, 5, 6 or 8.
    pub bits: usize,
}

impl AffineWeight {
    /// Checks that the arrays agree with each other, `group_size` and `bits`.
    ///
    /// # Errors
    /// [`Error::Shape`] naming the arrays and their shapes.
    pub fn new(
        weight: Array,
        scales: Array,
        biases: Array,
        group_size: usize,
        bits: usize,
    ) -> Result<Self> {
        let q = Self {
            weight,
            scales,
            biases,
            group_size,
            bits,
        };
        let bad = |why: String| Err(Error::Shape(format!("a quantized weight: {why}")));
        if ![2, 3, 4, 5, 6, 8].contains(&bits) || ![32, 64, 128].contains(&group_size) {
            return bad(format!(
                "bits {bits} and group size {group_size}; MLX takes bits 2, 3, 4, 5, 6 or 8 and group size 32, 64 or 128"
            ));
        }
        if q.weight.dtype() != Dtype::Uint32 {
            return bad(format!(
                "packed values of dtype {:?}; they are uint32",
                q.weight.dtype()
            ));
        }
        let (w, sc, bi) = (q.weight.shape(), q.scales.shape(), q.biases.shape());
        let columns = w.get(1).map(|&c| c as usize * 32 / bits);
        let fits = w.len() == 2
            && sc == bi
            && sc.len() == 2
            && sc[0] == w[0]
            && columns == Some(sc[1] as usize * group_size);
        if !fits {
            return bad(format!(
                "packed values {w:?}, scales {sc:?} and biases {bi:?} do not agree with {bits} bits in groups of {group_size} (for [rows, columns]: [rows, columns * {bits} / 32], [rows, columns / {group_size}] twice)"
            ));
        }
        Ok(q)
    }

    /// Quantizes the float `[rows, columns]` weight `w` with MLX's `quantize`.
    ///
    /// # Errors
    /// Sizes MLX cannot quantize (columns not a multiple of `group_size`).
    pub fn quantize(w: &Array, group_size: usize, bits: usize, s: &Stream) -> Result<Self> {
        let columns = w.shape().get(1).copied().unwrap_or(0) as usize;
        if w.ndim() != 2 || columns % group_size != 0 {
            return Err(Error::Shape(format!(
                "quantizing a weight of shape {:?} in groups of {group_size}: it needs 2 dimensions and a multiple of {group_size} columns",
                w.shape()
            )));
        }
        let (weight, scales, biases) = quantize(w, group_size as i32, bits as i32, s)?;
        Self::new(weight, scales, biases, group_size, bits)
    }

    /// The logical `[rows, columns]`.
    pub fn shape(&self) -> [usize; 2] {
        let s = self.scales.shape();
        [s[0] as usize, s[1] as usize * self.group_size]
    }

    /// Groups per row.
    pub fn groups_per_row(&self) -> usize {
        self.shape()[1] / self.group_size
    }

    /// Bytes of the packed values, scales and biases.
    pub fn nbytes(&self) -> usize {
        self.weight.nbytes() + self.scales.nbytes() + self.biases.nbytes()
    }

    /// Rows `first..first + count` (a layer's outputs).
    ///
    /// # Errors
    /// Rows past the end, or an MLX error.
    pub fn rows(&self, first: usize, count: usize, s: &Stream) -> Result<Self> {
        let rows = self.shape()[0];
        if first + count > rows {
            return Err(Error::Shape(format!(
                "rows {first}..{} of a quantized weight with {rows} rows",
                first + count
            )));
        }
        let (a, b) = (first as i32, (first + count) as i32);
        Ok(Self {
            weight: self.weight.try_index_device((a..b, ..), s)?,
            scales: self.scales.try_index_device((a..b, ..), s)?,
            biases: self.biases.try_index_device((a..b, ..), s)?,
            ..*self
        })
    }

    /// The rows `indices` (`[T]` int32, in range), in their order: an
    /// embedding's lookup, before dequantizing only those rows.
    ///
    /// # Errors
    /// An MLX error.
    pub fn take_rows(&self, indices: &Array, s: &Stream) -> Result<Self> {
        let take = |a: &Array| a.take_axis(indices, 0, s);
        Ok(Self {
            weight: take(&self.weight)?,
            scales: take(&self.scales)?,
            biases: take(&self.biases)?,
            ..*self
        })
    }

    /// Groups `first..first + count` of every row (a layer's inputs, in
    /// whole groups).
    ///
    /// # Errors
    /// Groups past the end, or an MLX error.
    pub fn groups(&self, first: usize, count: usize, s: &Stream) -> Result<Self> {
        let groups = self.groups_per_row();
        if first + count > groups {
            return Err(Error::Shape(format!(
                "groups {first}..{} of a quantized weight with {groups} groups of {} per row",
                first + count,
                self.group_size
            )));
        }
        let words = self.group_size * self.bits / 32;
        let (a, b) = (first as i32, (first + count) as i32);
        let (wa, wb) = ((first * words) as i32, ((first + count) * words) as i32);
        Ok(Self {
            weight: self.weight.try_index_device((.., wa..wb), s)?,
            scales: self.scales.try_index_device((.., a..b), s)?,
            biases: self.biases.try_index_device((.., a..b), s)?,
            ..*self
        })
    }

    /// Quantized weights of the same rows side by side: their groups in
    /// order (the parts of one weight's columns).
    ///
    /// # Errors
    /// No parts, or parts of other rows or quantization (an MLX error).
    pub fn concatenate_groups(parts: &[Self], s: &Stream) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::Shape("no groups to concatenate".to_owned()));
        };
        let joined = |pick: fn(&Self) -> &Array| -> Result<Array> {
            let arrays: Vec<&Array> = parts.iter().map(pick).collect();
            Ok(safemlx::ops::concatenate_axis(&arrays, 1, s)?)
        };
        Self::new(
            joined(|p| &p.weight)?,
            joined(|p| &p.scales)?,
            joined(|p| &p.biases)?,
            first.group_size,
            first.bits,
        )
    }

    /// The float values, `[rows, columns]` (MLX's `dequantize`).
    ///
    /// # Errors
    /// An MLX error.
    pub fn dequantize(&self, s: &Stream) -> Result<Array> {
        let [rows, columns] = self.shape();
        if rows == 0 || columns == 0 {
            // MLX cannot dequantize an empty array (a rank's empty part).
            let shape = [rows as i32, columns as i32];
            return Ok(safemlx::ops::zeros_dtype(&shape, self.scales.dtype(), s)?);
        }
        if 8 % self.bits == 0 && cfg!(target_endian = "little") {
            return self.dequantize_bytes(s);
        }
        Ok(dequantize(
            &self.weight,
            &self.scales,
            &self.biases,
            self.group_size as i32,
            self.bits as i32,
            s,
        )?)
    }

    /// [`dequantize`](Self::dequantize) for 2, 4 and 8 bits, unpacked byte
    /// by byte: the packed `uint32`s viewed as bytes (the first value in
    /// the lowest bits of the first byte on a little-endian host), each
    /// byte's `8 / bits` values shifted out on bytes, then scaled. The
    /// same values as MLX's `dequantize`, which unpacks on `uint32`s with
    /// a broadcast copy first: measured on this machine's CPU, 1.5-2x
    /// faster (a 49152 x 576 4-bit table: 156 -> 80 ms).
    fn dequantize_bytes(&self, s: &Stream) -> Result<Array> {
        let [rows, columns] = self.shape();
        let (rows, columns) = (rows as i32, columns as i32);
        let bytes = self.weight.view_dtype(Dtype::Uint8, s)?;
        let per_byte = 8 / self.bits;
        let values = if per_byte == 1 {
            bytes
        } else {
            let mask = Array::from_slice(&[((1u32 << self.bits) - 1) as u8], &[1]);
            let parts = (0..per_byte)
                .map(|j| {
                    let shifted = match j {
                        0 => bytes.clone(),
                        _ => {
                            let by = Array::from_slice(&[(j * self.bits) as u8], &[1]);
                            crate::runtime::right_shift(&bytes, &by, s)?
                        }
                    };
                    crate::runtime::bitwise_and(&shifted, &mask, s)
                })
                .collect::<Result<Vec<_>>>()?;
            safemlx::ops::stack_axis(&parts, -1, s)?
        };
        let groups = columns / self.group_size as i32;
        let grouped = values
            .as_dtype(self.scales.dtype(), s)?
            .reshape(&[rows, groups, self.group_size as i32], s)?;
        let scaled = grouped
            .multiply(self.scales.expand_dims(-1, s)?, s)?
            .add(self.biases.expand_dims(-1, s)?, s)?;
        Ok(scaled.reshape(&[rows, columns], s)?)
    }

    /// `x Wᵀ` for `x` `[..., columns]`: `[..., rows]`. On a GPU, and for
    /// fewer than [`DEQUANTIZE_ROWS`] rows of `x` on a CPU, through MLX's
    /// `quantized_matmul`, without dequantizing; for more rows on a CPU
    /// the weight is dequantized for this product only (the stored values
    /// stay quantized), since MLX's CPU kernel unpacks the weight again for
    /// every row of `x` while one dequantization serves them all.
    ///
    /// # Errors
    /// `x` without `columns` trailing values, or an MLX error.
    pub fn matmul_t(&self, x: &Array, s: &Stream) -> Result<Array> {
        let columns = self.shape()[1];
        if x.shape().last().map(|&d| d as usize) != Some(columns) {
            return Err(Error::Shape(format!(
                "x of shape {:?} times a quantized [{}, {columns}] weight transposed: x needs {columns} trailing values",
                x.shape(),
                self.shape()[0]
            )));
        }
        if self.shape()[0] == 0 || columns == 0 {
            // An empty part: MLX's kernel does not take empty weights.
            let mut shape = x.shape().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = self.shape()[0] as i32;
            }
            let product = safemlx::ops::zeros_dtype(&shape, self.scales.dtype(), s)?;
            return Ok(product);
        }
        let rows: i64 = x
            .shape()
            .iter()
            .rev()
            .skip(1)
            .map(|&d| i64::from(d))
            .product();
        if rows >= DEQUANTIZE_ROWS as i64 && on_cpu(s) {
            return self.dequantized_matmul_t(x, s);
        }
        Ok(quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            &self.biases,
            true,
            self.group_size as i32,
            self.bits as i32,
            s,
        )?)
    }

    /// `x Wᵀ` through the float weight, dequantized in blocks of at most
    /// [`DEQUANTIZE_BLOCK`] values whose products are laid side by side:
    /// a block stays in the CPU's cache between its dequantization and its
    /// product (a whole vocabulary table does not, and dequantizes ~4x
    /// slower per value, measured).
    fn dequantized_matmul_t(&self, x: &Array, s: &Stream) -> Result<Array> {
        let [rows, columns] = self.shape();
        let block = (DEQUANTIZE_BLOCK / columns.max(1)).max(1);
        let products = (0..rows)
            .step_by(block)
            .map(|first| {
                let part = self.rows(first, block.min(rows - first), s)?;
                let w = part.dequantize(s)?.as_dtype(x.dtype(), s)?;
                Ok(x.matmul(&w.transpose(s)?, s)?)
            })
            .collect::<Result<Vec<_>>>()?;
        match products.as_slice() {
            [one] => Ok(one.clone()),
            _ => Ok(safemlx::ops::concatenate_axis(&products, -1, s)?),
        }
    }
}

/// Values of a weight dequantized at once by a product of many rows on a
/// CPU (see [`AffineWeight::matmul_t`]).
pub const DEQUANTIZE_BLOCK: usize = 1 << 20;

/// Rows of `x` from which [`AffineWeight::matmul_t`] dequantizes the weight
/// on a CPU stream (see the book's design chapter, "Quantized products
/// of many rows dequantize on a CPU").
pub const DEQUANTIZE_ROWS: usize = 4;

/// Whether `s` computes on the CPU.
fn on_cpu(s: &Stream) -> bool {
    matches!(
        s.get_device().and_then(|d| d.get_type()),
        Ok(safemlx::DeviceType::Cpu)
    )
}
