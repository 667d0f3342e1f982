//! Gradients through the typed layer.
//!
//! A gradient here is the gradient of one logical loss, a `Replicated`
//! scalar that every rank computes identically. Each value's gradient then
//! has the placement of the value: a `Replicated` value's is the whole
//! gradient on every rank, a `Sharded` value's is this rank's chunk of it,
//! a `Partial` value's is the (replicated) gradient of the sum. MLX's own
//! rules give exactly that for `all_sum` (`Partial -> Replicated`: the
//! gradient passes unchanged), `all_gather` (`Sharded -> Replicated`: this
//! rank's slice of the gradient) and `all_to_all_v` (the reverse exchange).
//!
//! What MLX cannot see is a `Replicated` value entering computation that
//! differs by rank: multiplied by a `Sharded` weight (column parallel), by a
//! `Partial`, or sliced to this rank's chunk. On each rank the local
//! gradient is then only this rank's share of the whole one, and summing
//! the shares over the ranks is the framework's job (Megatron's `f`, MLX
//! Python's `sum_gradients`). While [`value_and_grad`] traces, the typed
//! ops insert that sum at every such boundary (an identity whose gradient
//! is an `all_sum`), so a sharded model written with the typed layer gets
//! placement-correct gradients by construction; outside of it they insert
//! nothing, and inference pays nothing.

use std::cell::RefCell;

use safemlx::{Array, Stream};

use crate::error::{Error, Result};
use crate::runtime;
pub use crate::runtime::is_tracing;
use crate::runtime::Tracing;
use crate::typed::{Collective, Placement, Replicated, ShardedArray};
/// Derives [`Parameters`](trait@Parameters) for a struct of parts or an
/// enum of them (see the trait).
pub use safemlx_dist_macros::Parameters;

/// `x` unchanged; while tracing a gradient on a group of several ranks, its
/// gradient is summed over the ranks (one `all_sum` in the backward pass).
///
/// The typed ops call this where a `Replicated` value meets rank-dependent
/// computation; call it yourself where you leave the typed layer (with
/// [`ShardedArray::local`]) and use a replicated array in computation that
/// differs by rank.
///
/// # Errors
/// An MLX error.
pub fn sum_gradients<C: Collective>(x: &Array, comm: &C, s: &Stream) -> Result<Array> {
    runtime::sum_gradients(x, comm.group(), s)
}

/// The loss that `loss` computes from `params` and its gradient with
/// respect to each of them, in order.
///
/// `loss` receives the parameters' local arrays (build the model's
/// `ShardedArray`s from them with [`ShardedArray::from_local`]) and returns
/// the loss, a `Replicated` scalar. Each gradient has the placement of its
/// parameter: this rank's chunk for a `Sharded` weight, the whole gradient,
/// identical on every rank, for a `Replicated` one.
///
/// ```no_run
/// use safemlx::Stream;
/// use safemlx_dist::grad::value_and_grad;
/// use safemlx_dist::typed::{Replicated, Sharded};
/// use safemlx_dist::{Group, ShardedArray};
///
/// # fn run(group: &Group, x: ShardedArray<Replicated>, w: ShardedArray<Sharded<1>>, s: &Stream) -> safemlx_dist::Result<()> {
/// let (loss, grads) = value_and_grad(&[w.local().clone()], |p| {
///     let w = ShardedArray::<Sharded<1>>::from_local(p[0].clone(), group, w.global_shape())?;
///     // column parallel, then every column back on every rank
///     let y = x.matmul(&w, s)?.redistribute::<Replicated>(s)?;
///     y.mul(&y, s)?.sum_all(s)
/// })?;
/// // grads[0]: this rank's columns of d loss / d w
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `loss` returned, a loss that is not a scalar, or an op without a
/// gradient rule (MLX names it).
pub fn value_and_grad<F>(params: &[Array], mut loss: F) -> Result<(Array, Vec<Array>)>
where
    F: FnMut(&[Array]) -> Result<ShardedArray<Replicated>>,
{
    let failure: RefCell<Option<Error>> = RefCell::new(None);
    let argnums: Vec<i32> = (0..params.len())
        .map(|i| i32::try_from(i).map_err(|_| Error::ShapeOverflow { value: i }))
        .collect::<Result<_>>()?;
    let _tracing = Tracing::enter();
    let result = {
        let traced =
            |arrays: &[Array]| -> std::result::Result<Vec<Array>, safemlx::error::Exception> {
                let value = loss(arrays).and_then(|l| {
                if l.global_shape().is_empty() {
                    Ok(l.local().clone())
                } else {
                    Err(Error::Shape(format!(
                        "the loss must be a scalar (global shape []), got global shape {:?}; sum it with `.sum_all()`",
                        l.global_shape()
                    )))
                }
            });
                match value {
                    Ok(v) => Ok(vec![v]),
                    Err(e) => {
                        failure.replace(Some(e));
                        Err("the loss failed".into())
                    }
                }
            };
        let mut vg = safemlx::transforms::value_and_grad_with_argnums(traced, argnums.as_slice());
        vg(params)
    };
    if let Some(error) = failure.take().or_else(runtime::take_vjp_error) {
        return Err(error);
    }
    let (mut values, grads) = result?;
    Ok((values.remove(0), grads))
}

