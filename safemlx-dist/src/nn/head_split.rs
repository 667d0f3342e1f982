//! Which query and KV heads a rank holds: query heads follow their KV
//! head, KV heads are split by the chunk rule, and with more ranks than KV
//! heads each KV head is replicated on the ranks that split its query
//! heads (see `gqa.rs`).

use crate::error::{Error, Result};
use crate::typed::chunk;

/// The query and KV heads one rank holds, as `(first, count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSplit {
    /// This rank's query heads.
    pub query: (usize, usize),
    /// This rank's KV heads (with `n > kv`, one head shared with other ranks).
    pub kv: (usize, usize),
}

impl HeadSplit {
    /// The heads rank `rank` of `n` holds of `heads` query heads grouped
    /// over `kv_heads` KV heads (see the module's rules).
    ///
    /// # Errors
    /// No heads, or a query-head count that is not a multiple of the KV
    /// heads (each KV head serves the same number of query heads).
    pub fn new(heads: usize, kv_heads: usize, rank: usize, n: usize) -> Result<Self> {
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::Shape(format!(
                "grouped-query attention with {heads} query heads and {kv_heads} KV heads: the query heads must be a non-zero multiple of the KV heads"
            )));
        }
        let group = heads / kv_heads;
        if n <= kv_heads {
            let (first, count) = chunk(kv_heads, rank, n);
            return Ok(Self {
                query: (first * group, count * group),
                kv: (first, count),
            });
        }
        // More ranks than KV heads: KV head `k` is held by the ranks of
        // chunk(n, k, kv_heads), which split its query heads among them.
        let kv = (0..kv_heads)
            .find(|&k| {
                let (first, count) = chunk(n, k, kv_heads);
                (first..first + count).contains(&rank)
            })
            .unwrap_or(kv_heads - 1);
        let (first_rank, sharing) = chunk(n, kv, kv_heads);
        let (first, count) = chunk(group, rank - first_rank, sharing);
        Ok(Self {
            query: (kv * group + first, count),
            kv: (kv, 1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::HeadSplit;

    fn splits(heads: usize, kv: usize, n: usize) -> Vec<((usize, usize), (usize, usize))> {
        (0..n)
            .map(|r| {
                let s = HeadSplit::new(heads, kv, r, n).unwrap();
                (s.query, s.kv)
            })
            .collect()
    }

    #[test]
    fn query_heads_follow_their_kv_head() {
        // SmolLM2-135M: 9 query heads over 3 KV heads.
        assert_eq!(splits(9, 3, 1), [((0, 9), (0, 3))]);
        assert_eq!(splits(9, 3, 2), [((0, 6), (0, 2)), ((6, 3), (2, 1))]);
        assert_eq!(
            splits(9, 3, 3),
            [((0, 3), (0, 1)), ((3, 3), (1, 1)), ((6, 3), (2, 1))]
        );
        // More ranks than KV heads: KV head 0 is replicated on ranks 0 and 1.
        assert_eq!(
            splits(9, 3, 4),
            [
                ((0, 2), (0, 1)),
                ((2, 1), (0, 1)),
                ((3, 3), (1, 1)),
                ((6, 3), (2, 1))
            ]
        );
        // More ranks than query heads: rank 2 holds none.
        assert_eq!(
            splits(2, 1, 3),
            [((0, 1), (0, 1)), ((1, 1), (0, 1)), ((2, 0), (0, 1))]
        );
        assert!(HeadSplit::new(9, 2, 0, 1)
            .unwrap_err()
            .to_string()
            .contains("must be a non-zero multiple of the KV heads"));
    }
}
