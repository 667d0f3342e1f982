//! Training through the stages: the gradients a pipeline's schedule sends
//! back one stage at a time (MLX's `send`/`recv` carry none), and the tied
//! embedding's exchange between the first and last stage.

use safemlx::{Array, Dtype, Stream};

use super::{dtype_code, rows_header, StageLink, GRADIENT};
use crate::error::{Error, Result};
use crate::runtime;
use crate::typed::{Replicated, ShardedArray};

impl StageLink {
    /// Training: sends the gradient of this stage's input rows back to the
    /// previous stage.
    ///
    /// # Errors
    /// The first stage (no stage before it), rows that are not `[T, D]`,
    /// or the transport's error.
    pub fn send_gradient(&self, rows: &ShardedArray<Replicated>, s: &Stream) -> Result<()> {
        if self.stage() == 0 {
            return Err(Error::Shape(
                "the first stage has no stage before it to send a gradient to".to_owned(),
            ));
        }
        let (t, d, dtype) = rows_header(rows)?;
        if !self.is_entry() {
            // The stage's entry sends it; the others' gradients are the
            // same rows, computed with the stage's collectives.
            return runtime::eval(&[rows.local()]);
        }
        let header = [GRADIENT, 0, t, d, dtype, 1, -1];
        self.send_header_to(self.previous(), &self.sent_back, header, s)?;
        self.send_payload(rows.local(), self.previous(), s)
    }

    /// Training: the gradient of this stage's output rows from the next
    /// stage, `[T, width]` of `dtype`, checked on its header first.
    ///
    /// # Errors
    /// The last stage, a header that is not the
    /// gradient expected (named), or the transport's error.
    pub fn receive_gradient(&self, width: usize, dtype: Dtype, s: &Stream) -> Result<Array> {
        if self.is_last() {
            return Err(Error::Shape(
                "the last stage has no stage after it to receive a gradient from".to_owned(),
            ));
        }
        let from = self.next();
        let pass = |a: &Array| self.pass_back(a, s);
        let (header, expected) = self.receive_header(from, &self.received_back, pass, s)?;
        let want = (i32::try_from(width).ok(), dtype_code(dtype)?);
        match header[..] {
            [GRADIENT, seq, t, d, code, _, _]
                if seq == expected && t >= 1 && (Some(d), code) == want =>
            {
                self.receive_rows([t, d], dtype, from, pass, s)
            }
            _ => Err(self.mismatch(
                from,
                &format!("gradient #{expected} of [T, {width}] {dtype:?} rows"),
                &format!("{header:?}"),
            )),
        }
    }

    /// Training: adds nothing, but exchanges `mine` between the first and
    /// the last stage's ranks of the same tensor-parallel rank (neighbours
    /// over the ring's wrap with one rank per stage), which hold the same
    /// part of the tied embedding: returns the other end's array, of
    /// `mine`'s shape and dtype.
    ///
    /// # Errors
    /// A stage between them, or the transport's
    /// error.
    pub fn exchange_with_other_end(&self, mine: &Array, s: &Stream) -> Result<Array> {
        let first = self.stage() == 0;
        if !first && !self.is_last() {
            return Err(Error::Shape(format!(
                "stage {} is neither end of the pipeline; only the first and last exchange",
                self.stage()
            )));
        }
        // The same tensor-parallel rank at the other end (the ring's wrap
        // with one rank per stage). The first stage sends, then receives;
        // the last receives, then sends (an order that pairs up on MPI too).
        let (pp, tp) = (self.stages(), self.tensor.size());
        let other = [if first { pp - 1 } else { 0 }, self.tensor.rank()];
        let peer = (0..pp * tp)
            .find(|&r| crate::runtime::mesh_coords(r, &[pp, tp]) == other)
            .ok_or_else(|| Error::Shape("no rank at the pipeline's other end".to_owned()))?;
        let receive = || -> Result<Array> {
            self.world.enter_point_to_point("stage_recv", mine);
            let theirs = runtime::recv_like(mine, peer, &self.world, s)?;
            runtime::eval(&[&theirs])?;
            Ok(theirs)
        };
        if first {
            self.send_payload(mine, peer, s)?;
            receive()
        } else {
            let theirs = receive()?;
            self.send_payload(mine, peer, s)?;
            Ok(theirs)
        }
    }

    /// Training: passes a gradient this rank received on to the previous
    /// rank of its stage (none from the stage's entry).
    fn pass_back(&self, received: &Array, s: &Stream) -> Result<()> {
        if self.is_entry() {
            return Ok(());
        }
        self.send_payload(received, self.previous(), s)
    }
}