/// One trainable array of a model: this rank's local array, and how many
/// ranks hold the same array (1 for this rank's own chunk of a `Sharded`
/// parameter, the group's size for a `Replicated` one, whose gradient is
/// the same on every rank; a KV head replicated on the ranks that share
/// it, in between). The global norm counts each copy once.
#[derive(Debug, Clone)]
pub struct Parameter {
    /// This rank's local array.
    pub local: Array,
    /// Ranks holding this same array, at least 1 (1 when `blocks` says).
    pub copies: usize,
    /// When the array's blocks along an axis are held by different numbers
    /// of ranks (the KV heads of a balanced head split, one on this rank
    /// alone, one shared): the axis and each block's holders.
    pub blocks: Option<(usize, Vec<usize>)>,
}

impl Parameter {
    /// The parameter held by `x`.
    pub fn of<P: Placement, C: Collective>(x: &ShardedArray<P, C>) -> Self {
        Self {
            local: x.local().clone(),
            copies: x.holders(),
            blocks: x.block_holders().map(|(axis, h)| (axis, h.to_vec())),
        }
    }

    /// This rank's own chunk of a parameter (one copy).
    pub fn own(local: Array) -> Self {
        Self {
            local,
            copies: 1,
            blocks: None,
        }
    }

    /// The sum of `values`' squares (this parameter's local array or its
    /// gradient) with each copy counted once: divided by `copies`, or
    /// each block by its holders.
    ///
    /// # Errors
    /// An MLX error.
    pub fn counted_squares(&self, values: &Array, copies: usize, s: &Stream) -> Result<Array> {
        let squares = |a: &Array| -> Result<Array> { Ok(a.square(s)?.sum(None, s)?) };
        let Some((axis, holders)) = &self.blocks else {
            let sq = squares(values)?;
            return Ok(match copies {
                0 | 1 => sq,
                k => sq.divide(Array::from_f32(k as f32), s)?,
            });
        };
        let len = values.shape().get(*axis).copied().unwrap_or(0);
        let block = usize::try_from(len).unwrap_or(0) / holders.len().max(1);
        let mut total = Array::from_f32(0.0);
        for (i, &k) in holders.iter().enumerate() {
            let part = runtime::slice_axis(values, *axis, i * block, block, s)?;
            let sq = squares(&part)?.divide(Array::from_f32(k.max(1) as f32), s)?;
            total = total.add(&sq, s)?;
        }
        Ok(total)
    }
}

/// A model part that is not trained: it lists no parameters, and a
/// model's gradients and updates leave it as it is. MXFP4 experts that a
/// layout cannot keep quantized (and so dequantizes at load) are held so:
/// as frozen as the stored ones, whatever the rank count.
#[derive(Debug)]
pub struct Frozen<T>(std::sync::Arc<T>);

impl<T> Frozen<T> {
    /// `part`, frozen.
    pub fn new(part: T) -> Self {
        Self(std::sync::Arc::new(part))
    }

    /// The part.
    pub fn get(&self) -> &T {
        &self.0
    }
}

