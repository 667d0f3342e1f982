//! Rank 0's record of the caches that ended sequences leave in their
//! slots: the tokens each holds, so that a new prompt that starts the same
//! way (the next turn of a conversation, a shared system prompt) reuses
//! the longest such prefix instead of computing it again.

/// The ended sequences' caches, one entry per slot.
#[derive(Debug)]
pub struct Held {
    /// Per slot: the tokens its cache holds and when it was left.
    slots: Vec<Option<(Vec<u32>, u64)>>,
    clock: u64,
}

/// Where a new sequence goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub slot: usize,
    /// Prompt tokens already in the slot's cache (0: a new cache).
    pub reuse: usize,
}

impl Held {
    pub fn new(slots: usize) -> Self {
        Self {
            slots: vec![None; slots],
            clock: 0,
        }
    }

    /// Records that `slot`'s cache holds `tokens` now that its sequence
    /// ended.
    pub fn keep(&mut self, slot: usize, tokens: Vec<u32>) {
        self.clock += 1;
        if let Some(entry) = self.slots.get_mut(slot) {
            *entry = Some((tokens, self.clock));
        }
    }

    /// The most positions a cache of an ended sequence holds, but
    /// `slot`'s.
    pub fn longest_except(&self, slot: usize) -> usize {
        self.slots
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != slot)
            .filter_map(|(_, entry)| entry.as_ref())
            .map(|(t, _)| t.len())
            .max()
            .unwrap_or(0)
    }

    /// Forgets `slot`'s entry: a new sequence took the slot.
    pub fn take(&mut self, slot: usize) {
        if let Some(entry) = self.slots.get_mut(slot) {
            *entry = None;
        }
    }

    /// The slot for a new sequence of `prompt`, none of `taken`: the held
    /// cache sharing the longest prefix with it, else an empty slot, else
    /// the cache left longest ago. At least the prompt's last token is
    /// always computed (its logits give the first token).
    pub fn place(&self, prompt: &[u32], taken: &[usize]) -> Option<Place> {
        let open = |k: &usize| !taken.contains(k);
        let shared = |held: &[u32]| {
            let n = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            n.min(prompt.len().saturating_sub(1))
        };
        let best = (0..self.slots.len())
            .filter(open)
            .filter_map(|k| self.slots[k].as_ref().map(|(t, _)| (k, shared(t))))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(k, n)| (n, std::cmp::Reverse(k)));
        if let Some((slot, reuse)) = best {
            return Some(Place { slot, reuse });
        }
        let empty = (0..self.slots.len()).find(|k| open(k) && self.slots[*k].is_none());
        let slot = empty.or_else(|| self.oldest(taken))?;
        Some(Place { slot, reuse: 0 })
    }

    /// Forgets the cache left longest ago, none of `taken`; its slot (the
    /// caller frees it on every rank), if any.
    pub fn evict(&mut self, taken: &[usize]) -> Option<usize> {
        let slot = self.oldest(taken)?;
        self.slots[slot] = None;
        Some(slot)
    }

    fn oldest(&self, taken: &[usize]) -> Option<usize> {
        (0..self.slots.len())
            .filter(|k| !taken.contains(k))
            .filter_map(|k| self.slots[k].as_ref().map(|(_, at)| (k, *at)))
            .min_by_key(|&(_, at)| at)
            .map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::{Held, Place};

    #[test]
    fn a_prompt_takes_the_longest_shared_prefix_then_an_empty_slot_then_the_oldest() {
        let mut held = Held::new(3);
        held.keep(0, vec![1, 2, 3, 4]);
        held.keep(1, vec![1, 2, 9]);
        assert_eq!(held.longest_except(0), 3);
        // Slot 0 shares 3 tokens; the prompt's last is always computed.
        assert_eq!(
            held.place(&[1, 2, 3, 7], &[]),
            Some(Place { slot: 0, reuse: 3 })
        );
        assert_eq!(
            held.place(&[1, 2, 9], &[0]),
            Some(Place { slot: 1, reuse: 2 })
        );
        assert_eq!(held.place(&[1, 2, 9], &[1]).map(|p| p.slot), Some(0));
        // Nothing shared: an empty slot rather than a held cache.
        held.take(1);
        assert_eq!(held.place(&[8, 8], &[]), Some(Place { slot: 1, reuse: 0 }));
        // No empty slot: the cache left longest ago (slot 0), unless taken.
        held.keep(2, vec![4]);
        held.keep(1, vec![7]);
        assert_eq!(held.place(&[8], &[]), Some(Place { slot: 0, reuse: 0 }));
        assert_eq!(held.place(&[8], &[0, 1, 2]), None);
        assert_eq!(held.evict(&[1]), Some(0));
        assert_eq!(held.evict(&[1]), Some(2));
        assert_eq!(held.evict(&[]), Some(1));
        assert_eq!(held.longest_except(9), 0);
    }
}
