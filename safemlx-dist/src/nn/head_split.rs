//! Which query and KV heads a rank holds: the query heads are split by the
//! chunk rule (9 heads over 2 ranks are 5 + 4), and each rank holds every
//! KV head its query heads read, so a KV head whose query heads fall on
//! several ranks is held by each of them (see `gqa.rs`). A rank's query
//! heads may then read their KV heads unequally (5 heads over KV heads of
//! 3 query heads each: 3 read the first, 2 the second): its attention runs
//! in [`segments`](HeadSplit::segments) of equal grouping. When one rank
//! holds a head more than its neighbour and the neighbour holds that
//! head's KV head, the two share it by query rows ([`SharedHead`],
//! [`balance`](HeadSplit::balance)).

use super::shared_head::SharedHead;
use crate::error::{Error, Result};
use crate::typed::{chunk, chunk_lengths};

/// The query and KV heads one rank holds, as `(first, count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSplit {
    /// This rank's query heads.
    pub query: (usize, usize),
    /// The KV heads this rank's query heads read (none without query
    /// heads); a KV head may be held by several ranks.
    pub kv: (usize, usize),
    /// A query head of `query` this rank shares with a neighbour by rows
    /// (see [`balance`](Self::balance)).
    pub shared: Option<SharedHead>,
}

