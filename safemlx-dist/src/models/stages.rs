//! Pipeline stages: which contiguous layers each stage holds.
//!
//! Layers split evenly by the chunk rule (the first `L mod n` stages hold
//! one layer more) or in proportion to weights (`--split 3:1`, largest
//! remainders first). Every layer lands on exactly one stage and every
//! stage holds at least one layer; anything else is an error naming the
//! split and the fix.

use std::ops::Range;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How a model's layers split into pipeline stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSplit {
    /// `n` stages, layer counts differing by at most one (the first stages
    /// take the extra layers).
    Even(usize),
    /// One stage per weight, layers in proportion to the weights.
    Weighted(Vec<u32>),
}

impl LayerSplit {
    /// The number of stages.
    pub fn stages(&self) -> usize {
        match self {
            Self::Even(n) => *n,
            Self::Weighted(w) => w.len(),
        }
    }

    /// Each stage's layers, in order, covering `0..layers`.
    ///
    /// ```
    /// use safemlx_dist::models::LayerSplit;
    ///
    /// assert_eq!(LayerSplit::Even(3).ranges(8)?, vec![0..3, 3..6, 6..8]);
    /// let weighted: LayerSplit = "3:1".parse()?;
    /// assert_eq!(weighted.ranges(30)?, vec![0..23, 23..30]);
    /// assert_eq!(
    ///     LayerSplit::Even(5).ranges(4).unwrap_err().to_string(),
    ///     "5 pipeline stages for a model of 4 layers: every stage needs a layer; use at most 4 stages"
    /// );
    /// # Ok::<(), safemlx_dist::Error>(())
    /// ```
    ///
    /// # Errors
    /// No stage, more stages than layers, or a zero weight.
    pub fn ranges(&self, layers: usize) -> Result<Vec<Range<usize>>> {
        let n = self.stages();
        if n == 0 {
            return Err(Error::Setting(
                "a pipeline needs at least one stage".to_owned(),
            ));
        }
        if n > layers {
            return Err(Error::Setting(format!(
                "{n} pipeline stages for a model of {layers} layers: every stage needs a layer; use at most {layers} stages"
            )));
        }
        let counts = match self {
            Self::Even(_) => (0..n)
                .map(|k| layers / n + usize::from(k < layers % n))
                .collect(),
            Self::Weighted(weights) => weighted_counts(weights, layers)?,
        };
        let mut start = 0;
        Ok(counts
            .into_iter()
            .map(|c| {
                start += c;
                start - c..start
            })
            .collect())
    }
}

/// Layers in proportion to `weights`: the floors of the exact shares,
/// then one more for the largest remainders (earlier stages on ties); a
/// stage left with none takes one from the largest.
fn weighted_counts(weights: &[u32], layers: usize) -> Result<Vec<usize>> {
    let text = split_text(weights);
    if let Some(k) = weights.iter().position(|w| *w == 0) {
        return Err(Error::Setting(format!(
            "--split {text}: part {} is 0; every stage needs a positive weight",
            k + 1
        )));
    }
    let mut counts = crate::typed::weighted_lengths(layers, weights);
    // A stage whose share rounds to nothing takes a layer from the
    // largest (there are at least as many layers as stages).
    while let Some(k) = counts.iter().position(|c| *c == 0) {
        let largest = (0..counts.len()).max_by_key(|&j| (counts[j], std::cmp::Reverse(j)));
        let largest = largest.unwrap_or(k);
        counts[largest] -= 1;
        counts[k] = 1;
    }
    Ok(counts)
}

/// Weights such as `3:1`, as given to the option `flag`.
///
/// # Errors
/// A part that is not a whole number, named with the option.
pub fn parse_weights(flag: &str, text: &str) -> Result<Vec<u32>> {
    text.split(':')
        .map(|part| {
            let digits = part.trim();
            let bad = |why: &str| {
                Error::Setting(format!(
                    "{flag} {text}: `{part}` {why}; give weights such as 3:1"
                ))
            };
            // Digits only: no sign, no other script's digits.
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("is not a whole number in digits 0-9"));
            }
            digits
                .parse::<u32>()
                .map_err(|_| bad("is too large a weight"))
        })
        .collect()
}

