//! The boundaries between consecutive pipeline stages, seen from one rank.
//!
//! On a [`DeviceMesh`] of axes `pp` x `tp`, stage `k` is world ranks
//! `k * tp .. (k + 1) * tp`, consecutive on MLX's ring (the only peers its
//! `send`/`recv` reach). Every message travels one ring hop at a time, from
//! world rank `r - 1` to `r`: a stage's last rank (its exit) sends the
//! stage's output to the next stage's first rank, and every rank but a
//! stage's exit passes what it receives on to the next rank of its stage,
//! so each rank of a stage receives the same messages in the same order.
//! The last stage's exit and world rank 0 are neighbours too (the ring
//! closes): the sampled token goes back to the first stage in one hop (with
//! a shared LM head, the final row and the last stage's half of the
//! logits, the token then riding down in the next header).
//!
//! ```text
//! pp=2, tp=2:   rank 0 -> rank 1 -> rank 2 -> rank 3 -> rank 0
//!               stage 0   stage 0   stage 1   stage 1
//!               passes    exit      passes    exit (the token)
//! ```
//!
//! Only a [`ShardedArray<Replicated>`] crosses a boundary: an unreduced
//! `Partial` or a shard does not compile as a stage's output. Every
//! message starts with a fixed header of seven `int32` (kind, sequence
//! number, rows, columns, dtype, last-chunk flag, sampled token), which the
//! receiver checks against what it expects before any payload byte moves;
//! a mismatch is an error naming both sides, never a misread stream.
//! Each send and receive is evaluated at once and bounded by
//! `SAFEMLX_DIST_TIMEOUT` like a collective.

mod training;

use std::cell::Cell;

use safemlx::{Array, Dtype, Stream};

use super::{Replicated, ShardedArray};
use crate::error::{Error, Result};
use crate::runtime::{self, DeviceMesh, Group};

const HEADER: i32 = 7;
/// A header's kinds.
const STOP: i32 = 0;
const HIDDEN: i32 = 1;
const TOKEN: i32 = 2;
const GRADIENT: i32 = 3;
const LOGITS: i32 = 4;

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
    /// Logits the last stage computed, `[B, V]` (received by the first
    /// stage, whose rank 0 samples them: a server's batch).
    Logits(ShardedArray<Replicated>),
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
    sent: Cell<i32>,
    received: Cell<i32>,
    /// Gradients sent back to the previous stage and received from the next.
    sent_back: Cell<i32>,
    received_back: Cell<i32>,
    /// The token the last header received carried, if any.
    carried: Cell<Option<u32>>,
}

impl StageLink {
    /// The boundaries of this rank on `mesh`, whose axes must be `pp`
    /// (the stages) then `tp` (each stage's tensor-parallel group, the
    /// group its arrays are over).
    ///
    /// # Errors
    /// A mesh of other axes.
    pub fn new(mesh: &DeviceMesh) -> Result<Self> {
        if mesh.names().collect::<Vec<_>>() != ["pp", "tp"] {
            return Err(Error::Setting(format!(
                "pipeline stages need a mesh of axes pp then tp; got {mesh}"
            )));
        }
        Ok(Self {
            world: mesh.world().clone(),
            tensor: mesh.axis("tp")?.clone(),
            sent: Cell::new(0),
            received: Cell::new(0),
            sent_back: Cell::new(0),
            received_back: Cell::new(0),
            carried: Cell::new(None),
        })
    }

    /// This rank's stage.
    pub fn stage(&self) -> usize {
        self.world.rank() / self.tensor.size()
    }

    /// The number of stages.
    pub fn stages(&self) -> usize {
        self.world.size() / self.tensor.size()
    }

    /// Whether this rank sends its stage's output (the stage's last rank
    /// on the ring); the others pass on what they receive.
    fn is_exit(&self) -> bool {
        self.world.rank() % self.tensor.size() + 1 == self.tensor.size()
    }

    fn is_last(&self) -> bool {
        self.stage() + 1 == self.stages()
    }

    fn next(&self) -> usize {
        (self.world.rank() + 1) % self.world.size()
    }

    fn previous(&self) -> usize {
        (self.world.rank() + self.world.size() - 1) % self.world.size()
    }

    /// Sends `rows` to the next stage (from the last stage: its final row
    /// to the first stage, for a shared LM head).
    ///
    /// # Errors
    /// Rows that are not `[T, D]`, or the transport's error.
    pub fn send_hidden(
        &self,
        rows: &ShardedArray<Replicated>,
        last_chunk: bool,
        s: &Stream,
    ) -> Result<()> {
        self.send_hidden_carrying(rows, last_chunk, None, s)
    }

