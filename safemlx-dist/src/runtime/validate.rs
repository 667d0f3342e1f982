//! Argument checks that run before any native call.
//!
//! Pure functions over shapes, sizes and counts, so every message (including
//! the overflow ones no real array can reach) is unit-tested directly.

use crate::error::{AllToAllVError, Error, PeerRole, Result};

/// `all_gather` on a group of `size > 1`: the output's first dimension
/// (`first_dim * size`, a scalar counting as one row) must fit in `i32`.
pub(crate) fn all_gather(shape: &[i32], size: usize) -> Result<()> {
    let first = i64::from(shape.first().copied().unwrap_or(1));
    let size = i32::try_from(size).map_err(|_| Error::GroupSizeOverflow)?;
    first
        .checked_mul(i64::from(size))
        .filter(|rows| i32::try_from(*rows).is_ok())
        .map(|_| ())
        .ok_or(Error::AllGatherOverflow)
}

/// `sum_scatter` on a group of `size > 1`.
pub(crate) fn sum_scatter(shape: &[i32], size: usize) -> Result<()> {
    let Some(&first) = shape.first() else {
        return Err(Error::SumScatterScalar);
    };
    if shape.iter().any(|d| *d < 0) {
        return Err(Error::SumScatterNegativeShape);
    }
    if first as usize % size != 0 {
        return Err(Error::SumScatterIndivisible {
            dim: i64::from(first),
            size,
        });
    }
    Ok(())
}

/// A point-to-point peer: not on a singleton, in range, fits `i32`.
pub(crate) fn peer(peer: usize, size: usize, role: PeerRole) -> Result<i32> {
    if size == 1 {
        return Err(Error::PeerOnSingleton { role });
    }
    if peer >= size {
        return Err(Error::PeerOutOfRange { role, peer, size });
    }
    i32::try_from(peer).map_err(|_| Error::PeerOverflow { role })
}

/// `recv`'s shape: no negative dimension.
pub(crate) fn recv_shape(shape: &[i32]) -> Result<()> {
    if shape.iter().any(|d| *d < 0) {
        return Err(Error::NegativeReceiveShape);
    }
    Ok(())
}

/// The native form of validated `all_to_all_v` counts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AllToAllVCounts {
    pub(crate) send: Vec<i64>,
    pub(crate) recv: Vec<i64>,
}

