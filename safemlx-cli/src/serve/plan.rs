//! One step of the server's schedule as rank 0 sends it to every rank.
//!
//! Rank 0 decides; every rank computes. A step frees the cache slots of
//! sequences that ended and runs one batch: for each sequence its slot,
//! the position its tokens start at (0 for a new sequence), and the tokens to feed (one
//! for a decoding sequence, a chunk of the prompt for a prefilling one).
//! The plan travels as one `all_sum` of a fixed-size `int32` buffer (rank
//! 0 writes it, the others add zeros), so every rank knows its size from
//! the command line alone; a follower checks every field before use.

use safemlx::{Array, Stream};
use safemlx_dist::{all_sum, eval, Group};

/// The first value of every plan: a buffer that does not start with it
/// was not written by this program's rank 0.
const MAGIC: i32 = 0x5afe_5e7e;

/// What rank 0 tells every rank to do in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The server stops: every rank leaves its loop.
    pub stop: bool,
    /// Slots whose sequences ended: their caches are dropped.
    pub free: Vec<usize>,
    /// The batch, in order.
    pub work: Vec<Work>,
}

/// One sequence of a step's batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// Its cache slot.
    pub slot: usize,
    /// The position of the first token fed: 0 starts a new, empty cache;
    /// less than the slot's cached positions cuts the cache back to it
    /// (a new sequence reusing a prefix an ended one left).
    pub start: usize,
    /// The tokens fed this step.
    pub tokens: Vec<u32>,
}

/// The bounds of a plan, the same on every rank (from the command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Cache slots: sequences computed together at most.
    pub slots: usize,
    /// Prompt tokens fed in one step (the prefill chunk).
    pub chunk: usize,
}

impl Bounds {
    /// Tokens in one step at most: one prefill chunk and one token for
    /// every other sequence.
    pub fn tokens(&self) -> usize {
        self.chunk + self.slots
    }

    /// The buffer's length: magic, stop, the freed slots with their count,
    /// the batch's count, three fields per sequence, and the tokens.
    fn len(&self) -> usize {
        4 + self.slots + 3 * self.slots + self.tokens()
    }
}

impl Plan {
    /// The plan as the buffer every rank receives.
    ///
    /// # Errors
    /// A plan beyond `bounds` (a bug of the scheduler, named).
    pub fn encode(&self, bounds: Bounds) -> Result<Vec<i32>, String> {
        let tokens: usize = self.work.iter().map(|w| w.tokens.len()).sum();
        if self.free.len() > bounds.slots
            || self.work.len() > bounds.slots
            || tokens > bounds.tokens()
        {
            return Err(format!(
                "the schedule's step ({} freed, {} sequences, {tokens} tokens) exceeds {bounds:?}",
                self.free.len(),
                self.work.len()
            ));
        }
        let int = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit a plan"));
        let mut out = vec![MAGIC, i32::from(self.stop), int(self.free.len())?];
        for &slot in &self.free {
            out.push(int(slot)?);
        }
        out.push(int(self.work.len())?);
        for w in &self.work {
            out.extend([int(w.slot)?, int(w.start)?, int(w.tokens.len())?]);
            for &t in &w.tokens {
                out.push(i32::try_from(t).map_err(|_| format!("token {t} does not fit a plan"))?);
            }
        }
        out.resize(bounds.len(), 0);
        Ok(out)
    }

    /// The plan in `buffer`, every field checked against `bounds`.
    ///
    /// # Errors
    /// A buffer this program's rank 0 did not write, named by its field.
    pub fn decode(buffer: &[i32], bounds: Bounds) -> Result<Self, String> {
        let mut fields = buffer.iter().copied();
        let mut next = |what: &str| {
            fields
                .next()
                .ok_or_else(|| format!("the plan from rank 0 ends before its {what}"))
        };
        let bad = |what: &str, value: i32| format!("the plan from rank 0 has {what} {value}");
        let magic = next("start")?;
        if magic != MAGIC {
            return Err(format!(
                "the plan from rank 0 starts with {magic:#x}, not {MAGIC:#x}: is rank 0 running `safemlx serve` with the same --max-concurrent and --prefill-chunk?"
            ));
        }
        let stop = match next("stop flag")? {
            0 => false,
            1 => true,
            other => return Err(bad("stop flag", other)),
        };
        let count = |value: i32, max: usize, what: &str| {
            usize::try_from(value)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| bad(what, value))
        };
        let slot = |value: i32| count(value, bounds.slots - 1, "slot");
        let freed = next("freed count")?;
        let mut free = Vec::new();
        for _ in 0..count(freed, bounds.slots, "freed count")? {
            free.push(slot(next("freed slot")?)?);
        }
        let sequences = next("batch size")?;
        let mut work: Vec<Work> = Vec::new();
        let mut tokens_left = bounds.tokens();
        for _ in 0..count(sequences, bounds.slots, "batch size")? {
            let at = slot(next("slot")?)?;
            if work.iter().any(|w| w.slot == at) {
                return Err(format!("the plan from rank 0 names slot {at} twice"));
            }
            let start = next("start")?;
            let start = usize::try_from(start).map_err(|_| bad("start", start))?;
            let n = count(next("token count")?, tokens_left, "token count")?;
            if n == 0 {
                return Err(format!("the plan from rank 0 feeds slot {at} no token"));
            }
            tokens_left -= n;
            let tokens = (0..n)
                .map(|_| {
                    let t = next("token")?;
                    u32::try_from(t).map_err(|_| bad("token", t))
                })
                .collect::<Result<_, _>>()?;
            work.push(Work {
                slot: at,
                start,
                tokens,
            });
        }
        Ok(Self { stop, free, work })
    }
}

