//! Ragged layouts: routing rows between ranks by run-time counts.
//!
//! Expert parallelism sends each token (a row) to the rank that holds its
//! expert; how many rows go where is only known at run time. A
//! [`RoutingPlan`] holds this rank's per-destination counts and, after one
//! small exchange, the per-source counts it will receive; routing then is one
//! `all_to_all_v`, and [`ShardedArray::route_back`] is the reverse exchange.

use safemlx::{Array, Dtype, Stream};

use super::placement::{Placement, Ragged, Replicated};
use super::sharded::ShardedArray;
use super::Collective;
use crate::error::{Error, Result};

/// Who sends how many rows to whom, as this rank sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingPlan {
    send: Vec<usize>,
    recv: Vec<usize>,
}

impl RoutingPlan {
    /// Exchanges `send_counts` (rows this rank sends to each rank; on a
    /// `Mesh<N>` an array of exactly `N`) so every rank learns what it
    /// receives. Cost: one `all_gather` of `n` int32 counts per rank.
    pub fn exchange<C: Collective>(comm: &C, send_counts: &C::Counts, s: &Stream) -> Result<Self> {
        let send = send_counts.as_ref().to_vec();
        let n = comm.size();
        if send.len() != n {
            return Err(Error::Shape(format!(
                "a routing plan needs {n} send counts (one per rank), got {}",
                send.len()
            )));
        }
        let as_i32 = send
            .iter()
            .map(|&c| i32::try_from(c).map_err(|_| Error::ShapeOverflow { value: c }))
            .collect::<Result<Vec<_>>>()?;
        let mine = Array::from_slice(&as_i32, &[n as i32]);
        let all = crate::runtime::all_gather(&mine, comm.group(), s)?;
        let all = all.as_dtype(Dtype::Int32, s)?;
        let matrix = crate::runtime::read_back::<i32>(&all, "routing plan exchange")?;
        // Row `src` of the matrix is rank `src`'s send counts.
        let rank = comm.rank();
        let recv = (0..n)
            .map(|src| usize::try_from(matrix[src * n + rank]).unwrap_or(0))
            .collect();
        Ok(Self { send, recv })
    }

    /// Exchanges this rank's row counts per bucket (`bucket_counts`, e.g.
    /// rows per expert, laid out in bucket order) where rank `d` owns the
    /// buckets `owners[d]` (`(first, count)`, contiguous, in rank order,
    /// covering every bucket): every rank learns every rank's counts. The
    /// plan sends each rank the rows of its buckets; the returned matrix
    /// (row `src`: rank `src`'s `bucket_counts`) says how the rows a rank
    /// receives split by bucket. Cost: one `all_gather` of the bucket
    /// counts per rank.
    ///
    /// # Errors
    /// Those of [`from_bucket_matrix`](Self::from_bucket_matrix), or a
    /// count that does not fit an int32.
    pub fn exchange_buckets<C: Collective>(
        comm: &C,
        bucket_counts: &[usize],
        owners: &[(usize, usize)],
        s: &Stream,
    ) -> Result<(Self, Vec<Vec<usize>>)> {
        let (n, buckets) = (comm.size(), bucket_counts.len());
        let as_i32 = bucket_counts
            .iter()
            .map(|&c| i32::try_from(c).map_err(|_| Error::ShapeOverflow { value: c }))
            .collect::<Result<Vec<_>>>()?;
        let mine = Array::from_slice(&as_i32, &[buckets as i32]);
        let all = crate::runtime::all_gather(&mine, comm.group(), s)?;
        let all = all.as_dtype(Dtype::Int32, s)?;
        let flat = crate::runtime::read_back::<i32>(&all, "routing plan exchange")?;
        if flat.len() != n * buckets {
            return Err(Error::Native {
                operation: "routing plan exchange",
                message: format!("got {} counts, expected {}", flat.len(), n * buckets),
            });
        }
        let matrix: Vec<Vec<usize>> = (0..n)
            .map(|src| {
                flat[src * buckets..(src + 1) * buckets]
                    .iter()
                    .map(|&c| usize::try_from(c).unwrap_or(0))
                    .collect()
            })
            .collect();
        let plan = Self::from_bucket_matrix(comm, &matrix, owners)?;
        Ok((plan, matrix))
    }