/// Every `all_to_all_v` check of `spec/runtime.md`, in its order.
pub(crate) fn all_to_all_v(
    shape: &[i32],
    item_size: usize,
    rank: usize,
    size: usize,
    send_counts: &[usize],
    recv_counts: &[usize],
) -> Result<AllToAllVCounts, AllToAllVError> {
    use AllToAllVError as E;
    // 1. a leading row dimension
    let (&rows, trailing) = shape.split_first().ok_or(E::ScalarInput)?;
    // 2. one count per rank
    if send_counts.len() != size || recv_counts.len() != size {
        return Err(E::CountArity {
            size,
            send: send_counts.len(),
            recv: recv_counts.len(),
        });
    }
    // 3. sums
    let sum = |counts: &[usize]| counts.iter().try_fold(0usize, |a, c| a.checked_add(*c));
    let send_sum = sum(send_counts).ok_or(E::SendSumOverflow)?;
    let recv_sum = sum(recv_counts).ok_or(E::RecvSumOverflow)?;
    // 4. and 5. the input's rows
    let rows = usize::try_from(rows).map_err(|_| E::NegativeRows)?;
    if send_sum != rows {
        return Err(E::SendSumMismatch {
            sum: send_sum,
            rows,
        });
    }
    // 6. output rows
    if i32::try_from(recv_sum).is_err() {
        return Err(E::OutputRowsOverflow);
    }
    // 7. byte sizes
    let row_bytes = trailing.iter().try_fold(item_size, |bytes, d| {
        let d = usize::try_from(*d).map_err(|_| E::NegativeTrailingShape)?;
        bytes.checked_mul(d).ok_or(E::RowBytesOverflow)
    })?;
    recv_sum
        .checked_mul(row_bytes)
        .ok_or(E::OutputBytesOverflow)?;
    for (peer, (send, recv)) in send_counts.iter().zip(recv_counts).enumerate() {
        send.checked_mul(row_bytes)
            .ok_or(E::SendBytesOverflow { peer })?;
        recv.checked_mul(row_bytes)
            .ok_or(E::RecvBytesOverflow { peer })?;
    }
    // 8. a singleton keeps what it has
    if size == 1 && send_sum != recv_sum {
        return Err(E::SingletonMismatch);
    }
    // 9. what a rank sends itself is what it receives from itself
    let (own_send, own_recv) = (send_counts[rank], recv_counts[rank]);
    if own_send != own_recv {
        return Err(E::SelfMismatch {
            send: own_send,
            recv: own_recv,
        });
    }
    // 10. the native counts are i64
    let to_i64 = |counts: &[usize], error: E| {
        counts
            .iter()
            .map(|c| i64::try_from(*c).map_err(|_| error.clone()))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(AllToAllVCounts {
        send: to_i64(send_counts, E::SendCountOverflow)?,
        recv: to_i64(recv_counts, E::RecvCountOverflow)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a2av(shape: &[i32], send: &[usize], recv: &[usize]) -> String {
        all_to_all_v(shape, 4, 0, send.len().max(1), send, recv)
            .map(|_| String::from("ok"))
            .unwrap_or_else(|e| Error::from(e).to_string())
    }

    #[test]
    fn all_to_all_v_messages_in_spec_order() {
        assert_eq!(
            a2av(&[], &[0], &[0]),
            "all_to_all_v input must have a leading row dimension"
        );
        assert_eq!(
            all_to_all_v(&[2], 4, 0, 2, &[2], &[1, 1]).map_err(|e| Error::from(e).to_string()),
            Err("all_to_all_v requires 2 send counts and receive counts, got 1 and 2".into())
        );
        assert_eq!(
            a2av(&[2], &[usize::MAX, 1], &[1, 1]),
            "all_to_all_v send count sum overflowed usize"
        );
        assert_eq!(
            a2av(&[2], &[1, 1], &[usize::MAX, 1]),
            "all_to_all_v receive count sum overflowed usize"
        );
        assert_eq!(
            a2av(&[-1], &[0], &[0]),
            "all_to_all_v input row count is negative"
        );
        assert_eq!(
            a2av(&[3, 2], &[1, 1], &[1, 1]),
            "all_to_all_v send count sum 2 does not match input row count 3"
        );
        assert_eq!(
            a2av(&[2], &[1, 1], &[1, i32::MAX as usize]),
            "all_to_all_v output row count exceeds i32"
        );
        assert_eq!(
            a2av(&[2, -3], &[1, 1], &[1, 1]),
            "all_to_all_v trailing shape is negative"
        );
        assert_eq!(
            a2av(&[2, i32::MAX, i32::MAX, i32::MAX], &[1, 1], &[1, 1]),
            "all_to_all_v row byte size overflowed usize"
        );
        assert_eq!(
            a2av(
                &[2, i32::MAX, i32::MAX],
                &[1, 1],
                &[1, i32::MAX as usize - 1]
            ),
            "all_to_all_v output byte size overflowed usize"
        );
        assert_eq!(
            a2av(&[0, 2], &[0, 0], &[0, 0]).as_str(),
            "ok",
            "empty exchanges are valid"
        );
    }

    #[test]
    fn all_to_all_v_singleton_and_self_checks() {
        assert_eq!(
            a2av(&[2], &[2], &[3]),
            "all_to_all_v singleton send and receive counts must match"
        );
        assert_eq!(
            all_to_all_v(&[3], 4, 1, 2, &[1, 2], &[2, 1]).map_err(|e| Error::from(e).to_string()),
            Err("all_to_all_v self send count 2 does not match self receive count 1".into())
        );
        assert_eq!(
            all_to_all_v(&[3, 2], 2, 1, 2, &[1, 2], &[4, 2]),
            Ok(AllToAllVCounts {
                send: vec![1, 2],
                recv: vec![4, 2]
            })
        );
    }

    #[test]
    fn gather_scatter_and_peer_messages() {
        let msg = |r: Result<_>| r.map(|_| ()).unwrap_err().to_string();
        assert_eq!(
            msg(all_gather(&[i32::MAX / 2 + 1], 2)),
            "all-gather output's first dimension exceeds i32"
        );
        assert!(all_gather(&[], 4).is_ok());
        assert_eq!(
            msg(sum_scatter(&[], 2)),
            "sum-scatter requires a non-scalar input"
        );
        assert_eq!(
            msg(sum_scatter(&[4, -1], 2)),
            "sum-scatter input shape contains a negative size"
        );
        assert_eq!(
            msg(sum_scatter(&[10, 3], 4)),
            "sum-scatter input's first dimension (10) is not divisible by group size (4)"
        );
        assert_eq!(
            msg(peer(0, 1, PeerRole::Destination).map(|_| ())),
            "cannot use a destination rank with a singleton distributed group"
        );
        assert_eq!(
            msg(peer(4, 4, PeerRole::Source).map(|_| ())),
            "invalid source rank 4 for distributed group of size 4"
        );
        assert_eq!(
            msg(peer(usize::MAX - 1, usize::MAX, PeerRole::Source).map(|_| ())),
            "source rank does not fit in i32"
        );
        assert_eq!(
            msg(recv_shape(&[2, -1])),
            "receive shape dimensions must be non-negative"
        );
    }
}