    /// As [`send_hidden`](Self::send_hidden), the header carrying `token`
    /// too (the token these rows embed, on its way to the last stage,
    /// which reads it with [`carried_token`](Self::carried_token)).
    ///
    /// # Errors
    /// As [`send_hidden`](Self::send_hidden), or a token past `i32`.
    pub fn send_hidden_carrying(
        &self,
        rows: &ShardedArray<Replicated>,
        last_chunk: bool,
        token: Option<u32>,
        s: &Stream,
    ) -> Result<()> {
        let token = carry(token)?;
        let (t, d, dtype) = rows_header(rows)?;
        if !self.is_exit() {
            // The next rank of this stage got these rows' input already; the
            // rows are still computed now, since the stage's collectives
            // need this rank (left lazy, its exit would wait for it).
            return runtime::eval(&[rows.local()]);
        }
        self.send_header([HIDDEN, 0, t, d, dtype, i32::from(last_chunk), token], s)?;
        self.send_payload(rows.local(), self.next(), s)
    }

    /// Sends the sampled `token` from the last stage to the first.
    ///
    /// # Errors
    /// A stage other than the last, or the transport's error.
    pub fn send_token(&self, token: u32, s: &Stream) -> Result<()> {
        if !self.is_last() {
            return Err(Error::Shape("only the last stage sends tokens".to_owned()));
        }
        let token = i32::try_from(token).map_err(|_| overflow(token))?;
        if !self.is_exit() {
            return Ok(());
        }
        self.send_header([TOKEN, 0, 0, 0, 0, 1, token], s)
    }

    /// Sends `logits`, `[B, V]` over the vocabulary (gathered: replicated
    /// over this stage's ranks), from the last stage to the first.
    ///
    /// # Errors
    /// A stage other than the last, logits that are not `[B, V]`, or the
    /// transport's error.
    pub fn send_logits(&self, logits: &ShardedArray<Replicated>, s: &Stream) -> Result<()> {
        if !self.is_last() {
            return Err(Error::Shape("only the last stage sends logits".to_owned()));
        }
        let (b, v, dtype) = rows_header(logits)?;
        if !self.is_exit() {
            return runtime::eval(&[logits.local()]);
        }
        self.send_header([LOGITS, 0, b, v, dtype, 1, -1], s)?;
        self.send_payload(logits.local(), self.next(), s)
    }

    /// Sends the end of the generation to the next stage (none after the
    /// last).
    ///
    /// # Errors
    /// The transport's error.
    pub fn send_stop(&self, s: &Stream) -> Result<()> {
        self.send_stop_carrying(None, s)
    }

    /// As [`send_stop`](Self::send_stop), the header carrying the last
    /// `token` the first stage sampled.
    ///
    /// # Errors
    /// The transport's error, or a token past `i32`.
    pub fn send_stop_carrying(&self, token: Option<u32>, s: &Stream) -> Result<()> {
        let token = carry(token)?;
        if self.is_last() || !self.is_exit() {
            return Ok(());
        }
        self.send_header([STOP, 0, 0, 0, 0, 1, token], s)
    }

    /// The token the last message received carried (see
    /// [`send_hidden_carrying`](Self::send_hidden_carrying)), if any.
    pub fn carried_token(&self) -> Option<u32> {
        self.carried.get()
    }

    /// The world group the stages span.
    pub fn world(&self) -> &Group {
        &self.world
    }

    /// This stage's tensor-parallel group: what the rows it receives are
    /// replicated over.
    pub fn tensor(&self) -> &Group {
        &self.tensor
    }

    /// Whether this rank is its stage's first on the ring (its entry).
    fn is_entry(&self) -> bool {
        self.world.rank() % self.tensor.size() == 0
    }

    /// The next message from the previous stage, whose rows must be
    /// `[T, width]` of `dtype` (on the first stage, logits: `width` is the
    /// vocabulary): checked on the header before the rows move.
    ///
    /// # Errors
    /// A header that is not what this stage can receive there (its
    /// sequence number, kind, width or dtype), naming both sides; or the
    /// transport's error.
    pub fn receive(&self, width: usize, dtype: Dtype, s: &Stream) -> Result<StageMessage> {
        let from = self.previous();
        let pass = |a: &Array| self.pass_on(a, s);
        let (header, expected) = self.receive_header(from, &self.received, pass, s)?;
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
        self.carried.set(match kind {
            HIDDEN | STOP => u32::try_from(token).ok(),
            _ => None,
        });
        match (kind, from_last) {
            (STOP, false) => Ok(StageMessage::Stop),
            (TOKEN, true) => u32::try_from(token)
                .map(StageMessage::Token)
                .map_err(|_| self.mismatch(from, "a token id", &token.to_string())),
            (HIDDEN, _) | (LOGITS, true) => {
                let want = (i32::try_from(width).ok(), dtype_code(dtype)?);
                if t < 1 || (Some(d), code) != want {
                    return Err(self.mismatch(
                        from,
                        &format!("[T, {width}] {dtype:?} rows"),
                        &format!("[{t}, {d}] rows of dtype code {code}"),
                    ));
                }
                let received = self.receive_rows([t, d], dtype, from, pass, s)?;
                let rows = ShardedArray::from_local(received, &self.tensor, &[t, d])?;
                Ok(match kind {
                    LOGITS => StageMessage::Logits(rows),
                    _ => StageMessage::Hidden {
                        rows,
                        last_chunk: last != 0,
                    },
                })
            }
            _ => Err(self.mismatch(
                from,
                if from_last {
                    "a token, logits or the last stage's row"
                } else {
                    "hidden rows or the end"
                },
                &format!("a message of kind {kind}"),
            )),
        }
    }

