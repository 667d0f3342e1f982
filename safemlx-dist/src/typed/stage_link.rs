//! The boundaries between consecutive pipeline stages, seen from one rank.
//!
//! Stage `k` is world rank `k`, so consecutive stages are neighbours of
//! MLX's ring (the only peers its `send`/`recv` reach), and the last stage
//! and the first are neighbours too (the ring closes): the sampled token
//! goes back to the first stage in one hop.
//!
//! Only a [`ShardedArray<Replicated>`] crosses a boundary: an unreduced
//! `Partial` or a shard does not compile as a stage's output. Every
//! message starts with a fixed header of seven `int32` (kind, sequence
//! number, rows, columns, dtype, last-chunk flag, sampled token), which the
//! receiver checks against what it expects before any payload byte moves;
//! a mismatch is an error naming both sides, never a misread stream.
//! Each send and receive is evaluated at once and bounded by
//! `SAFEMLX_DIST_TIMEOUT` like a collective.

use safemlx::{Array, Dtype, Stream};

use super::{Replicated, ShardedArray};
use crate::error::{Error, Result};
use crate::runtime::{self, Group};

const HEADER: i32 = 7;
/// A header's kinds.
const STOP: i32 = 0;
const HIDDEN: i32 = 1;
const TOKEN: i32 = 2;

/// What crossed a boundary.
#[derive(Debug)]
pub enum StageMessage {
    /// The previous stage's residual stream, `[T, D]`, and whether it is
    /// the last chunk of its step.
    Hidden {
        /// The rows, replicated over this stage's tensor-parallel group.
        rows: ShardedArray<Replicated>,
        /// Whether the step (a prompt, a decode token) ends with these rows.
        last_chunk: bool,
    },
    /// The token the last stage sampled (received by the first stage).
    Token(u32),
    /// The generation ended; pass it on and stop.
    Stop,
}

/// This rank's two boundaries: from the previous stage and to the next
/// (the last stage's "next" is the first stage).
/// Not `Clone`: the sequence numbers it counts are the boundary's.
#[derive(Debug)]
pub struct StageLink {
    world: Group,
    tensor: Group,
    sent: std::cell::Cell<i32>,
    received: std::cell::Cell<i32>,
}

impl StageLink {
    /// The boundaries of world rank `world.rank()` as stage of a pipeline
    /// of `world.size()` stages, each stage's arrays over `tensor` (its
    /// tensor-parallel group, [`Group::local`] for one rank per stage).
    ///
    /// # Errors
    /// A `tensor` group of several ranks: stages of several ranks are not
    /// supported yet.
    pub fn new(world: &Group, tensor: &Group) -> Result<Self> {
        if tensor.size() != 1 {
            return Err(Error::Setting(format!(
                "pipeline stages of {} ranks (pp x tp) are not supported yet; give each stage one rank",
                tensor.size()
            )));
        }
        Ok(Self {
            world: world.clone(),
            tensor: tensor.clone(),
            sent: std::cell::Cell::new(0),
            received: std::cell::Cell::new(0),
        })
    }

    /// This rank's stage.
    pub fn stage(&self) -> usize {
        self.world.rank()
    }

    /// The number of stages.
    pub fn stages(&self) -> usize {
        self.world.size()
    }

    fn next(&self) -> usize {
        (self.stage() + 1) % self.stages()
    }

    fn previous(&self) -> usize {
        (self.stage() + self.stages() - 1) % self.stages()
    }

    /// Sends `rows` to the next stage.
    ///
    /// # Errors
    /// The last stage (it sends tokens), rows that are not `[T, D]`, or
    /// the transport's error.
    pub fn send_hidden(
        &self,
        rows: &ShardedArray<Replicated>,
        last_chunk: bool,
        s: &Stream,
    ) -> Result<()> {
        if self.next() == 0 {
            return Err(Error::Shape(
                "the last stage sends tokens, not hidden rows".to_owned(),
            ));
        }
        let (t, d) = match rows.global_shape() {
            [t, d] => (*t, *d),
            shape => {
                return Err(Error::Shape(format!(
                    "a stage sends [T, D] rows; got {shape:?}"
                )))
            }
        };
        let dtype = dtype_code(rows.local().dtype())?;
        self.send_header([HIDDEN, 0, t, d, dtype, i32::from(last_chunk), -1], s)?;
        self.world.enter_point_to_point("stage_send", rows.local());
        let sent = runtime::send(rows.local(), self.next(), &self.world, s)?;
        runtime::eval(&[&sent])
    }

