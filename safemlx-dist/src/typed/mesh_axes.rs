//! The sizes of a run's mesh axes: pipeline stages (`pp`) times
//! tensor-parallel ranks per stage (`tp`), as `--mesh pp=2,tp=2` gives them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The axes of a mesh over the world group, `pp` outer: world rank
/// `r` is stage `r / tp` (a stage's ranks are consecutive, so on MLX's ring
/// they are neighbours); its tensor-parallel rank follows
/// [`DeviceMesh`](crate::runtime::DeviceMesh)'s order, which the mesh of these axes
/// gives.
///
/// ```
/// use safemlx_dist::typed::{MeshAxes, MeshSpec};
///
/// let spec: MeshSpec = "pp=2".parse()?;
/// assert_eq!(spec.resolve(2)?, MeshAxes { pp: 2, tp: 1 });
/// assert_eq!("tp=4".parse::<MeshSpec>()?.resolve(4)?.to_string(), "pp=1,tp=4");
/// assert_eq!(
///     "pp=2,tp=2".parse::<MeshSpec>()?.resolve(3).unwrap_err().to_string(),
///     "--mesh pp=2,tp=2 needs 4 ranks (2 x 2) but the run has 3; launch it with -n 4 or change the axes"
/// );
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshAxes {
    /// Pipeline stages.
    pub pp: usize,
    /// Tensor-parallel ranks per stage.
    pub tp: usize,
}

/// `--mesh` as given: an axis left out is `None` until
/// [`resolve`](Self::resolve) fills it from the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MeshSpec {
    pp: Option<usize>,
    tp: Option<usize>,
}

impl MeshSpec {
    /// The axes for a world of `world` ranks: an axis left out takes the
    /// ranks the other leaves (all of them for `tp` with no `--mesh`).
    ///
    /// # Errors
    /// Axes whose product is not the world size, naming both.
    pub fn resolve(self, world: usize) -> Result<MeshAxes> {
        let axes = match (self.pp, self.tp) {
            (Some(pp), Some(tp)) => MeshAxes { pp, tp },
            (Some(pp), None) => MeshAxes {
                pp,
                tp: (world / pp).max(1),
            },
            (None, Some(tp)) => MeshAxes {
                pp: (world / tp).max(1),
                tp,
            },
            (None, None) => MeshAxes { pp: 1, tp: world },
        };
        if axes.pp * axes.tp != world {
            return Err(Error::Setting(format!(
                "--mesh {self} needs {} ranks ({} x {}) but the run has {world}; launch it with -n {} or change the axes",
                axes.pp * axes.tp,
                axes.pp,
                axes.tp,
                axes.pp * axes.tp
            )));
        }
        Ok(axes)
    }
}

impl FromStr for MeshSpec {
    type Err = Error;

    /// `pp=2,tp=2`, `pp=3`, `tp=4`.
    fn from_str(text: &str) -> Result<Self> {
        let mut spec = Self::default();
        if text.trim().is_empty() {
            return Err(Error::Setting(format!(
                "--mesh {text:?} names no axis; give axes such as pp=2,tp=2 (or leave --mesh out)"
            )));
        }
        for part in text.split(',').map(str::trim) {
            let bad = |why: &str| {
                Error::Setting(format!(
                    "--mesh {text}: `{part}` {why}; give axes such as pp=2,tp=2"
                ))
            };
            if part.is_empty() {
                return Err(bad("is an empty axis (a comma too many)"));
            }
            let (name, size) = part
                .split_once('=')
                .ok_or_else(|| bad("is not axis=size"))?;
            let size = size.trim();
            // Digits only: no sign, no other script's digits.
            if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("needs a positive size in digits 0-9"));
            }
            let size: usize = size
                .parse()
                .map_err(|_| bad("is too large a size"))
                .and_then(|s: usize| match s {
                    0 => Err(bad("needs a positive size")),
                    s => Ok(s),
                })?;
            let axis = match name.trim() {
                "pp" => &mut spec.pp,
                "tp" => &mut spec.tp,
                _ => {
                    return Err(bad(
                        "names no axis (pp: pipeline stages, tp: tensor parallel)",
                    ))
                }
            };
            if axis.replace(size).is_some() {
                return Err(bad("repeats an axis"));
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for MeshSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [("pp", self.pp), ("tp", self.tp)]
            .into_iter()
            .filter_map(|(name, size)| size.map(|s| format!("{name}={s}")))
            .collect();
        if parts.is_empty() {
            f.write_str("(none)")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

impl fmt::Display for MeshAxes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pp={},tp={}", self.pp, self.tp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        text.parse::<MeshSpec>().unwrap_err().to_string()
    }

    #[test]
    fn a_mesh_is_axes_in_digits_and_nothing_else() {
        let spec: MeshSpec = "pp=2, tp=2".parse().unwrap();
        assert_eq!(spec.to_string(), "pp=2,tp=2");
        assert_eq!(
            refused(""),
            "--mesh \"\" names no axis; give axes such as pp=2,tp=2 (or leave --mesh out)"
        );
        assert_eq!(
            refused("pp=1,"),
            "--mesh pp=1,: `` is an empty axis (a comma too many); give axes such as pp=2,tp=2"
        );
        for size in ["+1", "\u{ff12}", "-1", "2.0"] {
            assert_eq!(
                refused(&format!("pp={size}")),
                format!("--mesh pp={size}: `pp={size}` needs a positive size in digits 0-9; give axes such as pp=2,tp=2")
            );
        }
        assert_eq!(
            refused("pp=18446744073709551616"),
            "--mesh pp=18446744073709551616: `pp=18446744073709551616` is too large a size; give axes such as pp=2,tp=2"
        );
        assert_eq!(
            refused("pp=0"),
            "--mesh pp=0: `pp=0` needs a positive size; give axes such as pp=2,tp=2"
        );
    }
}