impl<T> Clone for Frozen<T> {
    fn clone(&self) -> Self {
        Self(std::sync::Arc::clone(&self.0))
    }
}

impl<T> Parameters for Frozen<T> {
    fn parameters(&self) -> Vec<Parameter> {
        Vec::new()
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        check_count(0, locals.len())?;
        Ok(self.clone())
    }
}

/// A model whose trainable arrays can be listed and replaced: what
/// [`value_and_grad_of`] differentiates and an optimizer updates.
/// `#[sharded]` structs implement it (fields in declaration order); tuples
/// of models do too, and `#[derive(Parameters)]` writes it for a struct
/// of such parts (or an enum of them).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a model part: it lists no parameters",
    label = "not `Parameters`",
    note = "a field that holds no trainable arrays (a configuration, a count, a name) is marked `#[parameters(skip)]` and cloned"
)]
pub trait Parameters: Sized {
    /// The trainable arrays, in a fixed order.
    fn parameters(&self) -> Vec<Parameter>;

    /// The same model with the parameters' local arrays replaced by
    /// `locals` (in the order of [`parameters`](Self::parameters)), e.g.
    /// by their gradients or their updated values.
    ///
    /// # Errors
    /// A count or a local shape other than the model's.
    fn with_parameters(&self, locals: &[Array]) -> Result<Self>;
}

/// `got` arrays for a model of `want` parameters.
///
/// # Errors
/// When they differ.
#[doc(hidden)]
pub fn check_count(want: usize, got: usize) -> Result<()> {
    if want == got {
        Ok(())
    } else {
        Err(Error::Shape(format!(
            "the model has {want} parameters but {got} arrays were given"
        )))
    }
}

/// `locals` cut into consecutive runs of `counts` arrays, for a model made
/// of parts.
///
/// # Errors
/// When the counts do not add up to the arrays given.
pub fn split_locals<'a>(locals: &'a [Array], counts: &[usize]) -> Result<Vec<&'a [Array]>> {
    check_count(counts.iter().sum(), locals.len())?;
    let mut start = 0;
    Ok(counts
        .iter()
        .map(|&n| {
            start += n;
            &locals[start - n..start]
        })
        .collect())
}

/// A typed array is one parameter: this rank's part (its split kept).
impl<P: Placement, C: Collective> Parameters for ShardedArray<P, C> {
    fn parameters(&self) -> Vec<Parameter> {
        vec![Parameter::of(self)]
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        check_count(1, locals.len())?;
        let local = locals[0].clone();
        let array = match self.axis_split() {
            Some(split) => {
                ShardedArray::from_local_split(local, self.comm(), self.global_shape(), &split)?
            }
            None => ShardedArray::from_local(local, self.comm(), self.global_shape())?,
        };
        // A copy of a shared part stays one (see `ShardedArray::copy_of`).
        Ok(array.with_copies_of(self))
    }
}

/// A float weight is one parameter (this rank's part); a quantized one
/// none: it stays frozen.
impl<P: crate::typed::QuantizedPlacement> Parameters for crate::typed::LinearWeight<P> {
    fn parameters(&self) -> Vec<Parameter> {
        match self {
            Self::Float(w) => w.parameters(),
            Self::Quantized(_) => Vec::new(),
        }
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        match self {
            Self::Float(w) => Ok(Self::Float(w.with_parameters(locals)?)),
            Self::Quantized(_) => {
                check_count(0, locals.len())?;
                Ok(self.clone())
            }
        }
    }
}

/// A boxed part is the part.
impl<T: Parameters> Parameters for Box<T> {
    fn parameters(&self) -> Vec<Parameter> {
        self.as_ref().parameters()
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        Ok(Box::new(self.as_ref().with_parameters(locals)?))
    }
}

/// An absent part (an untied LM head) has none.
impl<T: Parameters> Parameters for Option<T> {
    fn parameters(&self) -> Vec<Parameter> {
        self.as_ref().map_or_else(Vec::new, Parameters::parameters)
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        match self {
            Some(m) => Ok(Some(m.with_parameters(locals)?)),
            None => {
                check_count(0, locals.len())?;
                Ok(None)
            }
        }
    }
}

