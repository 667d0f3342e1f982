//! A device mesh: named axes over the world group, and each axis's subgroup
//! on every backend.

use std::fmt;

use super::backend::Backend;
use super::chain::is_consecutive;
use super::group::Group;
use crate::error::{Error, Result};

/// Named axes over the world group (`pp` x `tp`, or any number of axes),
/// with this rank's subgroup along each.
///
/// **Rank order.** World ranks are positions on MLX's ring, and the mesh
/// visits its coordinates in boustrophedon order: the last axis fastest,
/// each inner block walked backwards when the coordinate outside it is odd
/// (`mesh_coords`). Consecutive ranks then differ in one coordinate by one,
/// so each subgroup of the last axis is a run of consecutive ranks, and on
/// `2 x 2` the first axis's pairs (`0, 3` and `1, 2`) are neighbours too.
///
/// **Subgroups.** An axis of one rank is [`Group::local`]; an axis that
/// spans the world is the world group. Otherwise MPI and NCCL split the
/// world group (MLX's own split); on ring (and JACCL), which cannot split,
/// the subgroup's collectives are composed of `send`/`recv` between
/// consecutive ranks, its members only taking part. Members that are not
/// consecutive on the ring (no mesh of at most 4 ranks has them) are
/// relayed through the world's `all_to_all_v`: every world rank then
/// calls that axis's collectives at the same time, each for its own
/// subgroup.
///
/// ```
/// use safemlx_dist::{mesh_coords, DeviceMesh, Group};
///
/// assert_eq!(
///     (0..4).map(|r| mesh_coords(r, &[2, 2])).collect::<Vec<_>>(),
///     [[0, 0], [0, 1], [1, 1], [1, 0]]
/// );
/// let mesh = DeviceMesh::new(&Group::local(), &[("pp", 1), ("tp", 1)])?;
/// assert_eq!((mesh.coord("tp")?, mesh.axis("pp")?.size()), (0, 1));
/// assert_eq!(
///     DeviceMesh::new(&Group::local(), &[("pp", 2), ("tp", 2)]).unwrap_err().to_string(),
///     "mesh pp=2,tp=2 needs 4 ranks (2 x 2) but the group has 1; launch it with -n 4 or change the axes"
/// );
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DeviceMesh {
    world: Group,
    names: Vec<String>,
    sizes: Vec<usize>,
    coords: Vec<usize>,
    groups: Vec<Group>,
}

/// The mesh coordinates of world rank `rank` on axes of `sizes`, in the
/// boustrophedon order [`DeviceMesh`] documents.
pub fn mesh_coords(rank: usize, sizes: &[usize]) -> Vec<usize> {
    let mut coords = Vec::with_capacity(sizes.len());
    let mut position = rank;
    for (axis, size) in sizes.iter().enumerate() {
        let inner: usize = sizes[axis + 1..].iter().product::<usize>().max(1);
        let coord = (position / inner).min(size.saturating_sub(1));
        let mut within = position % inner;
        if coord % 2 == 1 {
            within = inner - 1 - within;
        }
        coords.push(coord);
        position = within;
    }
    coords
}