    /// Passes what this rank received on to the next rank of its stage.
    fn pass_on(&self, received: &Array, s: &Stream) -> Result<()> {
        if self.is_exit() {
            return Ok(());
        }
        self.send_payload(received, self.next(), s)
    }

    /// A header from world rank `from`, passed on by `pass` first, and the
    /// sequence number `counter` expected for it (then counted).
    fn receive_header(
        &self,
        from: usize,
        counter: &Cell<i32>,
        pass: impl Fn(&Array) -> Result<()>,
        s: &Stream,
    ) -> Result<(Vec<i32>, i32)> {
        let like = Array::from_slice(&[0i32; HEADER as usize], &[HEADER]);
        self.world.enter_point_to_point("stage_recv", &like);
        let received = runtime::recv_like(&like, from, &self.world, s)?;
        let header = runtime::read_back::<i32>(&received, "stage header")?;
        pass(&received)?;
        let expected = counter.get();
        counter.set(expected.wrapping_add(1));
        Ok((header, expected))
    }

    /// The `[t, d]` rows a checked header announced, from world rank
    /// `from`, passed on by `pass`.
    fn receive_rows(
        &self,
        [t, d]: [i32; 2],
        dtype: Dtype,
        from: usize,
        pass: impl Fn(&Array) -> Result<()>,
        s: &Stream,
    ) -> Result<Array> {
        let like = Array::from_slice(&[0i32; HEADER as usize], &[HEADER]);
        self.world.enter_point_to_point("stage_recv", &like);
        let received = runtime::recv(&[t, d], dtype, from, &self.world, s)?;
        runtime::eval(&[&received])?;
        pass(&received)?;
        Ok(received)
    }

    fn send_header(&self, header: [i32; HEADER as usize], s: &Stream) -> Result<()> {
        self.send_header_to(self.next(), &self.sent, header, s)
    }

    /// Sends `header` to world rank `to`, numbered by `counter`.
    fn send_header_to(
        &self,
        to: usize,
        counter: &Cell<i32>,
        mut header: [i32; HEADER as usize],
        s: &Stream,
    ) -> Result<()> {
        header[1] = counter.get();
        counter.set(header[1].wrapping_add(1));
        let header = Array::from_slice(&header, &[HEADER]);
        self.world.enter_point_to_point("stage_send", &header);
        let sent = runtime::send(&header, to, &self.world, s)?;
        runtime::eval(&[&sent])
    }

    /// Sends `payload` to world rank `to` as one recorded wait.
    fn send_payload(&self, payload: &Array, to: usize, s: &Stream) -> Result<()> {
        self.world.enter_point_to_point("stage_send", payload);
        let sent = runtime::send(payload, to, &self.world, s)?;
        runtime::eval(&[&sent])
    }

    fn mismatch(&self, from: usize, expected: &str, got: &str) -> Error {
        let tp = self.tensor.size();
        let sender = if tp == 1 {
            format!("stage {from}")
        } else {
            format!("rank {from} (stage {})", from / tp)
        };
        Error::Shape(format!(
            "pipeline stage {} expected {expected} from {sender} but got {got}",
            self.stage()
        ))
    }
}

/// Rows, columns and dtype code of `[T, D]` rows for a header.
fn rows_header(rows: &ShardedArray<Replicated>) -> Result<(i32, i32, i32)> {
    match rows.global_shape() {
        [t, d] => Ok((*t, *d, dtype_code(rows.local().dtype())?)),
        shape => Err(Error::Shape(format!(
            "a stage sends [T, D] rows; got {shape:?}"
        ))),
    }
}

/// A header's token slot: the token, or -1 for none.
fn carry(token: Option<u32>) -> Result<i32> {
    token.map_or(Ok(-1), |t| i32::try_from(t).map_err(|_| overflow(t)))
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