/// A run of a rank's query heads that read its KV heads evenly: `query`
/// and `kv` as `(first, count)` among the rank's own heads, `query.1` a
/// multiple of `kv.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSegment {
    /// The run's query heads, counted from the rank's first.
    pub query: (usize, usize),
    /// The KV heads they read, counted from the rank's first.
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
        Self::check(heads, kv_heads)?;
        let query = chunk(heads, rank, n);
        Ok(Self::reading(query, heads / kv_heads))
    }

    /// Every rank's heads, in rank order (the chunk rule).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn all(heads: usize, kv_heads: usize, n: usize) -> Result<Vec<Self>> {
        Self::of_counts(heads, kv_heads, &chunk_lengths(heads, n))
    }

    /// Every rank's heads when rank `r` takes `counts[r]` query heads in
    /// rank order (a weighted split, `--tensor-split 3:1`), each with the
    /// KV heads they read.
    ///
    /// # Errors
    /// As [`new`](Self::new), or counts that do not add up to the heads.
    pub fn of_counts(heads: usize, kv_heads: usize, counts: &[usize]) -> Result<Vec<Self>> {
        Self::check(heads, kv_heads)?;
        if counts.iter().sum::<usize>() != heads {
            return Err(Error::Shape(format!(
                "query heads split {counts:?} over the ranks: the parts must add up to the {heads} heads"
            )));
        }
        let mut first = 0;
        Ok(counts
            .iter()
            .map(|&count| {
                first += count;
                Self::reading((first - count, count), heads / kv_heads)
            })
            .collect())
    }

    fn check(heads: usize, kv_heads: usize) -> Result<()> {
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::Shape(format!(
                "grouped-query attention with {heads} query heads and {kv_heads} KV heads: the query heads must be a non-zero multiple of the KV heads"
            )));
        }
        Ok(())
    }

    /// The query heads `query` and the KV heads they read, `group` query
    /// heads per KV head.
    fn reading((first, count): (usize, usize), group: usize) -> Self {
        if count == 0 {
            return Self {
                query: (first, 0),
                kv: (first / group, 0),
                shared: None,
            };
        }
        let (kv_first, kv_last) = (first / group, (first + count - 1) / group);
        Self {
            query: (first, count),
            kv: (kv_first, kv_last - kv_first + 1),
            shared: None,
        }
    }

    /// `all` (every rank's heads in rank order, `group` query heads per
    /// KV head) with the one rank that holds the most query heads, when
    /// it holds one more than the next rank and that rank's first head
    /// reads the same KV head as its last (so it holds that KV head
    /// already), sharing its last head with it by rows: the next rank
    /// then holds that head too. SmolLM2 at 2 ranks: 0..5 and 5..9
    /// become 0..5 and 4..9, head 4 shared, each rank attending 4.5
    /// heads' rows. When several ranks hold the most, sharing would not
    /// lower the most any rank attends: nothing changes.
    pub fn balance(mut all: Vec<Self>, group: usize) -> Vec<Self> {
        let most = all.iter().map(|s| s.query.1).max().unwrap_or(0);
        let mut at_most = (0..all.len()).filter(|&r| all[r].query.1 == most);
        let (Some(r), None) = (at_most.next(), at_most.next()) else {
            return all;
        };
        let Some(&b) = all.get(r + 1) else {
            return all;
        };
        let a = all[r];
        let head = a.query.0 + a.query.1;
        if group == 0 || b.query.1 + 1 != most || b.query.0 != head || head % group == 0 {
            return all;
        }
        let head = head - 1;
        all[r].shared = Some(SharedHead {
            head,
            local: a.query.1 - 1,
            kv: head / group - a.kv.0,
            with: r + 1,
            owner: true,
        });
        all[r + 1].query = (head, b.query.1 + 1);
        all[r + 1].shared = Some(SharedHead {
            head,
            local: 0,
            kv: head / group - b.kv.0,
            with: r,
            owner: false,
        });
        all
    }

    /// This rank's heads without the one it shares (the heads it attends
    /// whole), its KV heads as they are.
    pub fn whole(&self) -> Self {
        let (first, count) = self.query;
        let query = match self.shared {
            Some(h) if h.owner => (first, count - 1),
            Some(_) => (first + 1, count - 1),
            None => self.query,
        };
        Self {
            query,
            kv: self.kv,
            shared: None,
        }
    }

    /// How many ranks of `all` hold each query head of `heads`.
    pub fn query_holders(all: &[Self], heads: usize) -> Vec<usize> {
        (0..heads)
            .map(|h| {
                let holds = |s: &&Self| (s.query.0..s.query.0 + s.query.1).contains(&h);
                all.iter().filter(holds).count()
            })
            .collect()
    }

    /// How many of this rank's query heads read each of its KV heads, with
    /// `group` query heads per KV head in the model.
    fn readers(&self, group: usize) -> impl Iterator<Item = usize> + '_ {
        let (first, count) = self.query;
        (self.kv.0..self.kv.0 + self.kv.1).map(move |k| {
            let from = (k * group).max(first);
            let to = ((k + 1) * group).min(first + count);
            to.saturating_sub(from)
        })
    }

    /// This rank's query heads as runs that read its KV heads evenly
    /// (`group` query heads per KV head in the model): one run when every
    /// KV head serves as many of its query heads; at most three (a partial
    /// group, whole groups, a partial group) otherwise.
    pub fn segments(&self, group: usize) -> Vec<HeadSegment> {
        let mut runs: Vec<(usize, HeadSegment)> = Vec::new();
        let (mut q, mut k) = (0, 0);
        for readers in self.readers(group) {
            if readers == 0 {
                // A KV head only a shared head reads (see `whole`).
                k += 1;
                continue;
            }
            match runs.last_mut() {
                Some((per, run)) if *per == readers && run.kv.0 + run.kv.1 == k => {
                    run.query.1 += readers;
                    run.kv.1 += 1;
                }
                _ => runs.push((
                    readers,
                    HeadSegment {
                        query: (q, readers),
                        kv: (k, 1),
                    },
                )),
            }
            (q, k) = (q + readers, k + 1);
        }
        runs.into_iter().map(|(_, run)| run).collect()
    }

    /// How many ranks of `all` hold each KV head of `kv_heads`.
    pub fn kv_holders(all: &[Self], kv_heads: usize) -> Vec<usize> {
        (0..kv_heads)
            .map(|k| {
                let holds = |s: &&Self| (s.kv.0..s.kv.0 + s.kv.1).contains(&k);
                all.iter().filter(holds).count()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{HeadSegment, HeadSplit};

    fn splits(heads: usize, kv: usize, n: usize) -> Vec<((usize, usize), (usize, usize))> {
        HeadSplit::all(heads, kv, n)
            .unwrap()
            .iter()
            .map(|s| (s.query, s.kv))
            .collect()
    }

    #[test]
    fn query_heads_split_evenly_and_hold_the_kv_heads_they_read() {
        // SmolLM2-135M: 9 query heads over 3 KV heads; at 2 ranks 5 + 4,
        // KV head 1 on both.
        assert_eq!(splits(9, 3, 1), [((0, 9), (0, 3))]);
        assert_eq!(splits(9, 3, 2), [((0, 5), (0, 2)), ((5, 4), (1, 2))]);
        assert_eq!(
            splits(9, 3, 3),
            [((0, 3), (0, 1)), ((3, 3), (1, 1)), ((6, 3), (2, 1))]
        );
        assert_eq!(
            splits(9, 3, 4),
            [
                ((0, 3), (0, 1)),
                ((3, 2), (1, 1)),
                ((5, 2), (1, 2)),
                ((7, 2), (2, 1))
            ]
        );
        // More ranks than query heads: rank 2 holds none.
        assert_eq!(
            splits(2, 1, 3),
            [((0, 1), (0, 1)), ((1, 1), (0, 1)), ((2, 0), (1, 0))]
        );
        assert_eq!(
            HeadSplit::kv_holders(&HeadSplit::all(9, 3, 4).unwrap(), 3),
            [1, 2, 2]
        );
        // Weighted 3:1 (7 + 2): KV heads 0..3 and 2..3.
        let weighted = HeadSplit::of_counts(9, 3, &[7, 2]).unwrap();
        assert_eq!(
            weighted.iter().map(|s| (s.query, s.kv)).collect::<Vec<_>>(),
            [((0, 7), (0, 3)), ((7, 2), (2, 1))]
        );
        assert_eq!(
            HeadSplit::of_counts(9, 3, &[7, 1]).unwrap_err().to_string(),
            "query heads split [7, 1] over the ranks: the parts must add up to the 9 heads"
        );
        assert!(HeadSplit::new(9, 2, 0, 1)
            .unwrap_err()
            .to_string()
            .contains("must be a non-zero multiple of the KV heads"));
    }

    #[test]
    fn segments_group_the_query_heads_by_their_readers() {
        let seg = |q: (usize, usize), k: (usize, usize)| HeadSegment { query: q, kv: k };
        let all = HeadSplit::all(9, 3, 2).unwrap();
        // Rank 0: heads 0-2 read KV 0, heads 3-4 read KV 1.
        assert_eq!(
            all[0].segments(3),
            [seg((0, 3), (0, 1)), seg((3, 2), (1, 1))]
        );
        assert_eq!(
            all[1].segments(3),
            [seg((0, 1), (0, 1)), seg((1, 3), (1, 1))]
        );
        // Whole groups: one run.
        assert_eq!(
            HeadSplit::new(32, 8, 1, 4).unwrap().segments(4),
            [seg((0, 8), (0, 2))]
        );
        // A partial group, whole groups, a partial group.
        let middle = HeadSplit {
            query: (1, 8),
            kv: (0, 5),
            shared: None,
        };
        assert_eq!(
            middle.segments(2),
            [
                seg((0, 1), (0, 1)),
                seg((1, 6), (1, 3)),
                seg((7, 1), (4, 1))
            ]
        );
        assert!(HeadSplit::new(2, 1, 2, 3).unwrap().segments(2).is_empty());
    }

    #[test]
    fn a_head_more_than_the_neighbour_is_shared_by_rows() {
        let balanced =
            |heads, kv, n| HeadSplit::balance(HeadSplit::all(heads, kv, n).unwrap(), heads / kv);
        let seg = |q: (usize, usize), k: (usize, usize)| HeadSegment { query: q, kv: k };
        // SmolLM2 at 2 ranks: head 4 (KV head 1, on both) shared.
        let two = balanced(9, 3, 2);
        assert_eq!(
            two.iter().map(|s| (s.query, s.kv)).collect::<Vec<_>>(),
            [((0, 5), (0, 2)), ((4, 5), (1, 2))]
        );
        let (owner, sharer) = (two[0].shared.unwrap(), two[1].shared.unwrap());
        assert_eq!(
            (owner.head, owner.local, owner.kv, owner.with, owner.owner),
            (4, 4, 1, 1, true)
        );
        assert_eq!(
            (
                sharer.head,
                sharer.local,
                sharer.kv,
                sharer.with,
                sharer.owner
            ),
            (4, 0, 0, 0, false)
        );
        assert_eq!(
            HeadSplit::query_holders(&two, 9),
            [1, 1, 1, 1, 2, 1, 1, 1, 1]
        );
        // The heads each attends whole, in runs over its KV heads.
        assert_eq!(
            two[0].whole().segments(3),
            [seg((0, 3), (0, 1)), seg((3, 1), (1, 1))]
        );
        assert_eq!(
            two[1].whole().segments(3),
            [seg((0, 1), (0, 1)), seg((1, 3), (1, 1))]
        );
        // Even splits, a head whose KV head the neighbour lacks (9 over
        // 4: 3 + 2 + 2 + 2, head 2 reads KV head 0, rank 1 holds KV head
        // 1), and two ranks holding the most (32 over 3: 11 + 11 + 10)
        // share nothing.
        assert!(balanced(9, 3, 3).iter().all(|s| s.shared.is_none()));
        assert!(balanced(9, 3, 4).iter().all(|s| s.shared.is_none()));
        assert!(balanced(32, 8, 3).iter().all(|s| s.shared.is_none()));
        // gpt-oss at 3 ranks: 22 + 21 + 21, head 21 (KV head 2) shared by
        // ranks 0 and 1.
        let three = balanced(64, 8, 3);
        assert_eq!(three[1].query, (21, 22));
        assert_eq!(three[0].shared.map(|h| (h.head, h.kv)), Some((21, 2)));
        assert!(three[2].shared.is_none());
        // A KV head only the shared head reads on the owner: no run for it.
        let owner = HeadSplit {
            query: (0, 4),
            kv: (0, 2),
            shared: Some(super::SharedHead {
                head: 3,
                local: 3,
                kv: 1,
                with: 1,
                owner: true,
            }),
        };
        assert_eq!(owner.whole().segments(3), [seg((0, 3), (0, 1))]);
        // No group (an invalid count of KV heads): nothing shared.
        let all = HeadSplit::all(9, 3, 2).unwrap();
        assert_eq!(HeadSplit::balance(all.clone(), 0), all);
    }
}
