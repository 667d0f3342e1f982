//! A run's layout, as `--mesh`, `--split` and `--tensor-split` give it:
//! the mesh's axes, how the layers split into pipeline stages, how each
//! stage's tensor-parallel ranks share its heads, hidden columns and
//! experts; and this rank's part of a model loaded by it.

use std::path::Path;
use std::str::FromStr;

use safemlx::Stream;

use super::{
    available_memory, load_stage, load_with, memory_reports, parse_weights, split_by_memory,
    LayerSplit, LoadOptions, Loaded,
};
use crate::error::{Error, Result};
use crate::runtime::{DeviceMesh, Group};
use crate::typed::{MeshAxes, MeshSpec, StageLink};

/// `--split`: how the layers split into stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageSplit {
    /// In proportion to one weight per stage (`3:1`).
    Weights(LayerSplit),
    /// In proportion to each stage's memory (`memory`; see
    /// [`split_by_memory`]).
    Memory,
}

/// `--tensor-split`: how a stage's tensor-parallel ranks share its heads,
/// hidden columns and experts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorSplit {
    /// In proportion to one weight per rank (`3:1`).
    Weights(Vec<u32>),
    /// In proportion to each rank's memory (`memory`; see
    /// [`memory_reports`]).
    Memory,
}

/// How a run splits a model over its ranks. The default is every rank
/// holding a slice of every layer, split evenly (tensor parallel).
///
/// ```
/// use safemlx_dist::models::{Layout, StageSplit, TensorSplit};
///
/// let layout = Layout {
///     mesh: "pp=2,tp=2".parse()?,
///     split: Some("3:1".parse()?),
///     tensor_split: Some("memory".parse()?),
/// };
/// assert_eq!(layout.mesh.resolve(4)?.to_string(), "pp=2,tp=2");
/// assert_eq!(layout.tensor_split, Some(TensorSplit::Memory));
/// assert!(matches!(layout.split, Some(StageSplit::Weights(_))));
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// The mesh's axes: pipeline stages times tensor-parallel ranks each.
    pub mesh: MeshSpec,
    /// How the layers split into the stages (evenly when `None`).
    pub split: Option<StageSplit>,
    /// How each stage's ranks share its heads, columns and experts
    /// (evenly when `None`).
    pub tensor_split: Option<TensorSplit>,
}

/// This rank's part of a model loaded by a [`Layout`].
#[derive(Debug)]
pub struct Placed {
    /// The model's part and what it was read from.
    pub loaded: Loaded,
    /// The boundaries to the stages before and after this rank's (`None`
    /// with one stage).
    pub link: Option<StageLink>,
    /// The mesh's axes.
    pub axes: MeshAxes,
    /// What this rank has to say about the split (the memory each rank
    /// offered), for it to print.
    pub notes: Vec<String>,
}

/// Loads this rank of `world`'s part of the model at `path` as `layout`
/// splits it: with one stage, every rank tensor parallel
/// ([`load_with`]); with more, stage `r / tp` of world rank `r`
/// ([`load_stage`]) and the [`StageLink`] to its neighbours. A split by
/// memory exchanges each rank's free memory ([`available_memory`], one
/// `all_gather`) first.
///
/// # Errors
/// A mesh that is not the world's size, a `--split` without stages or
/// with a part count other than the stages', a `--tensor-split` with a
/// part count other than the stage's ranks, and [`load_with`]'s errors.
pub fn load_layout(
    world: &Group,
    path: &Path,
    options: LoadOptions,
    layout: &Layout,
    s: &Stream,
) -> Result<Placed> {
    let axes = layout.mesh.resolve(world.size())?;
    let mut notes = Vec::new();
    if axes.pp == 1 {
        if let Some(split) = &layout.split {
            return Err(Error::Setting(format!(
                "--split {} divides the layers into pipeline stages, but the mesh {axes} has one stage; give --mesh pp=P too",
                split_text(split)
            )));
        }
        let options = tensor_options(options, layout, (world, world.rank()), &mut notes, s)?;
        let loaded = load_with(world, path, options, s)?;
        return Ok(Placed {
            loaded,
            link: None,
            axes,
            notes,
        });
    }
    let rank = world.rank();
    let split = match &layout.split {
        None => LayerSplit::Even(axes.pp),
        Some(StageSplit::Weights(split)) => split.clone(),
        Some(StageSplit::Memory) => {
            let mine = available_memory(rank)?;
            let (split, reports) = split_by_memory(world, axes.tp, mine, s)?;
            if rank == 0 {
                notes.push(format!(
                    "--split memory: the ranks offer {reports:?} MiB; stage weights {split:?}"
                ));
            }
            split
        }
    };
    if split.stages() != axes.pp {
        return Err(Error::Setting(format!(
            "--split gives {} parts for {} pipeline stages; give one weight per stage",
            split.stages(),
            axes.pp
        )));
    }
    let mesh = DeviceMesh::new(world, &[("pp", axes.pp), ("tp", axes.tp)])?;
    let link = StageLink::new(&mesh)?;
    let tensor = mesh.axis("tp")?;
    let options = tensor_options(options, layout, (tensor, rank), &mut notes, s)?;
    let loaded = load_stage(tensor, path, options, &split, link.stage(), s)?;
    Ok(Placed {
        loaded,
        link: Some(link),
        axes,
        notes,
    })
}

/// `options` with `--tensor-split`'s shares over `tensor` (a stage's
/// ranks, or every rank; `world_rank` is this rank's in the world): as
/// given, or each rank's memory (one `all_gather` over `tensor`), noted by
/// its first rank.
fn tensor_options(
    mut options: LoadOptions,
    layout: &Layout,
    (tensor, world_rank): (&Group, usize),
    notes: &mut Vec<String>,
    s: &Stream,
) -> Result<LoadOptions> {
    options.tensor_split = match &layout.tensor_split {
        None => options.tensor_split,
        Some(TensorSplit::Weights(w)) => Some(w.clone()),
        Some(TensorSplit::Memory) => {
            let reports = memory_reports(tensor, available_memory(world_rank)?, s)?;
            if tensor.rank() == 0 {
                notes.push(format!(
                    "--tensor-split memory: rank {world_rank}'s tensor group offers {reports:?} MiB"
                ));
            }
            Some(reports)
        }
    };
    Ok(options)
}

fn split_text(split: &StageSplit) -> String {
    match split {
        StageSplit::Memory => "memory".to_owned(),
        StageSplit::Weights(LayerSplit::Weighted(w)) => {
            w.iter().map(u32::to_string).collect::<Vec<_>>().join(":")
        }
        StageSplit::Weights(LayerSplit::Even(n)) => format!("into {n} even stages"),
    }
}

impl FromStr for StageSplit {
    type Err = Error;

    /// `3:1` or `memory`.
    fn from_str(text: &str) -> Result<Self> {
        match text.trim() {
            "memory" => Ok(Self::Memory),
            weights => weights.parse().map(Self::Weights),
        }
    }
}

impl FromStr for TensorSplit {
    type Err = Error;

    /// `3:1` or `memory`.
    fn from_str(text: &str) -> Result<Self> {
        match text.trim() {
            "memory" => Ok(Self::Memory),
            weights => parse_weights("--tensor-split", weights).map(Self::Weights),
        }
    }
}