impl DeviceMesh {
    /// The mesh of `axes` (name, size; the first outermost) over `world`.
    /// Every rank of `world` builds it with the same axes.
    ///
    /// # Errors
    /// No axis, an empty or repeated name, a zero size, sizes whose product
    /// is not the group's size (naming both), or the split's error.
    pub fn new(world: &Group, axes: &[(&str, usize)]) -> Result<Self> {
        let names: Vec<String> = axes.iter().map(|(n, _)| (*n).to_owned()).collect();
        let sizes: Vec<usize> = axes.iter().map(|(_, s)| *s).collect();
        let described = describe(&names, &sizes);
        let bad = |why: String| Error::Setting(format!("mesh {described}: {why}"));
        if axes.is_empty() {
            return Err(bad("a mesh needs at least one axis".to_owned()));
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            if name.is_empty() || names[..i].iter().any(|n| n == name) {
                return Err(bad(format!("axis name `{name}` is empty or repeated")));
            }
            if *size == 0 {
                return Err(bad(format!("axis `{name}` has no ranks")));
            }
        }
        let ranks: usize = sizes.iter().product();
        if ranks != world.size() {
            let product: Vec<String> = sizes.iter().map(ToString::to_string).collect();
            return Err(Error::Setting(format!(
                "mesh {described} needs {ranks} ranks ({}) but the group has {}; launch it with -n {ranks} or change the axes",
                product.join(" x "),
                world.size()
            )));
        }
        let table: Vec<Vec<usize>> = (0..ranks).map(|r| mesh_coords(r, &sizes)).collect();
        let coords = table[world.rank()].clone();
        // The world ranks of the subgroup along `axis` through `at`.
        let members = |axis: usize, at: &[usize]| -> Vec<usize> {
            (0..sizes[axis])
                .filter_map(|c| {
                    let mut at = at.to_vec();
                    at[axis] = c;
                    table.iter().position(|t| *t == at)
                })
                .collect()
        };
        let mut groups = Vec::with_capacity(axes.len());
        for (axis, name) in names.iter().enumerate() {
            // One subgroup of the axis not consecutive on the ring: all of
            // them relay, since a relay is a collective of the whole world.
            let relayed = table
                .iter()
                .any(|at| !is_consecutive(&members(axis, at), ranks));
            let mine = members(axis, &coords);
            let group = axis_group(world, &mine, coords[axis], relayed)
                .map_err(|e| bad(format!("axis `{name}` (world ranks {mine:?}): {e}")))?;
            groups.push(group);
        }
        Ok(Self {
            world: world.clone(),
            names,
            sizes,
            coords,
            groups,
        })
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.names.iter().position(|n| n == name).ok_or_else(|| {
            Error::Setting(format!(
                "the mesh has no axis `{name}`; its axes are {self}"
            ))
        })
    }

    /// This rank's subgroup along axis `name`: the ranks whose coordinates
    /// differ from this one's only there, ranked by their coordinate on it.
    ///
    /// # Errors
    /// An axis the mesh does not have, naming its axes.
    pub fn axis(&self, name: &str) -> Result<&Group> {
        Ok(&self.groups[self.index(name)?])
    }

    /// This rank's coordinate on axis `name`.
    ///
    /// # Errors
    /// An axis the mesh does not have.
    pub fn coord(&self, name: &str) -> Result<usize> {
        Ok(self.coords[self.index(name)?])
    }

    /// This rank's coordinates, one per axis in the order given.
    pub fn coords(&self) -> &[usize] {
        &self.coords
    }

    /// The axis names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The axis sizes, in the order given.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The group the mesh spans.
    pub fn world(&self) -> &Group {
        &self.world
    }
}

/// The subgroup of `members` (world ranks by axis coordinate) holding this
/// rank as member `me`.
fn axis_group(world: &Group, members: &[usize], me: usize, relayed: bool) -> Result<Group> {
    if members.len() == 1 {
        return Ok(Group::local());
    }
    if members.len() == world.size() && members.iter().enumerate().all(|(i, &m)| i == m) {
        return Ok(world.clone());
    }
    if matches!(world.backend(), Backend::Mpi | Backend::Nccl) {
        // Colour: the subgroup's first member, the same on all its ranks.
        let color = i32::try_from(members[0]).unwrap_or(i32::MAX);
        return Ok(world
            .split(color, i32::try_from(me).ok())?
            .labelled_as_subgroup_of(world, members));
    }
    world
        .subgroup(members.to_vec(), me, relayed)
        .ok_or_else(|| {
            Error::Setting(format!(
                "a subgroup of {} of the {} ranks cannot be composed",
                members.len(),
                world.size()
            ))
        })
}

fn describe(names: &[String], sizes: &[usize]) -> String {
    let parts: Vec<String> = names
        .iter()
        .zip(sizes)
        .map(|(n, s)| format!("{n}={s}"))
        .collect();
    parts.join(",")
}

impl fmt::Display for DeviceMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(&self.names, &self.sizes))
    }
}