impl<A: Parameters, B: Parameters> Parameters for (A, B) {
    fn parameters(&self) -> Vec<Parameter> {
        let mut all = self.0.parameters();
        all.extend(self.1.parameters());
        all
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        let counts = [self.0.parameters().len(), self.1.parameters().len()];
        let parts = split_locals(locals, &counts)?;
        Ok((
            self.0.with_parameters(parts[0])?,
            self.1.with_parameters(parts[1])?,
        ))
    }
}

impl<T: Parameters> Parameters for Vec<T> {
    fn parameters(&self) -> Vec<Parameter> {
        self.iter().flat_map(Parameters::parameters).collect()
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        let counts: Vec<usize> = self.iter().map(|m| m.parameters().len()).collect();
        let parts = split_locals(locals, &counts)?;
        self.iter()
            .zip(parts)
            .map(|(m, part)| m.with_parameters(part))
            .collect()
    }
}

/// [`value_and_grad`] over a model's parameters: the loss, and the
/// gradients as a model of the same type, each gradient in its parameter's
/// place and placement (an `Mlp` of gradients for an `Mlp`).
///
/// # Errors
/// As [`value_and_grad`].
pub fn value_and_grad_of<M, F>(model: &M, mut loss: F) -> Result<(Array, M)>
where
    M: Parameters,
    F: FnMut(&M) -> Result<ShardedArray<Replicated>>,
{
    let locals: Vec<Array> = model.parameters().into_iter().map(|p| p.local).collect();
    let (value, grads) = value_and_grad(&locals, |p| loss(&model.with_parameters(p)?))?;
    Ok((value, model.with_parameters(&grads)?))
}

/// The gradients averaged over the ranks of `group`, data parallelism's
/// reduction (MLX Python's `average_gradients`): each rank computed `grads`
/// on its own data with the same model. The arrays travel in buckets of
/// about `bucket_bytes` (one `all_sum` per bucket rather than per array;
/// an array larger than a bucket goes alone).
///
/// With tensor parallelism too, `group` is the data-parallel group (the
/// ranks holding the same shards), made with
/// [`Group::split`](crate::runtime::Group::split); MLX's ring backend cannot split
/// a group, so data x tensor parallelism needs MPI.
///
/// # Errors
/// A `bucket_bytes` of 0, or an MLX error.
pub fn average_gradients<M: Parameters>(
    grads: &M,
    group: &crate::runtime::Group,
    bucket_bytes: usize,
    s: &Stream,
) -> Result<M> {
    if bucket_bytes == 0 {
        return Err(Error::Setting(
            "average_gradients: bucket_bytes must be at least 1".to_owned(),
        ));
    }
    let locals: Vec<Array> = grads.parameters().into_iter().map(|p| p.local).collect();
    if group.size() == 1 {
        return grads.with_parameters(&locals);
    }
    let n = Array::from_f32(group.size() as f32);
    let mut averaged: Vec<Array> = Vec::with_capacity(locals.len());
    let mut start = 0;
    while start < locals.len() {
        // The next bucket: arrays of one dtype up to `bucket_bytes`.
        let mut end = start + 1;
        let mut bytes = locals[start].nbytes();
        while end < locals.len()
            && locals[end].dtype() == locals[start].dtype()
            && bytes + locals[end].nbytes() <= bucket_bytes
        {
            bytes += locals[end].nbytes();
            end += 1;
        }
        let flat: Vec<Array> = locals[start..end]
            .iter()
            .map(|a| a.reshape(&[-1], s))
            .collect::<std::result::Result<_, _>>()?;
        let sizes: Vec<i32> = flat.iter().map(|a| a.shape()[0]).collect();
        let joined = safemlx::ops::concatenate_axis(&flat, 0, s)?;
        let mean = crate::runtime::all_sum(&joined, group, s)?.divide(&n, s)?;
        let mut offset = 0;
        for (a, &len) in locals[start..end].iter().zip(&sizes) {
            let piece = crate::runtime::slice_axis(&mean, 0, offset, len as usize, s)?;
            averaged.push(piece.reshape(a.shape(), s)?);
            offset += len as usize;
        }
        start = end;
    }
    grads.with_parameters(&averaged)
}