    /// The plan of [`exchange_buckets`](Self::exchange_buckets) from a
    /// bucket matrix every rank already holds (row `src`: rank `src`'s
    /// counts per bucket, e.g. gathered together with other numbers in
    /// one `all_gather`): this rank sends each owner the rows of its
    /// buckets and receives from each source that source's rows of its
    /// own buckets. Every rank must pass the same matrix.
    ///
    /// # Errors
    /// A matrix without one row per rank or rows of different lengths, or
    /// owners that are not contiguous ranges covering the buckets in rank
    /// order (naming the rank).
    pub fn from_bucket_matrix<C: Collective>(
        comm: &C,
        matrix: &[Vec<usize>],
        owners: &[(usize, usize)],
    ) -> Result<Self> {
        let n = comm.size();
        let buckets = matrix.first().map_or(0, Vec::len);
        if matrix.len() != n || matrix.iter().any(|row| row.len() != buckets) {
            return Err(Error::Shape(format!(
                "a bucket matrix needs {n} rows (one per rank) of equal length, got {} rows",
                matrix.len()
            )));
        }
        let mut next = 0;
        for (d, &(first, count)) in owners.iter().enumerate() {
            if first != next {
                return Err(Error::Shape(format!(
                    "rank {d}'s buckets start at {first}, but the buckets before end at {next}: owners must be contiguous ranges in rank order"
                )));
            }
            next = first + count;
        }
        if owners.len() != n || next != buckets {
            return Err(Error::Shape(format!(
                "{} owner ranges covering {next} buckets for {n} ranks and {buckets} buckets: every bucket needs one owner",
                owners.len()
            )));
        }
        let sum = |row: &[usize], (first, count): (usize, usize)| -> usize {
            row[first..first + count].iter().sum()
        };
        let rank = comm.rank();
        let mine = owners[rank];
        Ok(Self {
            send: owners.iter().map(|&o| sum(&matrix[rank], o)).collect(),
            recv: matrix.iter().map(|row| sum(row, mine)).collect(),
        })
    }

    /// Rows this rank sends to each rank.
    pub fn send_counts(&self) -> &[usize] {
        &self.send
    }

    /// Rows this rank receives from each rank.
    pub fn recv_counts(&self) -> &[usize] {
        &self.recv
    }

    /// The plan of the reverse exchange (results back to where rows came from).
    pub fn reversed(&self) -> Self {
        Self {
            send: self.recv.clone(),
            recv: self.send.clone(),
        }
    }
}

/// Placements whose leading rows can be routed: `Sharded<0>` and `Ragged`.
#[diagnostic::on_unimplemented(
    message = "rows of a `{Self}` array cannot be routed",
    note = "routing sends leading rows between ranks: it applies to `Sharded<0>` or `Ragged` arrays"
)]
pub trait Routable: Placement {}

impl Routable for super::Sharded<0> {}
impl Routable for Ragged {}

impl<P: Routable, C: Collective> ShardedArray<P, C> {
    /// Sends `plan.send_counts()[d]` leading rows to rank `d` (rows laid out
    /// in destination order) and returns the received rows, in source
    /// order, as a `Ragged` array. Cost: one `all_to_all_v` of exactly the
    /// rows routed.
    pub fn route(&self, plan: &RoutingPlan, s: &Stream) -> Result<ShardedArray<Ragged, C>> {
        let local = crate::runtime::all_to_all_v(
            self.local(),
            &plan.send,
            &plan.recv,
            self.comm().group(),
            s,
        )?;
        let mut global = self.global_shape().to_vec();
        if let Some(rows) = global.first_mut() {
            *rows = -1; // Ragged: the logical row count is not tracked.
        }
        Ok(ShardedArray::new_unchecked(
            local,
            self.comm().clone(),
            global,
        ))
    }
}

impl<C: Collective> ShardedArray<Ragged, C> {
    /// Sends the rows back along `plan` (the plan used by
    /// [`route`](ShardedArray::route)): row `i` returns to the rank and
    /// position it came from.
    pub fn route_back<P: Routable>(
        &self,
        plan: &RoutingPlan,
        like: &ShardedArray<P, C>,
        s: &Stream,
    ) -> Result<ShardedArray<P, C>> {
        let back = plan.reversed();
        let local = crate::runtime::all_to_all_v(
            self.local(),
            &back.send,
            &back.recv,
            self.comm().group(),
            s,
        )?;
        Ok(ShardedArray::new_unchecked(
            local,
            self.comm().clone(),
            like.global_shape().to_vec(),
        ))
    }

    /// Gathers every rank's rows, in rank order, onto every rank. Cost: one
    /// count exchange and an `all_gather` padded to the most rows.
    pub fn gather_rows(&self, s: &Stream) -> Result<ShardedArray<Replicated, C>> {
        let comm = self.comm();
        let rows = usize::try_from(self.local().shape().first().copied().unwrap_or(0)).unwrap_or(0);
        let n = comm.size();
        let counts = Array::from_slice(&[rows as i32], &[1]);
        let all = crate::runtime::all_gather(&counts, comm.group(), s)?;
        let lengths: Vec<usize> = crate::runtime::read_back::<i32>(&all, "row count exchange")?
            .into_iter()
            .map(|c| usize::try_from(c).unwrap_or(0))
            .collect();
        debug_assert_eq!(lengths.len(), n);
        let local = comm.all_gather(self.local(), 0, &lengths, s)?;
        let mut global = self.local().shape().to_vec();
        if let Some(first) = global.first_mut() {
            *first = i32::try_from(lengths.iter().sum::<usize>())
                .map_err(|_| Error::ShapeOverflow { value: 0 })?;
        }
        Ok(ShardedArray::new_unchecked(local, comm.clone(), global))
    }
}