/// Rank 0's `plan` on every rank: one `all_sum` of the plan's buffer.
///
/// # Errors
/// The collective's error (a peer gone, the timeout) or a buffer that does
/// not decode.
pub fn share(
    plan: Option<&Plan>,
    bounds: Bounds,
    group: &Group,
    s: &Stream,
) -> Result<Plan, String> {
    let len = bounds.len();
    let buffer = match plan {
        Some(plan) => plan.encode(bounds)?,
        None => vec![0; len],
    };
    if group.size() == 1 {
        return Plan::decode(&buffer, bounds);
    }
    let shape = [i32::try_from(len).map_err(|e| e.to_string())?];
    let summed =
        all_sum(&Array::from_slice(&buffer, &shape), group, s).map_err(|e| e.to_string())?;
    eval(&[&summed]).map_err(|e| e.to_string())?;
    let values = summed
        .into_evaluated()
        .map_err(|e| e.to_string())?
        .try_to_vec::<i32>()
        .map_err(|e| format!("cannot read the plan: {e}"))?;
    Plan::decode(&values, bounds)
}

#[cfg(test)]
mod tests {
    use super::{Bounds, Plan, Work, MAGIC};

    const B: Bounds = Bounds { slots: 4, chunk: 8 };

    #[test]
    fn a_plan_round_trips_and_a_bad_buffer_is_named() {
        let plan = Plan {
            stop: false,
            free: vec![2],
            work: vec![
                Work {
                    slot: 0,
                    start: 0,
                    tokens: vec![5, 6, 7],
                },
                Work {
                    slot: 3,
                    start: 40,
                    tokens: vec![9],
                },
            ],
        };
        let buffer = plan.encode(B).unwrap();
        assert_eq!(buffer.len(), 4 + 4 + 12 + 12);
        assert_eq!(Plan::decode(&buffer, B).unwrap(), plan);
        let empty = Plan::default().encode(B).unwrap();
        assert_eq!(Plan::decode(&empty, B).unwrap(), Plan::default());

        let zeros = vec![0; buffer.len()];
        assert!(Plan::decode(&zeros, B)
            .unwrap_err()
            .starts_with("the plan from rank 0 starts with 0x0"));
        let mut slot = buffer.clone();
        slot[5] = 4; // the first sequence's slot
        assert_eq!(
            Plan::decode(&slot, B).unwrap_err(),
            "the plan from rank 0 has slot 4"
        );
        let mut twice = buffer.clone();
        twice[11] = 0; // the second sequence's slot
        assert_eq!(
            Plan::decode(&twice, B).unwrap_err(),
            "the plan from rank 0 names slot 0 twice"
        );
        let mut start = buffer.clone();
        start[6] = -1; // the first sequence's start
        assert_eq!(
            Plan::decode(&start, B).unwrap_err(),
            "the plan from rank 0 has start -1"
        );
        let mut tokens = buffer.clone();
        tokens[7] = 13; // the first sequence's token count
        assert_eq!(
            Plan::decode(&tokens, B).unwrap_err(),
            "the plan from rank 0 has token count 13"
        );
        assert_eq!(
            Plan::decode(&[MAGIC, 0], B).unwrap_err(),
            "the plan from rank 0 ends before its freed count"
        );
        let over = Plan {
            work: vec![Work {
                slot: 0,
                start: 0,
                tokens: vec![1; 13],
            }],
            ..Plan::default()
        };
        assert!(over.encode(B).unwrap_err().contains("exceeds"));
    }
}