    /// Sends the sampled `token` from the last stage to the first.
    ///
    /// # Errors
    /// A stage other than the last, or the transport's error.
    pub fn send_token(&self, token: u32, s: &Stream) -> Result<()> {
        if self.next() != 0 {
            return Err(Error::Shape("only the last stage sends tokens".to_owned()));
        }
        let token = i32::try_from(token).map_err(|_| overflow(token))?;
        self.send_header([TOKEN, 0, 0, 0, 0, 1, token], s)
    }

    /// Sends the end of the generation to the next stage (none after the
    /// last).
    ///
    /// # Errors
    /// The transport's error.
    pub fn send_stop(&self, s: &Stream) -> Result<()> {
        if self.next() == 0 {
            return Ok(());
        }
        self.send_header([STOP, 0, 0, 0, 0, 1, -1], s)
    }

    /// The next message from the previous stage, whose rows must be
    /// `[T, width]` of `dtype`: checked on the header before the rows move.
    ///
    /// # Errors
    /// A header that is not what this stage can receive there (its
    /// sequence number, kind, width or dtype), naming both sides; or the
    /// transport's error.
    pub fn receive(&self, width: usize, dtype: Dtype, s: &Stream) -> Result<StageMessage> {
        let like = Array::from_slice(&[0i32; HEADER as usize], &[HEADER]);
        let from = self.previous();
        self.world.enter_point_to_point("stage_recv", &like);
        let header = runtime::recv_like(&like, from, &self.world, s)?;
        let header = runtime::read_back::<i32>(&header, "stage header")?;
        let expected = self.received.get();
        self.received.set(expected.wrapping_add(1));
        let [kind, seq, t, d, code, last, token] = header[..] else {
            return Err(self.mismatch(from, "a header of 7 values", &format!("{header:?}")));
        };
        if seq != expected {
            return Err(self.mismatch(
                from,
                &format!("message #{expected}"),
                &format!("message #{seq}"),
            ));
        }
        let from_last = self.stage() == 0;
        match (kind, from_last) {
            (STOP, false) => Ok(StageMessage::Stop),
            (TOKEN, true) => u32::try_from(token)
                .map(StageMessage::Token)
                .map_err(|_| self.mismatch(from, "a token id", &token.to_string())),
            (HIDDEN, false) => {
                let want = (i32::try_from(width).ok(), dtype_code(dtype)?);
                if t < 1 || (Some(d), code) != want {
                    return Err(self.mismatch(
                        from,
                        &format!("[T, {width}] {dtype:?} rows"),
                        &format!("[{t}, {d}] rows of dtype code {code}"),
                    ));
                }
                let received = runtime::recv(&[t, d], dtype, from, &self.world, s)?;
                runtime::eval(&[&received])?;
                Ok(StageMessage::Hidden {
                    rows: ShardedArray::from_local(received, &self.tensor, &[t, d])?,
                    last_chunk: last != 0,
                })
            }
            _ => Err(self.mismatch(
                from,
                if from_last {
                    "a token"
                } else {
                    "hidden rows or the end"
                },
                &format!("a message of kind {kind}"),
            )),
        }
    }

    fn send_header(&self, mut header: [i32; HEADER as usize], s: &Stream) -> Result<()> {
        header[1] = self.sent.get();
        self.sent.set(header[1].wrapping_add(1));
        let header = Array::from_slice(&header, &[HEADER]);
        self.world.enter_point_to_point("stage_send", &header);
        let sent = runtime::send(&header, self.next(), &self.world, s)?;
        runtime::eval(&[&sent])
    }

    fn mismatch(&self, from: usize, expected: &str, got: &str) -> Error {
        Error::Shape(format!(
            "pipeline stage {} expected {expected} from stage {from} but got {got}",
            self.stage()
        ))
    }
}

fn overflow(token: u32) -> Error {
    Error::Shape(format!("token id {token} does not fit a stage header"))
}

/// The dtypes a stage boundary carries.
fn dtype_code(dtype: Dtype) -> Result<i32> {
    match dtype {
        Dtype::Float32 => Ok(1),
        Dtype::Float16 => Ok(2),
        Dtype::Bfloat16 => Ok(3),
        other => Err(Error::Shape(format!(
            "a stage boundary carries float32, float16 or bfloat16 rows, not {other:?}"
        ))),
    }
}