fn split_text(weights: &[u32]) -> String {
    let parts: Vec<String> = weights.iter().map(u32::to_string).collect();
    parts.join(":")
}

impl FromStr for LayerSplit {
    type Err = Error;

    /// `3:1` (weights, one per stage).
    fn from_str(text: &str) -> Result<Self> {
        Ok(Self::Weighted(parse_weights("--split", text)?))
    }
}

/// The layers one pipeline stage holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// This stage's index, from 0.
    pub index: usize,
    /// How many stages the pipeline has.
    pub count: usize,
    /// The layers this stage holds.
    pub layers: Range<usize>,
}

impl Stage {
    /// Checks that this is stage `index` of `count`, the place a rank
    /// holds in its pipeline.
    ///
    /// # Errors
    /// Another place, naming both.
    pub fn expect_place(&self, index: usize, count: usize) -> Result<()> {
        if (self.index, self.count) == (index, count) {
            return Ok(());
        }
        Err(Error::Setting(format!(
            "the model holds stage {} of {} but this rank is stage {index} of {count}",
            self.index, self.count
        )))
    }

    /// The whole model as one stage.
    pub fn whole(layers: usize) -> Self {
        Self {
            index: 0,
            count: 1,
            layers: 0..layers,
        }
    }

    /// Stage `index` of `split` over `layers` layers.
    ///
    /// # Errors
    /// Those of [`LayerSplit::ranges`], or an index past the last stage.
    pub fn of(split: &LayerSplit, index: usize, layers: usize) -> Result<Self> {
        let ranges = split.ranges(layers)?;
        let count = ranges.len();
        let layers = ranges.into_iter().nth(index).ok_or_else(|| {
            Error::Setting(format!(
                "stage {index} of a pipeline of {count} stages does not exist"
            ))
        })?;
        Ok(Self {
            index,
            count,
            layers,
        })
    }

    /// Whether this stage embeds the tokens.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// Whether this stage computes the logits.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// Whether this stage is the whole model.
    pub fn is_whole(&self) -> bool {
        self.count == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_lands_once_and_errors_name_the_fix() {
        for layers in 1..12 {
            for n in 1..=layers {
                let r = LayerSplit::Even(n).ranges(layers).unwrap();
                assert_eq!(r.len(), n);
                assert_eq!(r.last().unwrap().end, layers);
                assert!(r.iter().all(|r| !r.is_empty()));
            }
        }
        assert_eq!(
            LayerSplit::Even(3).ranges(30).unwrap(),
            vec![0..10, 10..20, 20..30]
        );
        let w = |t: &str| t.parse::<LayerSplit>().unwrap();
        assert_eq!(w("1:1:2").ranges(8).unwrap(), vec![0..2, 2..4, 4..8]);
        assert_eq!(w("2:1").ranges(4).unwrap(), vec![0..3, 3..4]);
        assert_eq!(
            "3:x".parse::<LayerSplit>().unwrap_err().to_string(),
            "--split 3:x: `x` is not a whole number in digits 0-9; give weights such as 3:1"
        );
        for bad in ["-1:2", "+1:2", "\u{ff11}:2"] {
            let part = bad.split(':').next().unwrap();
            assert_eq!(
                bad.parse::<LayerSplit>().unwrap_err().to_string(),
                format!("--split {bad}: `{part}` is not a whole number in digits 0-9; give weights such as 3:1")
            );
        }
        assert_eq!(
            w("3:0").ranges(4).unwrap_err().to_string(),
            "--split 3:0: part 2 is 0; every stage needs a positive weight"
        );
        assert_eq!(w("100:1").ranges(4).unwrap(), vec![0..3, 3..4]);
        assert_eq!(w("3:1").ranges(2).unwrap(), vec![0..1, 1..2]);
        let stage = Stage::of(&LayerSplit::Even(3), 2, 30).unwrap();
        assert_eq!(stage.layers, 20..30);
        assert!(stage.is_last() && !stage.is_first());
        assert!(Stage::of(&LayerSplit::Even(3), 3, 30).is_err());
    }
}
